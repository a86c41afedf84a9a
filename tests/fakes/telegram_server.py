"""A fake Telegram Bot API server on 127.0.0.1, for tests.

Starlette + uvicorn in the test's own event loop. It speaks the Bot API the
way PTB uses it (``POST /bot<token>/<method>``, urlencoded fields with
JSON-encoded values) and mimics the behaviour the adapter relies on:

- ``getUpdates`` with real offset semantics: an update is dropped once a call
  with ``offset`` greater than its id arrives; with nothing pending the call
  waits up to ``timeout`` seconds for a new update (a condition, not a sleep
  loop); a second poller terminates the first with 409; a set webhook makes
  ``getUpdates`` fail with 409.
- ``sendMessage`` validation: empty text, more than 4096 UTF-16 units, and
  formatting that fails a simple parse check give Telegram's 400 answers;
  ``reject_parse_mode`` makes every formatted text fail to parse; a migrated
  group answers with ``migrate_to_chat_id``.
- Injected faults per method (``inject``): 429 with ``retry_after``, 500, 403
  "bot was blocked", or a hang that never answers until ``release_hangs``.
- Telegram's flood limits, opt-in (``enforce_limits``): a message
  (``sendMessage``, ``sendPhoto``, ``sendDocument``) past 30 in the last second
  per bot, 1 per chat, or 20 in the last minute per group gets 429 with
  ``retry_after``; ``limits`` counts what was admitted and refused. Chat actions
  and drafts (limits undocumented) are not counted.

Every sent message is recorded (``sent``), and ``wait_for_sent(n)`` waits on
a condition until ``n`` are there.

``sendMessageDraft`` (private chats only, non-zero ``draft_id``, the same text
checks) is recorded in ``drafts`` with its arrival time; ``inject`` works on it
too (e.g. ``Fault.flood``).

Files out: ``sendPhoto`` and ``sendDocument`` take multipart uploads (PTB's
``InputFile``), check that a photo's bytes are an image, and record each in
``files_sent`` with the bytes received; ``wait_for_files(n)`` waits for them.

Files: ``add_file(file_id, data)`` makes ``getFile`` know it (400 "invalid
file_id" otherwise, 400 "file is too big" past 20 MB, as the Bot API does) and
``GET /file/bot<token>/<file_path>`` serve its bytes; ``downloads`` records them.
``file_size_known = False`` drops the optional ``file_size`` from ``getFile``, and
``download_stall_after`` holds a download after that many bytes (a huge file).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.send_limits import SendWindows, Window
from tests.fakes.serving import LocalServer

__all__ = [
    "DraftFrame",
    "FakeTelegramServer",
    "Fault",
    "RecordedRequest",
    "SentFile",
    "SentMessage",
    "UploadedFile",
]

DEFAULT_TOKEN = "123456789:AAFakeTokenForTestsOnly_abcdefghijk"
MAX_TEXT_UTF16 = 4096

# Values PTB sends as plain strings; everything else is JSON-encoded.
_STRING_FIELDS = frozenset(
    {"text", "parse_mode", "action", "url", "secret_token", "caption", "ip_address"}
)
_HTML_TAGS = frozenset(
    {
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "span",
        "tg-spoiler",
        "a",
        "code",
        "pre",
        "blockquote",
        "tg-emoji",
    }
)
_V2_RESERVED = set("_*[]()~`>#+-=|{}.!")


def utf16_len(text: str) -> int:
    """Telegram's length unit."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


@dataclass(frozen=True)
class DraftFrame:
    """One ``sendMessageDraft`` the fake server accepted."""

    chat_id: int
    """Target private chat."""
    draft_id: int
    """The draft's id (non-zero)."""
    text: str
    """The text shown ("" is Telegram's "Thinking..." placeholder)."""
    at: float
    """``time.monotonic()`` when it arrived."""
    parse_mode: str | None = None
    """Formatting mode, if given."""
    message_thread_id: int | None = None
    """Topic, if given."""


@dataclass(frozen=True)
class SentMessage:
    """One message the fake server accepted."""

    chat_id: int | str
    """Target chat as sent."""
    text: str
    """The text as sent (formatting marks included)."""
    message_id: int
    """Id the server gave the message."""
    message_thread_id: int | None = None
    """Forum topic, if given."""
    reply_parameters: dict[str, Any] | None = None
    """Decoded ``reply_parameters``, if given."""
    parse_mode: str | None = None
    """Formatting mode, if given."""


@dataclass(frozen=True)
class UploadedFile:
    """One file part of a multipart call."""

    filename: str
    """The part's file name."""
    data: bytes = field(repr=False)
    """The bytes received."""
    content_type: str | None = None
    """The part's ``Content-Type``."""


