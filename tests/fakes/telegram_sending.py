"""Sending for ``FakeTelegramServer``: messages, files, chat actions and drafts.

- ``sendMessage``: empty text, more than 4096 UTF-16 units, and formatting that
  fails ``check_entities`` give Telegram's 400 answers; the server's
  ``reject_parse_mode`` makes every formatted text fail to parse; a migrated
  group answers with ``migrate_to_chat_id``. Recorded in ``server.sent``.
- ``sendPhoto`` / ``sendDocument``: multipart uploads (PTB's ``InputFile``), a
  photo's bytes must be an image; recorded in ``server.files_sent``.
- ``sendChatAction``: a known action, recorded in ``server.chat_actions``.
- ``sendMessageDraft``: private chats only, non-zero ``draft_id``, the same
  text checks; recorded in ``server.drafts`` with its arrival time.

The records live on the server (tests read them there); this class only
holds the handlers.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from tests.fakes.telegram_entities import check_entities
from tests.fakes.telegram_types import (
    MAX_TEXT_UTF16,
    ApiError,
    DraftFrame,
    RecordedRequest,
    SentFile,
    SentMessage,
    UploadedFile,
    utf16_len,
)

if TYPE_CHECKING:
    from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["TelegramSendMethods"]

_CHAT_ACTIONS = frozenset(
    {
        "typing",
        "upload_photo",
        "record_video",
        "upload_video",
        "record_voice",
        "upload_voice",
        "upload_document",
        "choose_sticker",
        "find_location",
        "record_video_note",
        "upload_video_note",
    }
)


class TelegramSendMethods:
    """The fake's sending methods; what they accept is recorded on the server."""

    def __init__(self, server: FakeTelegramServer) -> None:
        self._server = server

    async def send_message(self, params: dict[str, Any]) -> dict[str, Any]:
        """The ``sendMessage`` method."""
        server = self._server
        chat_id = server._check_target(params)
        text = str(params.get("text", ""))
        if not text.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise ApiError(400, "Bad Request: message is too long")
        server._flood_check(chat_id)
        parse_mode = params.get("parse_mode")
        if parse_mode:
            problem = (
                "Can't find end of the entity starting at byte offset 0"
                if server.reject_parse_mode
                else check_entities(text, str(parse_mode))
            )
            if problem is not None:
                raise ApiError(400, f"Bad Request: can't parse entities: {problem}")
        keyboard = server.buttons.check_markup(params)
        thread = params.get("message_thread_id")
        reply = params.get("reply_parameters")
        key = str(chat_id)
        message_id = server._message_ids.get(key, 1000) + 1
        server._message_ids[key] = message_id
        sent = SentMessage(
            chat_id=chat_id,
            text=text,
            message_id=message_id,
            message_thread_id=int(thread) if thread is not None else None,
            reply_parameters=dict(reply) if isinstance(reply, dict) else None,
            parse_mode=str(parse_mode) if parse_mode else None,
        )
        async with server._cond:
            server.sent.append(sent)
            server._cond.notify_all()
        if server.on_send is not None:
            server.on_send(sent)
        if params.get("_hang"):
            await server._hang()
        result: dict[str, Any] = {
            "message_id": message_id,
            "from": server._bot_user(),
            "chat": server._chat(chat_id),
            "date": int(time.time()),
            "text": text,
        }
        if thread is not None:
            result["message_thread_id"] = int(thread)
            result["is_topic_message"] = True
        server.buttons.record(result, keyboard)
        return result

    async def send_photo(self, params: dict[str, Any]) -> dict[str, Any]:
        """The ``sendPhoto`` method."""
        return await self._send_file("sendPhoto", "photo", params)

    async def send_document(self, params: dict[str, Any]) -> dict[str, Any]:
        """The ``sendDocument`` method."""
        return await self._send_file("sendDocument", "document", params)

    async def _send_file(self, method: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
        server = self._server
        chat_id = server._check_target(params)
        upload = params.get(name)
        if not isinstance(upload, UploadedFile) or not upload.data:
            raise ApiError(400, f"Bad Request: there is no {name} in the request")
        if name == "photo" and not upload.data.startswith((b"\xff\xd8\xff", b"\x89PNG")):
            raise ApiError(400, "Bad Request: IMAGE_PROCESS_FAILED")
        server._flood_check(chat_id)
        thread = params.get("message_thread_id")
        key = str(chat_id)
        message_id = server._message_ids.get(key, 1000) + 1
        server._message_ids[key] = message_id
        sent = SentFile(method, chat_id, message_id, upload, int(thread) if thread else None)
        async with server._cond:
            server.files_sent.append(sent)
            server._cond.notify_all()
        if params.get("_hang"):
            await server._hang()
        media = {
            "file_id": f"sent-{message_id}",
            "file_unique_id": f"u-{message_id}",
            "file_size": len(upload.data),
        }
        result: dict[str, Any] = {
            "message_id": message_id,
            "from": server._bot_user(),
            "chat": server._chat(chat_id),
            "date": int(time.time()),
        }
        if name == "photo":
            result["photo"] = [{**media, "width": 1, "height": 1}]
        else:
            result["document"] = {**media, "file_name": upload.filename}
        return result

    async def send_chat_action(self, params: dict[str, Any]) -> bool:
        """The ``sendChatAction`` method."""
        server = self._server
        server._check_target(params)
        if params.get("action") not in _CHAT_ACTIONS:
            raise ApiError(400, "Bad Request: wrong parameter action in request")
        if params.get("_hang"):
            await server._hang()
        async with server._cond:
            server.chat_actions.append(RecordedRequest("sendChatAction", params))
            server._cond.notify_all()
        return True

    async def send_message_draft(self, params: dict[str, Any]) -> bool:
        """The ``sendMessageDraft`` method."""
        server = self._server
        chat_id = server._check_target(params)
        if not isinstance(chat_id, int) or chat_id <= 0:
            raise ApiError(400, "Bad Request: drafts can be sent only to private chats")
        draft_id = params.get("draft_id")
        if not isinstance(draft_id, int) or draft_id == 0:
            raise ApiError(400, "Bad Request: draft_id must be non-zero")
        text = str(params.get("text") or "")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise ApiError(400, "Bad Request: text is too long")
        parse_mode = params.get("parse_mode")
        if parse_mode and text:
            problem = (
                "Can't find end of the entity starting at byte offset 0"
                if server.reject_parse_mode
                else check_entities(text, str(parse_mode))
            )
            if problem is not None:
                raise ApiError(400, f"Bad Request: can't parse entities: {problem}")
        thread = params.get("message_thread_id")
        frame = DraftFrame(
            chat_id=chat_id,
            draft_id=draft_id,
            text=text,
            at=time.monotonic(),
            parse_mode=str(parse_mode) if parse_mode else None,
            message_thread_id=int(thread) if thread is not None else None,
        )
        async with server._cond:
            server.drafts.append(frame)
            server._cond.notify_all()
        return True
