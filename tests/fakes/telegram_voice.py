"""``sendVoice`` for ``FakeTelegramServer`` (its ``voice`` member).

Takes the multipart upload PTB sends (``voice`` file part, ``caption``,
``reply_parameters``...), refuses what Telegram refuses (no file, a file that
is not OGG: ``OggS`` first, an ``OpusHead`` in it; a caption over 1,024 UTF-16
units), and answers 400 ``VOICE_MESSAGES_FORBIDDEN`` for the chats in
``forbidden`` (people whose privacy settings allow no voice notes). ``hold_next``
keeps calls from arriving (to kill the bot while it sends).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.telegram_server import FakeTelegramServer, UploadedFile

__all__ = ["MAX_CAPTION_UTF16", "SentVoice", "TelegramVoiceMethods"]

MAX_CAPTION_UTF16 = 1024


@dataclass(frozen=True)
class SentVoice:
    """One ``sendVoice`` the fake server accepted."""

    chat_id: int | str
    message_id: int
    file: UploadedFile
    caption: str | None = None
    reply_parameters: dict[str, Any] | None = None
    message_thread_id: int | None = None


class TelegramVoiceMethods:
    """The fake's voice notes: what was sent, and which chats refuse them."""

    def __init__(self, server: FakeTelegramServer) -> None:
        self._server = server
        self.sent: list[SentVoice] = []
        """Every voice note accepted, in order."""
        self.forbidden: set[int | str] = set()
        """Chats answered 400 ``VOICE_MESSAGES_FORBIDDEN``."""
        self.hold_next = 0
        """Hold this many next calls unrecorded (``arrived`` is set) until ``release_hangs``,
        then answer 500: a bot killed meanwhile never delivered them."""
        self.arrived = asyncio.Event()
        """Set when a held call arrives."""

    async def send_voice(self, params: dict[str, Any]) -> dict[str, Any]:
        """The ``sendVoice`` method."""
        # Imported here: telegram_server imports this module to wire it in.
        from tests.fakes.telegram_server import UploadedFile, utf16_len
        from tests.fakes.telegram_server import _ApiError as ApiError

        server = self._server
        chat_id = server._check_target(params)
        upload = params.get("voice")
        if not isinstance(upload, UploadedFile) or not upload.data:
            raise ApiError(400, "Bad Request: there is no voice in the request")
        if not upload.data.startswith(b"OggS") or b"OpusHead" not in upload.data[:512]:
            raise ApiError(400, "Bad Request: wrong file type: OGG/Opus expected")
        caption = params.get("caption")
        if caption is not None and utf16_len(str(caption)) > MAX_CAPTION_UTF16:
            raise ApiError(400, "Bad Request: message caption is too long")
        if chat_id in self.forbidden:
            raise ApiError(400, "Bad Request: VOICE_MESSAGES_FORBIDDEN")
        if self.hold_next > 0:
            self.hold_next -= 1
            self.arrived.set()
            await server._hang()
            raise ApiError(500, "Internal Server Error")
        server._flood_check(chat_id)
        thread = params.get("message_thread_id")
        reply = params.get("reply_parameters")
        key = str(chat_id)
        message_id = server._message_ids.get(key, 1000) + 1
        server._message_ids[key] = message_id
        sent = SentVoice(
            chat_id,
            message_id,
            upload,
            str(caption) if caption is not None else None,
            dict(reply) if isinstance(reply, dict) else None,
            int(thread) if thread is not None else None,
        )
        async with server._cond:
            self.sent.append(sent)
            server._cond.notify_all()
        result: dict[str, Any] = {
            "message_id": message_id,
            "from": server._bot_user(),
            "chat": server._chat(chat_id),
            "date": int(time.time()),
            "voice": {
                "file_id": f"voice-{message_id}",
                "file_unique_id": f"u-{message_id}",
                "duration": 1,
                "mime_type": "audio/ogg",
                "file_size": len(upload.data),
            },
        }
        if caption is not None:
            result["caption"] = str(caption)
        return result

    async def wait_for(self, count: int, within: float = 5.0) -> list[SentVoice]:
        """Wait until at least ``count`` voice notes were sent; return them all."""
        server = self._server
        async with server._cond:
            await asyncio.wait_for(
                server._cond.wait_for(lambda: len(self.sent) >= count), timeout=within
            )
            return list(self.sent)