@dataclass(frozen=True)
class SentFile:
    """One ``sendPhoto`` / ``sendDocument`` the fake server accepted."""

    method: str
    """``sendPhoto`` or ``sendDocument``."""
    chat_id: int | str
    """Target chat as sent."""
    message_id: int
    """Id the server gave the message."""
    file: UploadedFile
    """The upload, bytes included."""
    message_thread_id: int | None = None
    """Forum topic, if given."""


@dataclass(frozen=True)
class RecordedRequest:
    """Any Bot API call the server received."""

    method: str
    """Bot API method name, e.g. ``getUpdates``."""
    params: dict[str, Any]
    """Decoded parameters."""


@dataclass(frozen=True)
class Fault:
    """An error answer to inject for the next call of a method."""

    status: int = 500
    """HTTP status and ``error_code``."""
    description: str = "Internal Server Error"
    """Telegram's ``description``."""
    parameters: dict[str, Any] | None = None
    """``ResponseParameters`` (``retry_after``, ``migrate_to_chat_id``)."""
    hang: bool = False
    """Record the call, then answer normally only once ``release_hangs`` is called."""

    @classmethod
    def flood(cls, retry_after: int) -> Fault:
        """429 Too Many Requests with ``parameters.retry_after``."""
        return cls(
            429,
            f"Too Many Requests: retry after {retry_after}",
            {"retry_after": retry_after},
        )

    @classmethod
    def server_error(cls) -> Fault:
        """500 Internal Server Error."""
        return cls(500, "Internal Server Error")

    @classmethod
    def blocked(cls) -> Fault:
        """403: the user blocked the bot."""
        return cls(403, "Forbidden: bot was blocked by the user")

    @classmethod
    def bad_request(cls, description: str) -> Fault:
        """400 with the given description (``Bad Request: ...``)."""
        return cls(400, f"Bad Request: {description}")

    @classmethod
    def hanging(cls) -> Fault:
        """Never answer until ``release_hangs``."""
        return cls(hang=True)


def _byte_offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8"))


def _unclosed(text: str, index: int) -> str:
    return f"Can't find end of the entity starting at byte offset {_byte_offset(text, index)}"


def _check_markdown(text: str, *, v2: bool) -> str | None:
    """A simple (not complete) check of Telegram's Markdown rules; error text or None."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if text.startswith("```", i):
            end = text.find("```", i + 3)
            if end < 0:
                return (
                    f"Can't find end of the entity starting at byte offset {_byte_offset(text, i)}"
                )
            i = end + 3
            continue
        delimiters = "*_`~" if v2 else "*_`"
        if ch in delimiters:
            end = i + 1
            while end < len(text) and text[end] != ch:
                end += 2 if text[end] == "\\" else 1
            if end >= len(text):
                return (
                    f"Can't find end of the entity starting at byte offset {_byte_offset(text, i)}"
                )
            i = end + 1
            continue
        if ch == "[":
            close = text.find("](", i)
            end = text.find(")", close) if close >= 0 else -1
            if close >= 0 and end >= 0:
                i = end + 1
                continue
            if v2:
                return "Character '[' is reserved and must be escaped with the preceding '\\'"
        if v2 and ch in _V2_RESERVED:
            return f"Character '{ch}' is reserved and must be escaped with the preceding '\\'"
        i += 1
    return None


def _check_html(text: str) -> str | None:
    stack: list[str] = []
    for match in re.finditer(r"<(/?)([^\s>/]*)[^>]*>|<|&(?!(?:lt|gt|amp|quot|#\d+);)", text):
        offset = _byte_offset(text, match.start())
        token = match.group(0)
        if token == "<":
            return f"Unsupported start tag at byte offset {offset}"
        if token.startswith("&"):
            return f"Unclosed entity at byte offset {offset}"  # a bare "&"
        closing, name = match.group(1), match.group(2).lower()
        if name not in _HTML_TAGS:
            return f'Unsupported start tag "{name}" at byte offset {offset}'
        if not closing:
            stack.append(name)
        elif not stack or stack.pop() != name:
            return f"Unexpected end tag at byte offset {offset}"
    if stack:
        return f'Can\'t find end tag corresponding to start tag "{stack[-1]}"'
    return None


def check_entities(text: str, parse_mode: str) -> str | None:
    """Why Telegram would refuse ``text`` in ``parse_mode`` (simplified), or None."""
    mode = parse_mode.lower()
    if mode == "markdown":
        return _check_markdown(text, v2=False)
    if mode == "markdownv2":
        return _check_markdown(text, v2=True)
    if mode == "html":
        return _check_html(text)
    return f"Unsupported parse_mode {parse_mode!r}"


class _BotApiResponse(JSONResponse):
    """JSON with non-ASCII escaped: the same JSON, and a lone surrogate can travel ("\\ud800")."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


