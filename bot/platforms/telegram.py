"""Telegram adapter on python-telegram-bot 22.

Receiving: long polling by our own loop over ``getUpdates`` (default) or a
webhook route on the bot's HTTP server. Either way an update is confirmed to
Telegram only after the gateway's ``on_event`` returned for it: the polling
offset moves past an update only then, and the webhook answers 200 only then.
If ``on_event`` raises, nothing is confirmed and Telegram delivers the update
again (the gateway deduplicates by ``MessageEvent.message_id``).

Sending: text is split at 4096 UTF-16 code units; each part is tried with
legacy ``Markdown`` and resent as plain text if Telegram cannot parse it.
Errors become ``PlatformError``:

- ``RetryAfter`` (429): retryable, ``retry_after`` set.
- ``Forbidden`` (blocked, kicked), ``BadRequest``, ``InvalidToken``: permanent.
- Transport failures: retryable. They are ``ambiguous`` (the message may have
  reached Telegram) unless the request provably never left: a connect error,
  a connect timeout or a pool timeout. A read or write timeout, or a dropped
  connection, is ambiguous. A 5xx answer is retryable, not ambiguous.
- A failure after earlier parts of the same text were sent is ``ambiguous``
  (the user saw part of the reply), with ``retryable`` as the failure says.
- ``ChatMigrated``: the part is resent to the new supergroup id, later sends
  to the old id go there directly, and a migration event (``migrate_from_chat_id``
  set, empty text) is handed to ``on_event`` so the gateway keeps the session.

Logging: the token is never logged here (PTB's ``InvalidToken`` message
contains it, so messages are redacted). httpx logs request URLs, which contain
the token, at INFO: the process's logging setup must keep the ``httpx`` logger
at WARNING or above. Nor do ids or texts reach INFO and above: an update is named
by ``log_ref`` of its event id, and exception messages, which can quote them, go
to DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import re
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

import httpx
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from telegram import Message, MessageEntity, ReplyParameters, Update
from telegram.constants import ChatAction
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)
from telegram.ext import AIORateLimiter, Application, ApplicationBuilder, ExtBot
from telegram.request import BaseRequest, HTTPXRequest, RequestData

from bot.errors import ChatflowError, ConfigurationError, PlatformError
from bot.gateway.contract import (
    ChatType,
    EventHandler,
    MessageEvent,
    PlatformAdapter,
    SendResult,
    SessionSource,
)
from bot.logs import log_ref
from bot.platforms.text import split_text, utf16_len

__all__ = [
    "GENERAL_TOPIC_ID",
    "WEBHOOK_PATH",
    "TelegramAdapter",
    "map_update",
    "translate_error",
]

logger = logging.getLogger(__name__)

PLATFORM = "telegram"
WEBHOOK_PATH = "/webhooks/telegram"
"""Path of the webhook route ``routes()`` returns."""
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
GENERAL_TOPIC_ID = "1"
"""Thread id of a forum's General topic: kept on events, omitted on send."""
DEFAULT_BASE_URL = "https://api.telegram.org/bot"

_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")
_PARSE_ERROR = "can't parse entities"
# Media attributes in the order they are checked: an animation also carries a
# document and a venue a location, so the more specific ones come first.
_MEDIA_KINDS = (
    "photo",
    "animation",
    "video",
    "video_note",
    "voice",
    "audio",
    "sticker",
    "document",
    "contact",
    "venue",
    "location",
    "poll",
    "dice",
    "story",
    "paid_media",
    "game",
    "invoice",
)
# PTB raises TimedOut for pool and connect timeouts (never sent) and read and write
# timeouts (may have arrived) alike; the chained httpx exception tells them apart.
_NOT_SENT_CAUSES = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)

AppType = Application[Any, Any, Any, Any, Any, Any]


# --------------------------------------------------------------------------- mapping


def _utf16_slice(text: str, offset: int, length: int) -> str:
    data = text.encode("utf-16-le", "surrogatepass")
    return data[offset * 2 : (offset + length) * 2].decode("utf-16-le", "surrogatepass")


