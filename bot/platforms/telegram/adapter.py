"""Telegram adapter on python-telegram-bot 22.

Receiving: long polling by our own loop over ``getUpdates`` (default,
``telegram_polling``) or a webhook route on the bot's HTTP server. Either way
an update is confirmed to Telegram only after the gateway's ``on_event``
returned for it: the polling offset moves past an update only then, and the
webhook answers 200 only then. If ``on_event`` raises, nothing is confirmed
and Telegram delivers the update again (the gateway deduplicates by
``MessageEvent.message_id``). Updates become events in ``telegram_mapping``.

Sending: text is split at 4096 UTF-16 code units; each part is tried with
legacy ``Markdown`` and resent as plain text if Telegram cannot parse it.
Errors become ``PlatformError`` by the rules of ``telegram_errors``, and:

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
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from telegram import InlineKeyboardMarkup, Message, ReplyParameters, Update
from telegram.constants import ChatAction
from telegram.error import BadRequest, ChatMigrated

from bot.errors import ConfigurationError, PlatformError
from bot.gateway.contract import (
    EventHandler,
    MediaAttachment,
    MessageEvent,
    PlatformAdapter,
    SendLimits,
    SendPacer,
    SendResult,
)
from bot.platforms.telegram.buttons import TelegramButtons
from bot.platforms.telegram.drafts import TelegramDrafts
from bot.platforms.telegram.errors import (
    log_failure,
    map_telegram_errors,
    partly_sent,
    redact,
    translate_error,
)
from bot.platforms.telegram.mapping import GENERAL_TOPIC_ID, PLATFORM, map_update, migration_notice
from bot.platforms.telegram.media import FileDownloads
from bot.platforms.telegram.pacing import SEND_LIMITS, take_turn
from bot.platforms.telegram.polling import Backoff, TelegramPoller
from bot.platforms.telegram.request import AppType, build_application
from bot.platforms.telegram.send_media import TelegramFiles
from bot.platforms.telegram.send_voice import TelegramVoice
from bot.platforms.telegram.webhook import WEBHOOK_PATH, handle_webhook
from bot.platforms.text import split_text, utf16_len

__all__ = [
    "GENERAL_TOPIC_ID",
    "WEBHOOK_PATH",
    "TelegramAdapter",
    "map_update",
    "translate_error",
]

logger = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.telegram.org/bot"

_SECRET_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")
# Bad formatting is a plain BadRequest: Telegram's description is the only sign of it.
_PARSE_ERROR = "can't parse entities"


def _parse_chat_id(chat_id: str) -> int | str:
    try:
        return int(chat_id)
    except ValueError:
        return chat_id  # "@channelusername"


def _parse_reply_to(reply_to: str) -> int:
    """Accept a bare message id or an event's ``telegram:<chat>:<message>`` id."""
    return int(reply_to.rsplit(":", 1)[-1])