class _ApiError(Exception):
    def __init__(
        self, status: int, description: str, parameters: dict[str, Any] | None = None
    ) -> None:
        super().__init__(description)
        self.status = status
        self.description = description
        self.parameters = parameters


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
        self.files_sent: list[SentFile] = []
        """Every ``sendPhoto``/``sendDocument`` accepted, in order, with its bytes."""
        """``file_path`` of every file download served, in order."""
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
        self._methods: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
            "getMe": self._get_me,
            "deleteWebhook": self._delete_webhook,
            "setWebhook": self._set_webhook,
            "getWebhookInfo": self._get_webhook_info,
            "getUpdates": self._get_updates,
            "sendMessage": self._send_message,
            "sendPhoto": self._send_photo,
            "sendDocument": self._send_document,
            "sendChatAction": self._send_chat_action,
            "sendMessageDraft": self._send_message_draft,
            "getFile": self._get_file,
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
                Route("/file/bot{token}/{path:path}", self._download, methods=["GET"]),
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

    async def _download(self, request: Request) -> Response:
        if not self._token_ok(request.path_params["token"]):
            return Response(status_code=401)
        path = request.path_params["path"]
        file_id = path.rsplit("/", 1)[-1].split(".", 1)[0]
        data = self.files.get(file_id)
        if data is None:
            return Response(status_code=404)
        async with self._cond:
            self.downloads.append(path)
            self._cond.notify_all()
        if self.download_stall_after is None:
            self.download_bytes_sent += len(data)
            return Response(data, media_type="application/octet-stream")
        return StreamingResponse(
            self._stalling(data, self.download_stall_after),
            media_type="application/octet-stream",
        )

    async def _stalling(self, data: bytes, stall_after: int) -> AsyncIterator[bytes]:
        chunk = 64 * 1024
        for start in range(0, len(data), chunk):
            if start >= stall_after:
                await self._hang_release.wait()
            self.download_bytes_sent += len(data[start : start + chunk])
            yield data[start : start + chunk]

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
            raise _ApiError(
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
        params = await self._read_params(request)
        record = RecordedRequest(method, params)
        async with self._cond:
            self.requests.append(record)
            if method == "getUpdates":
                self.get_updates_offsets.append(params.get("offset"))
            self._cond.notify_all()
        if self.on_request is not None:
            self.on_request(record)
        if not self._token_ok(token):
            return self._error(_ApiError(401, "Unauthorized"))
        handler = self._methods.get(method)
        if handler is None:
            return self._error(_ApiError(404, "Not Found: method not found"))
        faults = self._faults.get(method)
        fault = faults.popleft() if faults else None
        try:
            if fault is not None and not fault.hang:
                raise _ApiError(fault.status, fault.description, fault.parameters)
            if fault is not None and fault.hang:
                params = {**params, "_hang": True}
            result = await handler(params)
        except _ApiError as exc:
            return self._error(exc)
        return _BotApiResponse({"ok": True, "result": result})

    def _token_ok(self, token: str) -> bool:
        return token == self.token

    @staticmethod
    async def _read_params(request: Request) -> dict[str, Any]:
        if request.headers.get("content-type", "").startswith("multipart/form-data"):
            return await _multipart_params(request)
        body = await request.body()
        if request.headers.get("content-type", "").startswith("application/json"):
            data = json.loads(body or b"{}")
            return dict(data) if isinstance(data, dict) else {}
        params: dict[str, Any] = {}
        for key, value in parse_qsl(body.decode("utf-8"), keep_blank_values=True):
            if key in _STRING_FIELDS:
                params[key] = value
                continue
            try:
                params[key] = json.loads(value)
            except ValueError:
                params[key] = value
        return params

    @staticmethod
    def _error(exc: _ApiError) -> JSONResponse:
        body: dict[str, Any] = {
            "ok": False,
            "error_code": exc.status,
            "description": exc.description,
        }
        if exc.parameters:
            body["parameters"] = exc.parameters
        return _BotApiResponse(body, status_code=exc.status)

    async def _hang(self) -> None:
        await self._hang_release.wait()

    # ------------------------------------------------------------------ methods

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

    async def _get_file(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("_hang"):
            await self._hang()
        file_id = str(params.get("file_id", ""))
        data = self.files.get(file_id)
        if data is None:
            raise _ApiError(400, "Bad Request: invalid file_id")
        if len(data) > 20 * 1024 * 1024:
            raise _ApiError(400, "Bad Request: file is too big")
        answer: dict[str, Any] = {
            "file_id": file_id,
            "file_unique_id": f"u-{file_id}",
            "file_size": len(data),
            "file_path": f"files/{file_id}.bin",
        }
        if not self.file_size_known:
            del answer["file_size"]
        return answer

    async def _ok_true(self, params: dict[str, Any]) -> bool:
        return True

    async def _get_me(self, params: dict[str, Any]) -> dict[str, Any]:
        if params.get("_hang"):
            await self._hang()
        return self._bot_user()

    async def _delete_webhook(self, params: dict[str, Any]) -> bool:
        self.webhook_url = None
        self.webhook_secret = None
        if params.get("drop_pending_updates"):
            self._updates.clear()
        return True

    async def _set_webhook(self, params: dict[str, Any]) -> bool:
        url = params.get("url")
        if not url:
            raise _ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided")
        self.webhook_url = str(url)
        self.webhook_secret = params.get("secret_token")
        if "allowed_updates" in params:
            self.allowed_updates = list(params["allowed_updates"]) or None
        return True

    async def _get_webhook_info(self, params: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": self.webhook_url or "",
            "has_custom_certificate": False,
            "pending_update_count": len(self._updates),
        }

    def _update_type(self, update: dict[str, Any]) -> str:
        return next((k for k in update if k != "update_id"), "")

    def _deliverable(self, offset: int | None) -> list[dict[str, Any]]:
        allowed = self.allowed_updates
        return [
            u
            for u in self._updates
            if (offset is None or int(u["update_id"]) >= offset)
            and (allowed is None or self._update_type(u) in allowed)
        ]

    async def _get_updates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        if self.webhook_url:
            raise _ApiError(
                409,
                "Conflict: can't use getUpdates method while webhook is active;"
                " use deleteWebhook to delete the webhook first",
            )
        offset = params.get("offset")
        limit = int(params.get("limit") or 100)
        timeout = float(params.get("timeout") or 0)
        if "allowed_updates" in params:
            self.allowed_updates = list(params["allowed_updates"]) or None
        if offset is not None and int(offset) > 0 and not self.ignore_offsets:
            # Confirmation: everything below the offset is gone for good.
            self._updates = [u for u in self._updates if int(u["update_id"]) >= int(offset)]
        self._poll_generation += 1
        generation = self._poll_generation
        self._wake_pollers()  # an older poll still waiting is terminated (409)
        deadline = time.monotonic() + timeout
        while not (
            self._deliverable(offset) or generation != self._poll_generation or self._closing
        ):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            wakeup = self._wakeup
            try:
                await asyncio.wait_for(wakeup.wait(), timeout=remaining)
            except TimeoutError:
                break
        if generation != self._poll_generation:
            raise _ApiError(
                409,
                "Conflict: terminated by other getUpdates request;"
                " make sure that only one bot instance is running",
            )
        return self._deliverable(offset)[:limit]

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
            raise _ApiError(400, "Bad Request: chat_id is empty")
        if isinstance(chat_id, int) and chat_id in self.migrations:
            raise _ApiError(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                {"migrate_to_chat_id": self.migrations[chat_id]},
            )
        if not isinstance(chat_id, int | str):
            raise _ApiError(400, "Bad Request: chat not found")
        return chat_id

    async def _send_message(self, params: dict[str, Any]) -> dict[str, Any]:
        chat_id = self._check_target(params)
        text = str(params.get("text", ""))
        if not text.strip():
            raise _ApiError(400, "Bad Request: message text is empty")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise _ApiError(400, "Bad Request: message is too long")
        self._flood_check(chat_id)
        parse_mode = params.get("parse_mode")
        if parse_mode:
            problem = (
                "Can't find end of the entity starting at byte offset 0"
                if self.reject_parse_mode
                else check_entities(text, str(parse_mode))
            )
            if problem is not None:
                raise _ApiError(400, f"Bad Request: can't parse entities: {problem}")
        thread = params.get("message_thread_id")
        reply = params.get("reply_parameters")
        key = str(chat_id)
        message_id = self._message_ids.get(key, 1000) + 1
        self._message_ids[key] = message_id
        sent = SentMessage(
            chat_id=chat_id,
            text=text,
            message_id=message_id,
            message_thread_id=int(thread) if thread is not None else None,
            reply_parameters=dict(reply) if isinstance(reply, dict) else None,
            parse_mode=str(parse_mode) if parse_mode else None,
        )
        async with self._cond:
            self.sent.append(sent)
            self._cond.notify_all()
        if self.on_send is not None:
            self.on_send(sent)
        if params.get("_hang"):
            await self._hang()
        result: dict[str, Any] = {
            "message_id": message_id,
            "from": self._bot_user(),
            "chat": self._chat(chat_id),
            "date": int(time.time()),
            "text": text,
        }
        if thread is not None:
            result["message_thread_id"] = int(thread)
            result["is_topic_message"] = True
        return result

    async def _send_photo(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self._send_file("sendPhoto", "photo", params)

    async def _send_document(self, params: dict[str, Any]) -> dict[str, Any]:
        return await self._send_file("sendDocument", "document", params)

    async def _send_file(self, method: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
        chat_id = self._check_target(params)
        upload = params.get(name)
        if not isinstance(upload, UploadedFile) or not upload.data:
            raise _ApiError(400, f"Bad Request: there is no {name} in the request")
        if name == "photo" and not upload.data.startswith((b"\xff\xd8\xff", b"\x89PNG")):
            raise _ApiError(400, "Bad Request: IMAGE_PROCESS_FAILED")
        self._flood_check(chat_id)
        thread = params.get("message_thread_id")
        key = str(chat_id)
        message_id = self._message_ids.get(key, 1000) + 1
        self._message_ids[key] = message_id
        sent = SentFile(method, chat_id, message_id, upload, int(thread) if thread else None)
        async with self._cond:
            self.files_sent.append(sent)
            self._cond.notify_all()
        if params.get("_hang"):
            await self._hang()
        media = {
            "file_id": f"sent-{message_id}",
            "file_unique_id": f"u-{message_id}",
            "file_size": len(upload.data),
        }
        result: dict[str, Any] = {
            "message_id": message_id,
            "from": self._bot_user(),
            "chat": self._chat(chat_id),
            "date": int(time.time()),
        }
        if name == "photo":
            result["photo"] = [{**media, "width": 1, "height": 1}]
        else:
            result["document"] = {**media, "file_name": upload.filename}
        return result

    async def _send_chat_action(self, params: dict[str, Any]) -> bool:
        self._check_target(params)
        if params.get("action") not in {
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
        }:
            raise _ApiError(400, "Bad Request: wrong parameter action in request")
        if params.get("_hang"):
            await self._hang()
        async with self._cond:
            self.chat_actions.append(RecordedRequest("sendChatAction", params))
            self._cond.notify_all()
        return True

    async def _send_message_draft(self, params: dict[str, Any]) -> bool:
        chat_id = self._check_target(params)
        if not isinstance(chat_id, int) or chat_id <= 0:
            raise _ApiError(400, "Bad Request: drafts can be sent only to private chats")
        draft_id = params.get("draft_id")
        if not isinstance(draft_id, int) or draft_id == 0:
            raise _ApiError(400, "Bad Request: draft_id must be non-zero")
        text = str(params.get("text") or "")
        if utf16_len(text) > MAX_TEXT_UTF16:
            raise _ApiError(400, "Bad Request: text is too long")
        parse_mode = params.get("parse_mode")
        if parse_mode and text:
            problem = (
                "Can't find end of the entity starting at byte offset 0"
                if self.reject_parse_mode
                else check_entities(text, str(parse_mode))
            )
            if problem is not None:
                raise _ApiError(400, f"Bad Request: can't parse entities: {problem}")
        thread = params.get("message_thread_id")
        frame = DraftFrame(
            chat_id=chat_id,
            draft_id=draft_id,
            text=text,
            at=time.monotonic(),
            parse_mode=str(parse_mode) if parse_mode else None,
            message_thread_id=int(thread) if thread is not None else None,
        )
        async with self._cond:
            self.drafts.append(frame)
            self._cond.notify_all()
        return True


async def _multipart_params(request: Request) -> dict[str, Any]:
    """The fields of a file upload; file parts become ``UploadedFile`` (``attach://`` too)."""
    params: dict[str, Any] = {}
    uploads: dict[str, UploadedFile] = {}
    async with request.form() as form:
        for key, value in form.multi_items():
            if isinstance(value, str):
                if key in _STRING_FIELDS:
                    params[key] = value
                    continue
                try:
                    params[key] = json.loads(value)
                except ValueError:
                    params[key] = value
            else:
                data = await value.read()
                uploads[key] = UploadedFile(
                    value.filename or "", data, value.headers.get("content-type")
                )
    for key, value in list(params.items()):
        if isinstance(value, str) and value.startswith("attach://"):
            params[key] = uploads.get(value.removeprefix("attach://"))
    return {**uploads, **params}