def _remove_spans(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """Remove UTF-16 ``(offset, length)`` spans, closing up the space around each."""
    data = text.encode("utf-16-le", "surrogatepass")
    for offset, length in sorted(spans, reverse=True):
        before = data[: offset * 2].decode("utf-16-le", "surrogatepass")
        after = data[(offset + length) * 2 :].decode("utf-16-le", "surrogatepass")
        if not before.strip():
            # A leading mention is usually followed by "," or ":" ("@bot, hi").
            after = after.lstrip(" \t,:;")
        elif before.endswith((" ", "\t")) and after.startswith((" ", "\t")):
            after = after[1:]
        data = (before + after).encode("utf-16-le", "surrogatepass")
    return data.decode("utf-16-le", "surrogatepass").strip()


def _media_kind(message: Message) -> str | None:
    for kind in _MEDIA_KINDS:
        if getattr(message, kind, None):
            return kind
    return None


def _chat_type(raw_type: str) -> ChatType | None:
    if raw_type == "private":
        return "dm"
    if raw_type in ("group", "supergroup"):
        return "group"
    if raw_type == "channel":
        return "channel"
    return None


def _thread_id(message: Message) -> str | None:
    if message.is_topic_message and message.message_thread_id is not None:
        return str(message.message_thread_id)
    if message.chat.is_forum:
        # A forum message outside any topic is in General (id 1). Without
        # is_topic_message a message_thread_id is only a reply chain.
        return GENERAL_TOPIC_ID
    return None


def _migration_event(
    message: Message, *, new_chat_id: int, old_chat_id: int, raw: dict[str, Any]
) -> MessageEvent:
    sender = message.from_user.id if message.from_user else new_chat_id
    return MessageEvent(
        platform=PLATFORM,
        message_id=f"{PLATFORM}:{message.chat.id}:{message.message_id}",
        source=SessionSource(
            platform=PLATFORM,
            chat_id=str(new_chat_id),
            chat_type="group",
            sender_id=str(sender),
            chat_name=message.chat.title,
        ),
        text="",
        platform_message_id=str(message.message_id),
        timestamp=message.date,
        migrate_from_chat_id=str(old_chat_id),
        raw=raw,
    )


def map_update(
    update: Update | Mapping[str, Any],
    *,
    bot_id: int,
    bot_username: str,
    allow_channels: bool = False,
) -> MessageEvent | None:
    """Turn one Telegram update into a ``MessageEvent``, or ``None`` to ignore it.

    Ignored: edits, callback queries and other update types, channel posts
    (unless ``allow_channels``), messages from bots (the anonymous-admin
    placeholder counts as its group), automatic forwards from a linked
    channel, service messages, and commands addressed to another bot
    (``/cmd@other_bot``). A group's migration to a supergroup gives an event
    with ``migrate_from_chat_id`` set and no text, whichever side reports it.

    Gating facts are set, not applied: ``mentions_bot`` (a ``mention`` entity
    equal to ``@<bot_username>`` in any case, or a ``text_mention`` of the
    bot), ``replies_to_bot`` and ``command`` (``/cmd`` or ``/cmd@<bot>`` at
    the start; a bare ``/cmd`` in a group is set too, the gateway's group
    gate decides). The bot's own @mention is removed from ``text``.
    """
    if isinstance(update, Update):
        raw = update.to_dict()
        parsed = update
    else:
        raw = dict(update)
        parsed = Update.de_json(raw, None)

    message = parsed.message
    if message is None and allow_channels:
        message = parsed.channel_post
    if message is None:
        return None

    chat = message.chat
    chat_type = _chat_type(chat.type)
    if chat_type is None or (chat_type == "channel" and not allow_channels):
        return None

    if message.migrate_from_chat_id is not None:
        return _migration_event(
            message, new_chat_id=chat.id, old_chat_id=message.migrate_from_chat_id, raw=raw
        )
    if message.migrate_to_chat_id is not None:
        return _migration_event(
            message, new_chat_id=message.migrate_to_chat_id, old_chat_id=chat.id, raw=raw
        )

    sender_user = message.from_user
    if message.sender_chat is not None and (sender_user is None or sender_user.is_bot):
        # Anonymous admins and channels write "as" a chat; the user is a placeholder.
        sender_id = str(message.sender_chat.id)
        sender_name = message.sender_chat.title
    elif sender_user is not None:
        if sender_user.is_bot:
            return None
        sender_id = str(sender_user.id)
        sender_name = sender_user.full_name
    else:
        sender_id = str(chat.id)
        sender_name = chat.title
    if message.is_automatic_forward:
        return None

    text = message.text if message.text is not None else (message.caption or "")
    entities = message.entities if message.text is not None else message.caption_entities
    media_kind = _media_kind(message)
    if not text and media_kind is None:
        return None  # service message: members joined, title changed, pinned...

    username = "@" + bot_username.lower()
    mentions_bot = False
    command: str | None = None
    strip_spans: list[tuple[int, int]] = []
    for entity in entities:
        if entity.type == MessageEntity.MENTION:
            if _utf16_slice(text, entity.offset, entity.length).lower() == username:
                mentions_bot = True
                strip_spans.append((entity.offset, entity.length))
        elif entity.type == MessageEntity.TEXT_MENTION:
            if entity.user is not None and entity.user.id == bot_id:
                mentions_bot = True
        elif entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
            token = _utf16_slice(text, entity.offset, entity.length)
            name, at, target = token[1:].partition("@")
            if at and target.lower() != bot_username.lower():
                return None  # /cmd@other_bot: meant for someone else
            command = name.lower()
            if at:
                # "/cmd@thisbot args" reads as "/cmd args"
                suffix_at = utf16_len("/" + name)
                strip_spans.append((suffix_at, entity.length - utf16_len("/" + name)))
    if strip_spans:
        text = _remove_spans(text, strip_spans)

    reply = message.reply_to_message
    if reply is not None and reply.forum_topic_created is not None:
        # In a forum every topic message "replies" to the topic's creation notice.
        reply = None
    replies_to_bot = bool(reply and reply.from_user and reply.from_user.id == bot_id)

    chat_name = chat.full_name if chat_type == "dm" else chat.title
    return MessageEvent(
        platform=PLATFORM,
        message_id=f"{PLATFORM}:{chat.id}:{message.message_id}",
        source=SessionSource(
            platform=PLATFORM,
            chat_id=str(chat.id),
            chat_type=chat_type,
            sender_id=sender_id,
            thread_id=_thread_id(message),
            chat_name=chat_name,
            sender_name=sender_name,
        ),
        text=text,
        platform_message_id=str(message.message_id),
        reply_to_id=str(reply.message_id) if reply is not None else None,
        replies_to_bot=replies_to_bot,
        mentions_bot=mentions_bot,
        command=command,
        media_kind=media_kind,
        timestamp=message.date,
        raw=raw,
    )


# --------------------------------------------------------------------------- errors


def _retry_after_seconds(value: int | float | timedelta) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return float(value)


def _transport_cause(exc: BaseException) -> BaseException | None:
    """The httpx exception behind a PTB error, if a transport failure caused it."""
    seen: set[int] = set()
    current: BaseException | None = exc.__cause__ or exc.__context__
    while current is not None and id(current) not in seen:
        if isinstance(current, httpx.HTTPError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def translate_error(exc: TelegramError, *, token: str = "") -> PlatformError:
    """Map a PTB error to ``PlatformError`` (see the module docstring for the rules)."""
    name = type(exc).__name__
    message = _redact(str(exc), token)
    if isinstance(exc, RetryAfter):
        return PlatformError(
            f"Telegram flood control: {message}",
            platform=PLATFORM,
            retryable=True,
            retry_after=_retry_after_seconds(exc.retry_after),
            code=429,
        )
    if isinstance(exc, Forbidden):
        return PlatformError(f"Telegram refused: {message}", platform=PLATFORM, code=403)
    if isinstance(exc, InvalidToken):
        return PlatformError(
            "Telegram rejected the bot token (TELEGRAM_BOT_TOKEN)", platform=PLATFORM, code=401
        )
    if isinstance(exc, ChatMigrated):
        return PlatformError(
            "Telegram group was migrated to a supergroup", platform=PLATFORM, code="migrated"
        )
    if isinstance(exc, BadRequest):
        return PlatformError(f"Telegram bad request: {message}", platform=PLATFORM, code=400)
    if isinstance(exc, NetworkError):  # TimedOut included
        cause = _transport_cause(exc)
        if cause is not None:
            ambiguous = not isinstance(cause, _NOT_SENT_CAUSES)
        else:
            # No transport cause: an error status (5xx), or a timeout that may have been sent.
            ambiguous = isinstance(exc, TimedOut)
        return PlatformError(
            f"Telegram network error ({name}): {message}",
            platform=PLATFORM,
            retryable=True,
            ambiguous=ambiguous,
            code="timeout" if isinstance(exc, TimedOut) else "network",
        )
    if isinstance(exc, Conflict):
        return PlatformError(f"Telegram conflict: {message}", platform=PLATFORM, code=409)
    return PlatformError(f"Telegram error ({name}): {message}", platform=PLATFORM)


@contextlib.contextmanager
def _telegram_errors(token: str) -> Iterator[None]:
    """Raise any PTB error from the block as its ``PlatformError`` (``translate_error``)."""
    try:
        yield
    except TelegramError as exc:
        raise translate_error(exc, token=token) from exc


def _redact(text: str, token: str) -> str:
    if token:
        text = text.replace(token, "<token>")
    return text


# --------------------------------------------------------------------------- adapter


class _TypingExemptRateLimiter(AIORateLimiter):
    """PTB's limiter, minus chat actions.

    Typing is refreshed every few seconds; counted against the 20 messages per
    minute of a group it would starve the replies it announces.
    """

    async def process_request(
        self,
        callback: Callable[..., Coroutine[Any, Any, bool | dict[str, Any] | list[dict[str, Any]]]],
        args: Any,
        kwargs: dict[str, Any],
        endpoint: str,
        data: dict[str, Any],
        rate_limit_args: int | None,
    ) -> bool | dict[str, Any] | list[dict[str, Any]]:
        if endpoint == "sendChatAction":
            return await callback(*args, **kwargs)
        return await super().process_request(
            callback, args, kwargs, endpoint, data, rate_limit_args
        )


_REFUSED = "Telegram update %s (%s) not accepted by the gateway (%s); Telegram offers it again"


def _log_failure(exc: BaseException, msg: str, *args: object, level: int = logging.ERROR) -> None:
    """Log ``msg % (*args, type of exc)``; the exception (it can quote texts, ids) at DEBUG."""
    refused = isinstance(exc, ChatflowError)  # the gateway is busy or its storage failed
    logger.log(logging.WARNING if refused else level, msg, *args, type(exc).__name__)
    logger.debug("Telegram failure detail", exc_info=exc)


def _read_update(item: Any) -> Update | None:
    """``item`` as an ``Update``, or None (one WARNING line) if PTB cannot read it."""
    try:
        return Update.de_json(item, None)
    except Exception as exc:
        update_id = item.get("update_id") if isinstance(item, dict) else None
        ref = update_id if isinstance(update_id, int) else "?"
        _log_failure(exc, "Telegram update %s unreadable (%s); skipped", ref, level=logging.WARNING)
        return None


def _readable_updates(payload: bytes) -> bytes:
    """A getUpdates answer with every update PTB cannot read cut down to its ``update_id``."""
    try:
        body = json.loads(payload)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return payload  # PTB reports an unreadable answer itself
    if not isinstance(body, dict) or not isinstance(body.get("result"), list):
        return payload
    readable: list[Any] = []
    changed = False
    for item in body["result"]:
        if _read_update(item) is None:
            changed = True
            update_id = item.get("update_id") if isinstance(item, dict) else None
            if isinstance(update_id, int) and not isinstance(update_id, bool):
                readable.append({"update_id": update_id})
            continue
        readable.append(item)
    if not changed:
        return payload
    body["result"] = readable
    return json.dumps(body).encode()


class _ReadableUpdatesRequest(HTTPXRequest):
    """The getUpdates transport: an update PTB cannot read never blocks the ones after it.

    PTB parses a whole getUpdates batch at once: one update it cannot read
    (a malformed payload, a field whose type changed in a newer Bot API) fails
    the batch every time, so polling would stall for good, and PTB logs the
    raw batch, texts and user ids included, at CRITICAL. Here such an update
    is reduced to its ``update_id``: it maps to no event and the offset moves on.
    """

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        # Any: PTB types these with an alias from its private ``_utils`` module.
        read_timeout: Any = BaseRequest.DEFAULT_NONE,
        write_timeout: Any = BaseRequest.DEFAULT_NONE,
        connect_timeout: Any = BaseRequest.DEFAULT_NONE,
        pool_timeout: Any = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        code, payload = await super().do_request(
            url,
            method,
            request_data=request_data,
            read_timeout=read_timeout,
            write_timeout=write_timeout,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
        )
        if code == 200 and url.rsplit("/", 1)[-1].lower() == "getupdates":
            payload = _readable_updates(payload)
        return code, payload


class _Backoff:
    """Exponential backoff delays, capped."""

    def __init__(self, initial: float, maximum: float) -> None:
        self._initial = initial
        self._maximum = maximum
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self._maximum)
        return delay

    def reset(self) -> None:
        self._next = self._initial


def _file_url_for(base_url: str) -> str:
    """``https://host/bot`` -> ``https://host/file/bot`` (Bot API servers' layout)."""
    head, _, tail = base_url.rstrip("/").rpartition("/")
    return f"{head}/file/{tail}"


def _parse_chat_id(chat_id: str) -> int | str:
    try:
        return int(chat_id)
    except ValueError:
        return chat_id  # "@channelusername"


def _parse_reply_to(reply_to: str) -> int:
    """Accept a bare message id or an event's ``telegram:<chat>:<message>`` id."""
    return int(reply_to.rsplit(":", 1)[-1])


class TelegramAdapter(PlatformAdapter):
    """The Telegram side of the gateway (see the module docstring).

    Mode: long polling unless ``webhook_url`` is set; then ``start`` registers
    the webhook (``webhook_secret`` required) and ``routes()`` gives the
    ``POST /webhooks/telegram`` route to mount.
    """

    name: str = PLATFORM
    """Platform name used in session keys and ledger rows."""
    max_text_len: int = 4096
    """Telegram's limit, in UTF-16 code units."""

    def __init__(
        self,
        token: str,
        *,
        base_url: str | None = None,
        webhook_url: str | None = None,
        webhook_secret: str | None = None,
        allow_channels: bool = False,
        poll_timeout: int = 30,
        connect_timeout: float = 5.0,
        read_timeout: float = 10.0,
        write_timeout: float = 10.0,
        pool_timeout: float = 5.0,
        parse_mode: Literal["Markdown", "MarkdownV2", "HTML"] | None = "Markdown",
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        start_attempts: int = 3,
        stop_timeout: float = 30.0,
    ) -> None:
        if not token or not token.strip():
            raise ConfigurationError("TELEGRAM_BOT_TOKEN is empty", setting="TELEGRAM_BOT_TOKEN")
        if webhook_url:
            if not webhook_secret:
                raise ConfigurationError(
                    "TELEGRAM_WEBHOOK_SECRET is required with TELEGRAM_WEBHOOK_URL",
                    setting="TELEGRAM_WEBHOOK_SECRET",
                )
            if not _SECRET_RE.fullmatch(webhook_secret):
                raise ConfigurationError(
                    "TELEGRAM_WEBHOOK_SECRET must be 1-256 characters of A-Z, a-z, 0-9, _ and -",
                    setting="TELEGRAM_WEBHOOK_SECRET",
                )
        if poll_timeout < 0:
            raise ValueError("poll_timeout must not be negative")
        if start_attempts < 1:
            raise ValueError("start_attempts must be at least 1")
        if stop_timeout < 0:
            raise ValueError("stop_timeout must not be negative")
        # PTB 22.8 has no per-bot switch, and its RetryAfter constructor reads retry_after:
        # without the opt-in every 429 warns, and under -W error raises the warning in
        # place of the RetryAfter. Set here, not at import, so importing changes nothing;
        # an explicit setting wins (_retry_after_seconds reads either type).
        os.environ.setdefault("PTB_TIMEDELTA", "true")
        self._token = token.strip()
        self._base_url = base_url or DEFAULT_BASE_URL
        self._webhook_url = webhook_url or None
        self._webhook_secret = webhook_secret or None
        self._allow_channels = allow_channels
        self._poll_timeout = poll_timeout
        self._timeouts = (connect_timeout, read_timeout, write_timeout, pool_timeout)
        self._parse_mode = parse_mode
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._start_attempts = start_attempts
        self._stop_timeout = stop_timeout

        self._app: AppType | None = None
        self._on_event: EventHandler | None = None
        self._bot_id: int | None = None
        self._bot_username: str | None = None
        self._offset: int | None = None
        self._confirmed_offset: int | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._lifecycle = asyncio.Lock()
        self._connected = False
        self._migrated: dict[str, int] = {}

    # ------------------------------------------------------------------ properties

    @property
    def is_connected(self) -> bool:
        """True once ``start`` succeeded and until ``stop`` (or a fatal polling error)."""
        return self._connected

    @property
    def bot_id(self) -> int | None:
        """The bot's user id, known after ``start``."""
        return self._bot_id

    @property
    def bot_username(self) -> str | None:
        """The bot's username without ``@``, known after ``start``."""
        return self._bot_username

    # ------------------------------------------------------------------ lifecycle

    def _build_app(self) -> AppType:
        connect, read, write, pool = self._timeouts
        builder = (
            ApplicationBuilder()
            .token(self._token)
            .base_url(self._base_url)
            .base_file_url(_file_url_for(self._base_url))
            .updater(None)
            .rate_limiter(_TypingExemptRateLimiter(max_retries=0))
            .connect_timeout(connect)
            .read_timeout(read)
            .write_timeout(write)
            .pool_timeout(pool)
            .get_updates_request(
                _ReadableUpdatesRequest(
                    connect_timeout=connect,
                    read_timeout=read,
                    write_timeout=write,
                    pool_timeout=pool,
                )
            )
        )
        app: AppType = builder.build()
        return app

    async def start(self, on_event: EventHandler) -> None:
        """Connect (``getMe``), then poll or register the webhook; return once running.

        Raises ``ConfigurationError`` for a rejected token and ``PlatformError``
        (retryable) when Telegram stays unreachable for ``start_attempts`` tries.
        """
        async with self._lifecycle:
            if self._app is not None:
                raise RuntimeError("TelegramAdapter is already started")
            self._stopping = asyncio.Event()
            app = self._build_app()
            try:
                await self._initialize(app)
                bot_user = app.bot.bot
                self._bot_id = bot_user.id
                self._bot_username = bot_user.username or ""
                with _telegram_errors(self._token):
                    await app.start()
                    self._on_event = on_event
                    if self._webhook_url is not None:
                        await app.bot.set_webhook(
                            self._webhook_url,
                            secret_token=self._webhook_secret,
                            allowed_updates=self._allowed_updates(),
                        )
                    else:
                        # Keep pending updates: they were never confirmed, so they are owed.
                        await app.bot.delete_webhook(drop_pending_updates=False)
            except BaseException:
                await self._shutdown_app(app)
                raise
            self._app = app
            self._connected = True
            if self._webhook_url is None:
                self._offset = None
                self._confirmed_offset = None
                self._poll_task = asyncio.create_task(
                    self._poll_loop(app.bot), name="telegram-polling"
                )
            logger.info(
                "Telegram connected as @%s (%s)",
                self._bot_username,
                "webhook" if self._webhook_url else "long polling",
            )

    async def _initialize(self, app: AppType) -> None:
        backoff = _Backoff(self._backoff_initial, self._backoff_max)
        for attempt in range(1, self._start_attempts + 1):
            try:
                with _telegram_errors(self._token):
                    await app.initialize()
                return
            except PlatformError as exc:
                if exc.code == 401:
                    logger.error("TELEGRAM_BOT_TOKEN was rejected by Telegram; check the setting")
                    raise ConfigurationError(
                        "TELEGRAM_BOT_TOKEN was rejected by Telegram", setting="TELEGRAM_BOT_TOKEN"
                    ) from exc
                if not exc.retryable or attempt == self._start_attempts:
                    raise
                delay = exc.retry_after if exc.retry_after is not None else backoff.next()
                logger.warning(
                    "Telegram getMe failed (%s), attempt %d of %d; retrying in %.1fs",
                    exc.code,
                    attempt,
                    self._start_attempts,
                    delay,
                )
                await asyncio.sleep(delay)

    def _allowed_updates(self) -> list[str]:
        return ["message", "channel_post"] if self._allow_channels else ["message"]

    async def stop(self) -> None:
        """Stop polling (a running ``on_event`` is allowed to finish) and shut PTB down.

        Idempotent. The webhook, if any, is left registered: Telegram keeps
        updates until the bot comes back.
        """
        async with self._lifecycle:
            app = self._app
            if app is None:
                return
            self._stopping.set()
            self._connected = False
            task, self._poll_task = self._poll_task, None
            if task is not None:
                try:
                    # The loop exits at its next check; an on_event in flight
                    # finishes first so its acceptance is not torn.
                    await asyncio.wait_for(asyncio.shield(task), timeout=self._stop_timeout)
                except TimeoutError:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await self._confirm_offset(app.bot)
            self._app = None
            self._on_event = None
            await self._shutdown_app(app)
            logger.info("Telegram adapter stopped")

    async def _shutdown_app(self, app: AppType) -> None:
        try:
            if app.running:
                await app.stop()
            await app.shutdown()
            # A failed initialize leaves the app "not initialized", but the bot's
            # HTTP clients may already hold connections: close them too (idempotent).
            await app.bot.shutdown()
        except Exception as exc:  # shutting down: report, do not mask the caller's error
            logger.warning(
                "Telegram shutdown error: %s", _redact(f"{type(exc).__name__}: {exc}", self._token)
            )

    async def _confirm_offset(self, bot: ExtBot[Any]) -> None:
        """Tell Telegram which updates were handled, so a restart does not refetch them."""
        if self._offset is None or self._offset == self._confirmed_offset:
            return
        try:
            with _telegram_errors(self._token):
                await bot.get_updates(offset=self._offset, limit=1, timeout=0)
            self._confirmed_offset = self._offset
        except PlatformError as exc:
            # Harmless: the updates come again after a restart and are deduplicated.
            logger.debug("Telegram offset confirmation failed: %s", exc.code)

    # ------------------------------------------------------------------ polling

    async def _wait_stop(self, delay: float) -> bool:
        """Sleep ``delay`` seconds unless stopping; True if stopping."""
        try:
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        except TimeoutError:
            return False
        return True

    async def _fetch(self, bot: ExtBot[Any]) -> tuple[Update, ...] | None:
        """One long poll, abandoned as soon as ``stop`` is called (returns None then)."""
        fetch = asyncio.ensure_future(
            bot.get_updates(
                offset=self._offset,
                timeout=self._poll_timeout,
                allowed_updates=self._allowed_updates(),
            )
        )
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({fetch, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            if not fetch.done():
                fetch.cancel()
                with contextlib.suppress(asyncio.CancelledError, TelegramError):
                    await fetch
        if fetch.cancelled():
            return None
        return fetch.result()

    async def _poll_loop(self, bot: ExtBot[Any]) -> None:
        backoff = _Backoff(self._backoff_initial, self._backoff_max)
        while not self._stopping.is_set():
            try:
                with _telegram_errors(self._token):
                    updates = await self._fetch(bot)
            except PlatformError as exc:
                if exc.code == 401:
                    logger.error("TELEGRAM_BOT_TOKEN was rejected by Telegram; polling stopped")
                    self._connected = False
                    return
                if exc.retry_after is not None:
                    delay = exc.retry_after
                    logger.warning("Telegram getUpdates flood control; waiting %.1fs", delay)
                elif exc.code == 409:
                    delay = backoff.next()
                    logger.warning(
                        "Telegram getUpdates conflict: another poller or a webhook uses this"
                        " token; retrying in %.1fs",
                        delay,
                    )
                else:
                    delay = backoff.next()
                    logger.warning("Telegram getUpdates failed (%s); retrying in %.1fs", exc, delay)
                if await self._wait_stop(delay):
                    return
                continue
            except Exception as exc:  # unparseable answer: PTB already logged it at CRITICAL
                delay = backoff.next()
                logger.error("Telegram getUpdates answer unusable (%s)", type(exc).__name__)
                if await self._wait_stop(delay):
                    return
                continue
            if updates is None:
                return
            if self._offset is not None:
                self._confirmed_offset = self._offset
            failure = await self._dispatch(updates)
            if failure is None:
                backoff.reset()
            elif await self._wait_stop(min(failure, self._backoff_max) or backoff.next()):
                return

    async def _dispatch(self, updates: Sequence[Update]) -> float | None:
        """Hand a batch to ``on_event`` in order.

        Returns None when all were handled, else the delay the failure asked
        for (0.0: use the backoff); the offset then stays before the failed
        update, so the next ``getUpdates`` brings it back.
        """
        for update in updates:
            if self._stopping.is_set():
                return None
            event = self._map(update)
            if event is not None:
                handler = self._on_event
                if handler is None:
                    return 0.0
                try:
                    await handler(event)
                except Exception as exc:
                    _log_failure(exc, _REFUSED, update.update_id, log_ref(event.message_id))
                    return (exc.retry_after or 0.0) if isinstance(exc, ChatflowError) else 0.0
            self._offset = update.update_id + 1
        return None

    def _map(self, update: Update | Mapping[str, Any]) -> MessageEvent | None:
        if self._bot_id is None or self._bot_username is None:
            raise RuntimeError("TelegramAdapter is not started")
        try:
            return map_update(
                update,
                bot_id=self._bot_id,
                bot_username=self._bot_username,
                allow_channels=self._allow_channels,
            )
        except Exception as exc:
            # A payload we cannot read will not improve on redelivery: skip it.
            update_id = update.update_id if isinstance(update, Update) else update.get("update_id")
            _log_failure(exc, "Telegram update %s unmappable (%s); skipped", update_id)
            return None

    def format_reply(self, text: str, agent_name: str) -> str:
        """Telegram shows replies as they are: ``text`` unchanged."""
        return text

    # ------------------------------------------------------------------ webhook

    def routes(self) -> Sequence[BaseRoute]:
        """``POST /webhooks/telegram`` in webhook mode; nothing when polling."""
        if self._webhook_url is None:
            return []
        return [Route(WEBHOOK_PATH, self._handle_webhook, methods=["POST"])]

    async def _handle_webhook(self, request: Request) -> Response:
        expected = (self._webhook_secret or "").encode()
        given = request.headers.get(SECRET_HEADER, "").encode()
        if not expected or not hmac.compare_digest(given, expected):
            logger.warning("Telegram webhook call with a missing or wrong secret token refused")
            return PlainTextResponse("Forbidden", status_code=403)
        handler = self._on_event
        if handler is None or self._bot_id is None:
            return PlainTextResponse("Not ready", status_code=503)
        try:
            payload = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError, RecursionError):
            # RecursionError: JSON nested deeper than the parser's stack.
            return PlainTextResponse("Malformed JSON", status_code=400)
        if not isinstance(payload, dict) or not isinstance(payload.get("update_id"), int):
            return PlainTextResponse("Not an update", status_code=400)
        # 200 for an update PTB cannot read, as polling moves past it: a redelivery
        # would fail the same way, for as long as Telegram keeps retrying.
        event = self._map(payload) if _read_update(payload) is not None else None
        if event is None:
            return PlainTextResponse("ok")
        try:
            await handler(event)
        except Exception as exc:
            # Any non-2xx makes Telegram redeliver later; nothing was confirmed.
            _log_failure(exc, _REFUSED, payload["update_id"], log_ref(event.message_id))
            retryable = isinstance(exc, ChatflowError) and exc.retryable
            return PlainTextResponse("Retry later", status_code=503 if retryable else 500)
        return PlainTextResponse("ok")

    # ------------------------------------------------------------------ sending

    def _require_app(self) -> AppType:
        if self._app is None:
            raise PlatformError(
                "Telegram adapter is not started", platform=PLATFORM, retryable=True
            )
        return self._app

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Send ``text`` in ordered parts of at most 4096 UTF-16 units.

        ``thread_id`` is a forum topic (``"1"``, General, is omitted);
        ``reply_to`` is the message to quote on the first part, as a bare id or
        an event's ``telegram:<chat>:<message>`` id (sent even if it is gone).
        Blank text raises a permanent ``PlatformError`` (Telegram rejects it).
        """
        app = self._require_app()
        parts = split_text(text, self.max_text_len, length=utf16_len)
        if not parts:
            raise PlatformError(
                "Telegram cannot send an empty message", platform=PLATFORM, code="empty_text"
            )
        target: int | str = self._migrated.get(chat_id, _parse_chat_id(chat_id))
        try:
            topic = int(thread_id) if thread_id not in (None, GENERAL_TOPIC_ID) else None
            reply = (
                ReplyParameters(
                    message_id=_parse_reply_to(reply_to), allow_sending_without_reply=True
                )
                if reply_to
                else None
            )
        except ValueError as exc:
            raise PlatformError(
                "Telegram thread and reply ids must be numeric", platform=PLATFORM, code="bad_id"
            ) from exc
        ids: list[str] = []
        for index, part in enumerate(parts):
            try:
                with _telegram_errors(self._token):
                    try:
                        sent = await self._send_part(
                            app, target, part, topic, reply if index == 0 else None
                        )
                    except ChatMigrated as exc:
                        new_id = int(exc.new_chat_id)
                        await self._note_migration(str(target), new_id)
                        target = new_id
                        sent = await self._send_part(
                            app, target, part, topic, reply if index == 0 else None
                        )
            except PlatformError as error:
                logger.warning(
                    "Telegram send failed on part %d of %d: %s (retryable=%s, ambiguous=%s)",
                    index + 1,
                    len(parts),
                    error,
                    error.retryable,
                    error.ambiguous or bool(ids),
                )
                if ids:
                    raise PlatformError(
                        f"{error} (after {len(ids)} of {len(parts)} parts were sent)",
                        platform=PLATFORM,
                        retryable=error.retryable,
                        retry_after=error.retry_after,
                        ambiguous=True,
                        code=error.code,
                    ) from error
                raise
            ids.append(str(sent.message_id))
        return SendResult(message_ids=ids)

    async def _send_part(
        self,
        app: AppType,
        chat_id: int | str,
        text: str,
        thread_id: int | None,
        reply: ReplyParameters | None,
    ) -> Message:
        bot = app.bot
        if self._parse_mode is not None:
            try:
                message: Message = await bot.send_message(
                    chat_id,
                    text,
                    parse_mode=self._parse_mode,
                    message_thread_id=thread_id,
                    reply_parameters=reply,
                )
                return message
            except BadRequest as exc:
                if _PARSE_ERROR not in str(exc).lower():
                    raise
                logger.debug("Telegram could not parse the formatting; sending plain text")
        plain: Message = await bot.send_message(
            chat_id, text, message_thread_id=thread_id, reply_parameters=reply
        )
        return plain

    async def _note_migration(self, old_chat_id: str, new_chat_id: int) -> None:
        """Remember a group -> supergroup move and tell the gateway about it."""
        self._migrated[old_chat_id] = new_chat_id
        logger.info("Telegram group migrated to a supergroup; resending there")
        handler = self._on_event
        if handler is None:
            return
        event = MessageEvent(
            platform=PLATFORM,
            message_id=f"{PLATFORM}:{new_chat_id}:migrated-from:{old_chat_id}",
            source=SessionSource(
                platform=PLATFORM,
                chat_id=str(new_chat_id),
                chat_type="group",
                sender_id=str(self._bot_id if self._bot_id is not None else new_chat_id),
            ),
            text="",
            migrate_from_chat_id=old_chat_id,
        )
        try:
            await handler(event)
        except Exception as exc:
            # The send itself goes on; the service message will carry the news too.
            _log_failure(exc, "Telegram migration notice not accepted (%s)")

    async def indicate_typing(self, event: MessageEvent) -> None:
        """Send the typing action to the event's chat (and topic); errors are ignored."""
        app = self._app
        if app is None:
            return
        source = event.source
        chat: int | str = self._migrated.get(source.chat_id, _parse_chat_id(source.chat_id))
        thread = source.thread_id
        topic = int(thread) if thread not in (None, GENERAL_TOPIC_ID) else None
        try:
            with _telegram_errors(self._token):
                await app.bot.send_chat_action(chat, ChatAction.TYPING, message_thread_id=topic)
        except (PlatformError, ValueError) as exc:
            logger.debug("Telegram typing action failed: %s", exc)
