"""A fake Telegram Bot API server on 127.0.0.1, for tests.

Starlette + uvicorn in the test's own event loop. It speaks the Bot API the
way PTB uses it (``POST /bot<token>/<method>``, ``tests.fakes.telegram_http``)
and mimics the behaviour the adapter relies on. This module is the server:
its state, the test controls and the dispatch; the methods live beside it:

- ``getUpdates`` and the webhook methods: ``tests.fakes.telegram_updates``
  (offset semantics, long polling, 409 for a second poller or a set webhook).
- ``sendMessage``, ``sendPhoto``, ``sendDocument``, ``sendChatAction``,
  ``sendMessageDraft``: ``tests.fakes.telegram_sending`` (Telegram's 400
  answers; formatting checked by ``tests.fakes.telegram_entities``).
- ``getFile`` and file downloads: ``tests.fakes.telegram_files``.
- ``sendVoice``: ``voice`` (``tests.fakes.telegram_voice``); inline keyboards:
  ``buttons`` (``tests.fakes.telegram_buttons``).

Test controls here: ``push_update``; injected faults per method (``inject``):
429 with ``retry_after``, 500, 403 "bot was blocked", or a hang that never
answers until ``release_hangs``; ``migrations`` for migrated groups;
``reject_parse_mode``; ``add_file``. Telegram's flood limits, opt-in
(``enforce_limits``): a message (``sendMessage``, ``sendPhoto``,
``sendDocument``) past 30 in the last second per bot, 1 per chat, or 20 in the
last minute per group gets 429 with ``retry_after``; ``limits`` counts what was
admitted and refused. Chat actions and drafts (limits undocumented) are not
counted.

Every accepted call is recorded (``sent``, ``files_sent``, ``drafts``,
``chat_actions``; every call in ``requests``), and ``wait_for_sent(n)``,
``wait_for_files(n)`` and ``wait_for_request`` wait on a condition until they
are there. The record types and ``Fault`` are in ``tests.fakes.telegram_types``
and re-exported here.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fakes.send_limits import SendWindows, Window
from tests.fakes.serving import LocalServer
from tests.fakes.telegram_buttons import TelegramButtonMethods
from tests.fakes.telegram_entities import check_entities
from tests.fakes.telegram_files import TelegramFileMethods
from tests.fakes.telegram_http import BotApiResponse, error_response, read_params
from tests.fakes.telegram_sending import TelegramSendMethods
from tests.fakes.telegram_types import (
    DEFAULT_TOKEN,
    MAX_TEXT_UTF16,
    ApiError,
    DraftFrame,
    Fault,
    RecordedRequest,
    SentFile,
    SentMessage,
    UploadedFile,
    utf16_len,
)
from tests.fakes.telegram_updates import TelegramUpdateMethods
from tests.fakes.telegram_voice import TelegramVoiceMethods

__all__ = [
    "DEFAULT_TOKEN",
    "MAX_TEXT_UTF16",
    "DraftFrame",
    "FakeTelegramServer",
    "Fault",
    "RecordedRequest",
    "SentFile",
    "SentMessage",
    "UploadedFile",
    "check_entities",
    "utf16_len",
]

# The old private name, still imported by telegram_buttons and telegram_voice.
_ApiError = ApiError


class FakeTelegramServer:
    """In-process fake Bot API; use ``async with FakeTelegramServer() as server``."""

    def __init__(
        self,
        *,
        token: str = DEFAULT_TOKEN,
        bot_id: int = 5000000001,
        bot_username: str = "chatflow_test_bot",
        bot_first_name: str = "Chatflow",
    ) -> None:
        self.token = token
        """The only token the server accepts (others get 401)."""
        self.bot_id = bot_id
        """``getMe`` id."""
        self.bot_username = bot_username
        """``getMe`` username."""
        self.bot_first_name = bot_first_name
        """``getMe`` first name."""
        self.reject_parse_mode = False
        """When true, any text sent with a ``parse_mode`` fails to parse (400)."""
        self.ignore_offsets = False
        """When true, offsets confirm nothing (as if confirmations were lost): a poller
        that restarts without an offset is offered every update again."""
        self.migrations: dict[int, int] = {}
        """Old group id -> new supergroup id; sends to the old id get ``migrate_to_chat_id``."""
        self.webhook_url: str | None = None
        """Set by ``setWebhook``, cleared by ``deleteWebhook``."""
        self.webhook_secret: str | None = None
        """``secret_token`` of the last ``setWebhook``."""
        self.allowed_updates: list[str] | None = None
        """Last ``allowed_updates`` given; None means every message type."""
        self.sent: list[SentMessage] = []
        """Every message accepted, in order."""
        self.chat_actions: list[RecordedRequest] = []
        """Every ``sendChatAction`` accepted."""
        self.drafts: list[DraftFrame] = []
        """Every ``sendMessageDraft`` accepted, in order (private chats only, as Telegram)."""
        self.requests: list[RecordedRequest] = []
        """Every call received, in order, including refused ones."""
        self.get_updates_offsets: list[int | None] = []
        """The ``offset`` of every ``getUpdates`` call, in order."""
        self.on_send: Callable[[SentMessage], None] | None = None
        """Called with each accepted message once it is recorded, before the answer."""
        self.on_request: Callable[[RecordedRequest], None] | None = None
        """Called with every call as it arrives (recorded), before it is handled."""
        self.limits: SendWindows | None = None
        """Telegram's flood limits once ``enforce_limits`` was called, with their counters."""

        self.files: dict[str, bytes] = {}
        """Bytes of the files ``getFile`` knows, by ``file_id`` (see ``add_file``)."""
        self.file_size_known = True
        """False: ``getFile`` leaves ``file_size`` out (it is optional in the Bot API)."""
        self.download_stall_after: int | None = None
        """Bytes of a file download sent before the rest waits for ``release_hangs()``
        (a huge file, or a slow one); ``None``: the whole file at once."""
        self.download_bytes_sent = 0
        """File bytes handed to the server to send, all downloads together."""
        self.downloads: list[str] = []
        """``file_path`` of every file download served, in order."""
        self.files_sent: list[SentFile] = []
        """Every ``sendPhoto``/``sendDocument`` accepted, in order, with its bytes."""
        self._updates: list[dict[str, Any]] = []
        self._next_update_id = 700000001
        self._faults: dict[str, deque[Fault]] = {}
        self._message_ids: dict[str, int] = {}
        self._cond = asyncio.Condition()
        self._hang_release = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._poll_generation = 0
        self._closing = False
        self._local: LocalServer | None = None
        self.port = 0
        """Port bound on 127.0.0.1 (set by ``start``)."""
        self.voice = TelegramVoiceMethods(self)
        """``sendVoice`` (``tests.fakes.telegram_voice``): notes sent, chats that refuse them."""
        self.buttons = TelegramButtonMethods(self)
        """Inline keyboards (``tests.fakes.telegram_buttons``): checked, kept, tapped."""
        self._update_methods = TelegramUpdateMethods(self)
        self._send_methods = TelegramSendMethods(self)
        self._file_methods = TelegramFileMethods(self)
        updates, sends = self._update_methods, self._send_methods
        self._methods: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
            "getMe": self._get_me,
            "deleteWebhook": updates.delete_webhook,
            "setWebhook": updates.set_webhook,
            "getWebhookInfo": updates.get_webhook_info,
            "getUpdates": updates.get_updates,
            "sendMessage": sends.send_message,
            "sendPhoto": sends.send_photo,
            "sendDocument": sends.send_document,
            "sendVoice": self.voice.send_voice,
            "answerCallbackQuery": self.buttons.answer_callback_query,
            "editMessageReplyMarkup": self.buttons.edit_message_reply_markup,
            "sendChatAction": sends.send_chat_action,
            "sendMessageDraft": sends.send_message_draft,
            "getFile": self._file_methods.get_file,
            "close": self._ok_true,
            "logOut": self._ok_true,
        }

    # ------------------------------------------------------------------ lifecycle

    @property
    def base_url(self) -> str:
        """The adapter's ``base_url`` (the token is appended by PTB)."""
        return f"http://127.0.0.1:{self.port}/bot"

    @property
    def api_url(self) -> str:
        """Full URL prefix of this bot's methods, ``<base_url><token>``."""
        return f"{self.base_url}{self.token}"

    async def start(self) -> None:
        """Bind a free port on 127.0.0.1 and start serving."""
        app = Starlette(
            routes=[
                Route("/bot{token}/{method}", self._dispatch, methods=["GET", "POST"]),
                Route("/file/bot{token}/{path:path}", self._file_methods.download, methods=["GET"]),
            ]
        )
        self._local = LocalServer(app)
        self.port = await self._local.start()

    async def stop(self) -> None:
        """Release every waiting call and shut the server down."""
        self._closing = True
        self._hang_release.set()
        self._wake_pollers()
        local, self._local = self._local, None
        if local is not None:
            await local.stop()

    async def __aenter__(self) -> FakeTelegramServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ------------------------------------------------------------------ test controls

    def push_update(self, update: dict[str, Any]) -> int:
        """Queue an update (an ``update_id`` is assigned if missing); returns its id."""
        update = dict(update)
        if "update_id" not in update:
            update["update_id"] = self._next_update_id
        self._next_update_id = max(self._next_update_id, int(update["update_id"])) + 1
        self._updates.append(update)
        self._updates.sort(key=lambda u: int(u["update_id"]))
        self._wake_pollers()
        return int(update["update_id"])

    def _wake_pollers(self) -> None:
        # One event per generation: waiters hold the old one, which is set exactly once.
        self._wakeup.set()
        self._wakeup = asyncio.Event()

    @property
    def pending_update_ids(self) -> list[int]:
        """Ids of updates not yet confirmed by an offset."""
        return [int(u["update_id"]) for u in self._updates]

    def add_file(self, file_id: str, data: bytes) -> None:
        """Make ``getFile`` and the file endpoint serve ``data`` as ``file_id``."""
        self.files[file_id] = data

    def enforce_limits(
        self, *, per_second: int = 30, per_chat_second: int = 1, group_per_minute: int = 20
    ) -> SendWindows:
        """Refuse messages past Telegram's documented limits with 429 from now on."""
        self.limits = SendWindows(
            Window(per_second, 1.0),
            chat=Window(per_chat_second, 1.0),
            group=Window(group_per_minute, 60.0),
        )
        return self.limits

    def _flood_check(self, chat_id: int | str) -> None:
        if self.limits is None:
            return
        group = not isinstance(chat_id, int) or chat_id < 0
        wait = self.limits.check(str(chat_id), group=group)
        if wait is not None:
            seconds = int(wait)
            raise ApiError(
                429, f"Too Many Requests: retry after {seconds}", {"retry_after": seconds}
            )

    def inject(self, method: str, *faults: Fault) -> None:
        """Answer the next calls of ``method`` with these faults, in order."""
        self._faults.setdefault(method, deque()).extend(faults)

    def release_hangs(self) -> None:
        """Let every hanging call answer."""
        self._hang_release.set()

    async def wait_for_files(self, count: int, within: float = 5.0) -> list[SentFile]:
        """Wait until at least ``count`` files were sent; return them all."""
        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: len(self.files_sent) >= count), timeout=within
            )
            return list(self.files_sent)

    async def wait_for_sent(self, count: int, within: float = 5.0) -> list[SentMessage]:
        """Wait until at least ``count`` messages were sent; return them all."""
        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: len(self.sent) >= count), timeout=within
            )
            return list(self.sent)

    async def wait_for_request(
        self,
        method: str,
        count: int = 1,
        within: float = 5.0,
        where: Callable[[RecordedRequest], bool] | None = None,
    ) -> list[RecordedRequest]:
        """Wait until ``count`` calls of ``method`` (matching ``where``) arrived."""

        def matching() -> list[RecordedRequest]:
            return [r for r in self.requests if r.method == method and (where is None or where(r))]

        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: len(matching()) >= count), timeout=within
            )
            return matching()

    # ------------------------------------------------------------------ HTTP

    async def _dispatch(self, request: Request) -> JSONResponse:
        token = request.path_params["token"]
        method = request.path_params["method"]
        params = await read_params(request)
        record = RecordedRequest(method, params)
        async with self._cond:
            self.requests.append(record)
            if method == "getUpdates":
                self.get_updates_offsets.append(params.get("offset"))
            self._cond.notify_all()
        if self.on_request is not None:
            self.on_request(record)
        if not self._token_ok(token):
            return error_response(ApiError(401, "Unauthorized"))
        handler = self._methods.get(method)
        if handler is None:
            return error_response(ApiError(404, "Not Found: method not found"))
        faults = self._faults.get(method)
        fault = faults.popleft() if faults else None
        try:
            if fault is not None and not fault.hang:
                raise ApiError(fault.status, fault.description, fault.parameters)
            if fault is not None and fault.hang:
                params = {**params, "_hang": True}
            result = await handler(params)
        except ApiError as exc:
            return error_response(exc)
        return BotApiResponse({"ok": True, "result": result})

    def _token_ok(self, token: str) -> bool:
        return token == self.token

    async def _hang(self) -> None:
        await self._hang_release.wait()

    # ------------------------------------------------------------------ shared by the methods

    def _bot_user(self) -> dict[str, Any]:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": self.bot_first_name,
            "username": self.bot_username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    def _chat(self, chat_id: int | str) -> dict[str, Any]:
        if isinstance(chat_id, int) and chat_id > 0:
            return {"id": chat_id, "type": "private", "first_name": "User"}
        if isinstance(chat_id, int) and str(chat_id).startswith("-100"):
            return {"id": chat_id, "type": "supergroup", "title": "Supergroup"}
        if isinstance(chat_id, int):
            return {"id": chat_id, "type": "group", "title": "Group"}
        return {"id": -1001111111111, "type": "channel", "title": str(chat_id)}

    def _check_target(self, params: dict[str, Any]) -> int | str:
        chat_id = params.get("chat_id")
        if chat_id is None or chat_id == "":
            raise ApiError(400, "Bad Request: chat_id is empty")
        if isinstance(chat_id, int) and chat_id in self.migrations:
            raise ApiError(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                {"migrate_to_chat_id": self.migrations[chat_id]},
            )
        if not isinstance(chat_id, int | str):
            raise ApiError(400, "Bad Request: chat not found")
        return chat_id

    async def _ok_true(self, params: dict[str, Any]) -> bool:
        return True

    async def _get_me(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("_hang"):
            await self._hang()
        return self._bot_user()