class TelegramAdapter(
    TelegramFiles, TelegramVoice, TelegramButtons, TelegramDrafts, PlatformAdapter
):
    """The Telegram side of the gateway (see the module docstring).

    Mode: long polling unless ``webhook_url`` is set; then ``start`` registers
    the webhook (``webhook_secret`` required) and ``routes()`` gives the
    ``POST /webhooks/telegram`` route to mount.
    """

    name: str = PLATFORM
    """Platform name used in session keys and ledger rows."""
    max_text_len: int = 4096
    """Telegram's limit, in UTF-16 code units."""
    send_limits: SendLimits | None = SEND_LIMITS
    """Telegram's flood limits, which the gateway's pacer applies to every request."""
    pacer: SendPacer | None = None
    """The gateway's pacer for this bot (set before ``start``); ``None``: PTB's own
    rate limiter paces messages instead."""

    def __init__(
        self,
        token: str,
        *,
        base_url: str | None = None,
        file_base_url: str | None = None,
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
        # an explicit setting wins (translate_error reads either type).
        os.environ.setdefault("PTB_TIMEDELTA", "true")
        self._token = token.strip()
        self._base_url = base_url or DEFAULT_BASE_URL
        self._file_base_url = file_base_url or None
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
        self._poller: TelegramPoller | None = None
        self._lifecycle = asyncio.Lock()
        self._connected = False
        self._migrated: dict[str, int] = {}
        self._downloads = FileDownloads(self._timeouts)

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

    async def start(self, on_event: EventHandler) -> None:
        """Connect (``getMe``), then poll or register the webhook; return once running.

        Raises ``ConfigurationError`` for a rejected token and ``PlatformError``
        (retryable) when Telegram stays unreachable for ``start_attempts`` tries.
        """
        async with self._lifecycle:
            if self._app is not None:
                raise RuntimeError("TelegramAdapter is already started")
            app = build_application(
                self._token,
                self._base_url,
                self._timeouts,
                self._file_base_url,
                rate_limited=self.pacer is None,
            )
            try:
                await self._initialize(app)
                bot_user = app.bot.bot
                self._bot_id = bot_user.id
                self._bot_username = bot_user.username or ""
                with map_telegram_errors(self._token):
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
                self._poller = TelegramPoller(
                    app.bot,
                    token=self._token,
                    on_event=on_event,
                    map_update=self._map,
                    on_token_rejected=self._token_rejected,
                    allowed_updates=self._allowed_updates(),
                    poll_timeout=self._poll_timeout,
                    backoff_initial=self._backoff_initial,
                    backoff_max=self._backoff_max,
                    stop_timeout=self._stop_timeout,
                )
                self._poller.start()
            logger.info(
                "Telegram connected as @%s (%s)",
                self._bot_username,
                "webhook" if self._webhook_url else "long polling",
            )

    async def _initialize(self, app: AppType) -> None:
        backoff = Backoff(self._backoff_initial, self._backoff_max)
        for attempt in range(1, self._start_attempts + 1):
            try:
                with map_telegram_errors(self._token):
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
        # callback_query: button taps (inline keyboards under replies).
        updates = ["message", "callback_query"]
        return [*updates, "channel_post"] if self._allow_channels else updates

    def _token_rejected(self) -> None:
        # Polling ended for good: the gateway must see the adapter as down.
        self._connected = False

    async def stop(self) -> None:
        """Stop polling (a running ``on_event`` is allowed to finish) and shut PTB down.

        Idempotent. The webhook, if any, is left registered: Telegram keeps
        updates until the bot comes back.
        """
        async with self._lifecycle:
            app = self._app
            if app is None:
                return
            self._connected = False
            poller, self._poller = self._poller, None
            if poller is not None:
                await poller.stop()
            self._app = None
            self._on_event = None
            await self._shutdown_app(app)
            await self._downloads.aclose()
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
                "Telegram shutdown error: %s", redact(f"{type(exc).__name__}: {exc}", self._token)
            )

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
            log_failure(exc, "Telegram update %s unmappable (%s); skipped", update_id)
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
        running = self._bot_id is not None
        return await handle_webhook(
            request,
            secret=self._webhook_secret,
            on_event=self._on_event if running else None,
            map_update=self._map,
        )

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
        reply_markup: InlineKeyboardMarkup | None = None,
    ) -> SendResult:
        """Send ``text`` in ordered parts of at most 4096 UTF-16 units.

        ``thread_id`` is a forum topic (``"1"``, General, is omitted);
        ``reply_to`` is the message to quote on the first part, as a bare id or
        an event's ``telegram:<chat>:<message>`` id (sent even if it is gone);
        ``reply_markup`` (an inline keyboard) goes on the last part.
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

        def markup(index: int) -> InlineKeyboardMarkup | None:
            return reply_markup if index == len(parts) - 1 else None

        for index, part in enumerate(parts):
            try:
                with map_telegram_errors(self._token):
                    try:
                        sent = await self._send_part(
                            app, target, part, topic, reply if index == 0 else None, markup(index)
                        )
                    except ChatMigrated as exc:
                        new_id = int(exc.new_chat_id)
                        await self._note_migration(str(target), new_id)
                        target = new_id
                        sent = await self._send_part(
                            app, target, part, topic, reply if index == 0 else None, markup(index)
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
                    raise partly_sent(error, len(ids), len(parts), "parts") from error
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
        markup: InlineKeyboardMarkup | None = None,
    ) -> Message:
        bot = app.bot
        if self._parse_mode is not None:
            await take_turn(self.pacer, chat_id)
            try:
                message: Message = await bot.send_message(
                    chat_id,
                    text,
                    parse_mode=self._parse_mode,
                    message_thread_id=thread_id,
                    reply_parameters=reply,
                    reply_markup=markup,
                )
                return message
            except BadRequest as exc:
                if _PARSE_ERROR not in str(exc).lower():
                    raise
                logger.debug("Telegram could not parse the formatting; sending plain text")
        await take_turn(self.pacer, chat_id)
        plain: Message = await bot.send_message(
            chat_id, text, message_thread_id=thread_id, reply_parameters=reply, reply_markup=markup
        )
        return plain

    async def _note_migration(self, old_chat_id: str, new_chat_id: int) -> None:
        """Remember a group -> supergroup move and tell the gateway about it."""
        self._migrated[old_chat_id] = new_chat_id
        logger.info("Telegram group migrated to a supergroup; resending there")
        handler = self._on_event
        if handler is None:
            return
        sender = self._bot_id if self._bot_id is not None else new_chat_id
        event = migration_notice(old_chat_id, new_chat_id, sender_id=str(sender))
        try:
            await handler(event)
        except Exception as exc:
            # The send itself goes on; the service message will carry the news too.
            log_failure(exc, "Telegram migration notice not accepted (%s)")

    async def fetch_media(self, media: MediaAttachment, *, max_bytes: int) -> bytes:
        """Download a user's file (``getFile`` and the file endpoint; see ``telegram_media``)."""
        app = self._require_app()
        return await self._downloads.fetch(app.bot, media, max_bytes=max_bytes, token=self._token)

    async def indicate_typing(self, event: MessageEvent) -> None:
        """Send the typing action to the event's chat (and topic); errors are ignored."""
        app = self._app
        if app is None:
            return
        source = event.source
        chat: int | str = self._migrated.get(source.chat_id, _parse_chat_id(source.chat_id))
        thread = source.thread_id
        topic = int(thread) if thread not in (None, GENERAL_TOPIC_ID) else None
        if not await take_turn(self.pacer, chat, optional=True):
            return  # replies are waiting for the account's budget: they say more
        try:
            with map_telegram_errors(self._token):
                await app.bot.send_chat_action(chat, ChatAction.TYPING, message_thread_id=topic)
        except (PlatformError, ValueError) as exc:
            logger.debug("Telegram typing action failed: %s", exc)
