"""WhatsApp Cloud API adapter: signed webhook in, pywa's async client out.

Inbound: ``routes()`` gives the Starlette route ``GET|POST /webhooks/whatsapp``
mounted on the bot's own server. The handler checks size and the
``X-Hub-Signature-256`` HMAC against the raw bytes *before* parsing, hands
every message of the body (pywa itself reads only the first) to the gateway
and answers 200 only after the gateway accepted them all; if the gateway
raises, it answers 500 so Meta redelivers. pywa never registers a webhook nor
runs a server here.

Outbound: ``pywa_async.WhatsApp`` sends, marks as read and shows typing. pywa
hard-codes ``https://graph.facebook.com``; we hand it our own
``httpx.AsyncClient`` (its public ``session=`` parameter) and, after pywa has
stamped that client's ``base_url``, re-point the client we own at
``api_base_url`` keeping pywa's ``/v<version>`` path. This touches no private
pywa attribute, survives pywa reordering its setup, and a test proves the
requests reach a fake Graph API.

Group vs person: see ``is_group_chat_id`` (digits or a ``US.…`` id is a
person, anything else a group); group ids get ``recipient_type: group`` and
replies go to the group, never privately (pywa's ``msg.reply()`` is not used).

Errors: ``whatsapp_errors`` turns a failed send into ``PlatformError``.

The 24-hour window: a reply to a person whose last message (``windows``, kept by
the gateway) is older than 24 h, or that Meta refuses with 131047 (Meta's clock
wins over ours), goes out once as the operator's template (``templates``) in the
same ``send`` call, so through the same ledger row; with no template it fails
for good with ``WINDOW_CLOSED_REASON``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import httpx
from pywa.utils import UserIdentifier, Version
from pywa_async.client import WhatsApp
from pywa_async.errors import WhatsAppError
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route

from bot.errors import ChatflowError, ConfigurationError, PlatformError
from bot.gateway.contract import (
    EventHandler,
    MediaAttachment,
    MessageEvent,
    PlatformAdapter,
    SendLimits,
    SendPacer,
    SendResult,
    StatusFailedHandler,
)
from bot.logs import log_ref
from bot.platforms.text import split_text
from bot.platforms.whatsapp.buttons import WhatsAppButtons
from bot.platforms.whatsapp.errors import RETRYABLE_CODES, api_error, transport_error
from bot.platforms.whatsapp.media import MediaHosts, fetch_media
from bot.platforms.whatsapp.payload import (
    PLATFORM,
    WEBHOOK_OBJECT,
    FailedStatus,
    is_group_chat_id,
    parse_webhook,
)
from bot.platforms.whatsapp.send_media import WhatsAppFiles
from bot.platforms.whatsapp.send_voice import WhatsAppVoice
from bot.platforms.whatsapp.templates import (
    MAX_TEMPLATE_PARTS,
    REENGAGEMENT_CODE,
    WINDOW_CLOSED_REASON,
    WINDOW_SECONDS,
    ReplyTemplate,
    template_parts,
    too_long_reason,
)

__all__ = [
    "DEFAULT_API_VERSION",
    "DEFAULT_MESSAGES_PER_SECOND",
    "MAX_BODY_BYTES",
    "RETRYABLE_CODES",
    "WEBHOOK_PATH",
    "StatusFailedHandler",
    "WhatsAppAdapter",
    "is_group_chat_id",
]

logger = logging.getLogger(__name__)

DEFAULT_MESSAGES_PER_SECOND = 80
"""Meta's default throughput of one business number (messages per second)."""
WEBHOOK_PATH = "/webhooks/whatsapp"
"""Where Meta's webhook calls arrive (configure ``<public url>/webhooks/whatsapp``)."""

DEFAULT_API_VERSION: str = Version.GRAPH_API.value
"""pywa's own default Graph API version (26.0 for pywa 4.5): the request and
response shapes pywa builds are written against it."""

MAX_BODY_BYTES = 3 * 1024 * 1024
"""Largest webhook body read; Meta's bodies are a few KB even when batched."""

_SIGNATURE_HEADER = "x-hub-signature-256"
_SENT_IDS_KEPT = 10_000
_TYPED_IDS_KEPT = 10_000
_TYPING_REFRESH_SECONDS = 20.0  # the indicator lasts 25 s: a longer turn shows it again


class _BoundedSet:
    """Insertion-ordered set that forgets its oldest members beyond ``size``."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def add(self, item: str) -> bool:
        """Add ``item``; False if it was already there."""
        if item in self._items:
            return False
        self._items[item] = None
        while len(self._items) > self._size:
            self._items.popitem(last=False)
        return True

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)


class _WindowClosedByMeta(Exception):
    """Meta refused free-form text for the 24-hour window (131047) before any part left."""


class _BodyTooLarge(Exception):
    pass


class WhatsAppAdapter(WhatsAppFiles, WhatsAppVoice, WhatsAppButtons, PlatformAdapter):
    """WhatsApp Cloud API as a ``PlatformAdapter``.

    ``on_status_failed`` may be set by the gateway to learn about ``failed``
    delivery statuses (``(wamid, error text)``); its errors are logged, never
    turned into a webhook failure.
    """

    name = PLATFORM
    max_text_len = 4096
    service_window_seconds: float | None = WINDOW_SECONDS

    def __init__(
        self,
        phone_id: str,
        token: str,
        *,
        verify_token: str,
        app_secret: str | None,
        api_base_url: str = "https://graph.facebook.com",
        api_version: str = DEFAULT_API_VERSION,
        insecure_dev: bool = False,
        send_pause: float = 1.0,
        messages_per_second: int = DEFAULT_MESSAGES_PER_SECOND,
        timeout: float = 30.0,
        max_body_bytes: int = MAX_BODY_BYTES,
        media_hosts: Iterable[str] = (),
        template_name: str | None = None,
        template_language: str = "en_US",
    ) -> None:
        self.phone_id = str(phone_id)
        # Checked here, so a wrong WHATSAPP_TEMPLATE_LANGUAGE stops start-up, not a reply.
        self.template = ReplyTemplate.configured(template_name, template_language)
        self.api_base_url = api_base_url.rstrip("/")
        # Checked here, so a wrong WHATSAPP_MEDIA_HOSTS stops start-up, not a download.
        self.media_hosts = MediaHosts.build(self.api_base_url, media_hosts)
        self.api_version = api_version
        self.insecure_dev = insecure_dev
        self.send_pause = send_pause
        # The number's throughput (Meta: 80 per second, more on higher tiers); the
        # gateway's pacer holds every message and typing call to it.
        self.send_limits: SendLimits | None = SendLimits(per_second=messages_per_second)
        self.pacer: SendPacer | None = None
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self.on_status_failed: StatusFailedHandler | None = None
        self._token = token
        self._verify_token = verify_token
        self._app_secret = app_secret
        self._on_event: EventHandler | None = None
        self._http: httpx.AsyncClient | None = None
        self._wa: WhatsApp | None = None
        # wamids we sent: an inbound reply quoting one is a reply to the bot.
        self._sent_ids = _BoundedSet(_SENT_IDS_KEPT)
        self._typed_ids = _BoundedSet(_TYPED_IDS_KEPT)
        self._clock = time.monotonic  # a test seam for the typing refresh

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        """True once ``start`` succeeded and until ``stop``."""
        return self._wa is not None and self._on_event is not None

    @property
    def client(self) -> WhatsApp:
        """The pywa client (only between ``start`` and ``stop``)."""
        if self._wa is None:
            raise RuntimeError("WhatsAppAdapter is not started")
        return self._wa

    async def start(self, on_event: EventHandler) -> None:
        """Check the settings, create the Graph API client and accept webhooks."""
        for setting, value in (
            ("WHATSAPP_PHONE_ID", self.phone_id),
            ("WHATSAPP_TOKEN", self._token),
            ("WHATSAPP_VERIFY_TOKEN", self._verify_token),
        ):
            if not value or not value.strip():
                raise ConfigurationError(f"{setting} is not set", setting=setting)
        if not self._app_secret:
            if not self.insecure_dev:
                raise ConfigurationError(
                    "WHATSAPP_APP_SECRET is not set: the WhatsApp webhook cannot check "
                    "signatures (set WHATSAPP_INSECURE_DEV=1 only for local development)",
                    setting="WHATSAPP_APP_SECRET",
                )
            logger.warning(
                "!!! WHATSAPP_INSECURE_DEV is on and WHATSAPP_APP_SECRET is unset: webhook "
                "signatures are NOT checked, anyone can inject messages. Never run this "
                "in production. !!!"
            )
        if self._wa is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout, connect=10.0))
            try:
                self._wa = self._make_client(self._http)
            except Exception:
                await self._http.aclose()
                self._http = None
                raise
        self._on_event = on_event
        logger.info("WhatsApp adapter started (Graph API at %s)", self._http_base_url())

    def _make_client(self, session: httpx.AsyncClient) -> WhatsApp:
        wa = WhatsApp(
            phone_id=self.phone_id,
            token=self._token,
            session=session,
            api_version=self.api_version,
            # No server, no callback_url: pywa must not register webhooks or listen.
            validate_updates=False,
            user_identifier_priority=(
                UserIdentifier.WA_ID,
                UserIdentifier.BSUID,
                UserIdentifier.PARENT_BSUID,
            ),
        )
        # pywa set session.base_url to graph.facebook.com/v<version>; keep its version path.
        session.base_url = httpx.URL(self.api_base_url + session.base_url.path)
        return wa

    def _http_base_url(self) -> str:
        return str(self._http.base_url) if self._http is not None else self.api_base_url

    async def stop(self) -> None:
        """Stop accepting webhooks (they get 503) and close the HTTP client; idempotent."""
        self._on_event = None
        self._wa = None
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    # -- webhook ---------------------------------------------------------------------------

    def routes(self) -> Sequence[BaseRoute]:
        """The webhook route, ``GET|POST /webhooks/whatsapp``."""
        return [Route(WEBHOOK_PATH, self._webhook, methods=["GET", "POST"])]

    async def _webhook(self, request: Request) -> Response:
        if request.method == "GET":
            return self._verify(request)
        return await self._receive(request)

    def _verify(self, request: Request) -> Response:
        params = request.query_params
        mode = params.get("hub.mode", "")
        token = params.get("hub.verify_token", "")
        challenge = params.get("hub.challenge")
        token_ok = bool(self._verify_token) and hmac.compare_digest(
            token.encode(), self._verify_token.encode()
        )
        if mode != "subscribe" or not token_ok:
            logger.warning("WhatsApp webhook verification refused (mode or verify token wrong)")
            return PlainTextResponse("Forbidden", status_code=403)
        if challenge is None:
            return PlainTextResponse("Missing hub.challenge", status_code=400)
        logger.info("WhatsApp webhook verified")
        return PlainTextResponse(challenge)

    async def _read_body(self, request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise _BodyTooLarge
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise _BodyTooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    def _signature_error(self, body: bytes, header: str | None) -> Response | None:
        if not self._app_secret:
            return None  # insecure_dev, announced at start
        if not header:
            logger.warning("WhatsApp webhook rejected: no X-Hub-Signature-256 header")
            return PlainTextResponse("Unauthorized", status_code=401)
        expected = hmac.new(self._app_secret.encode(), body, hashlib.sha256).hexdigest()
        given = header.strip()
        given = given[len("sha256=") :] if given.lower().startswith("sha256=") else ""
        if not hmac.compare_digest(given.lower().encode(), expected.encode()):
            logger.warning("WhatsApp webhook rejected: X-Hub-Signature-256 does not match")
            return PlainTextResponse("Forbidden", status_code=403)
        return None

    async def _receive(self, request: Request) -> Response:
        on_event = self._on_event
        if on_event is None:
            # Not started (or stopping): Meta retries later.
            return PlainTextResponse("Not ready", status_code=503)
        try:
            body = await self._read_body(request)
        except _BodyTooLarge:
            logger.warning("WhatsApp webhook rejected: body over %d bytes", self.max_body_bytes)
            return PlainTextResponse("Payload Too Large", status_code=413)
        refused = self._signature_error(body, request.headers.get(_SIGNATURE_HEADER))
        if refused is not None:
            return refused
        try:
            payload: Any = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            # RecursionError: JSON nested deeper than the parser's stack.
            logger.warning("WhatsApp webhook rejected: body is not JSON")
            return PlainTextResponse("Bad Request", status_code=400)
        if not isinstance(payload, dict):
            logger.warning("WhatsApp webhook rejected: body is not a JSON object")
            return PlainTextResponse("Bad Request", status_code=400)
        if payload.get("object") != WEBHOOK_OBJECT:
            logger.debug("WhatsApp webhook for object %r ignored", payload.get("object"))
            return PlainTextResponse("ignored")

        batch = parse_webhook(payload, phone_id=self.phone_id, sent_ids=self._sent_ids)
        logger.debug(
            "WhatsApp webhook: %d message(s), %d status(es), %d ignored",
            len(batch.events),
            batch.statuses,
            batch.ignored,
        )
        for event in batch.events:
            try:
                await on_event(event)
            except ChatflowError as exc:
                # No 200: Meta redelivers the whole body and the gateway dedups by wamid.
                if not exc.retryable:
                    logger.error(
                        "WhatsApp message %s not accepted (%s); answering 500",
                        log_ref(event.message_id),
                        type(exc).__name__,
                    )
                    return PlainTextResponse("Internal Server Error", status_code=500)
                # Back-pressure (queue full, shutting down): a quick "busy", not an error.
                logger.warning(
                    "WhatsApp message %s not accepted now (%s); answering 503",
                    log_ref(event.message_id),
                    type(exc).__name__,
                )
                headers = {}
                if exc.retry_after is not None:
                    headers["Retry-After"] = str(max(1, round(exc.retry_after)))
                return PlainTextResponse("Busy, retry later", status_code=503, headers=headers)
            except Exception:
                logger.exception(
                    "WhatsApp message %s not accepted; answering 500", log_ref(event.message_id)
                )
                return PlainTextResponse("Internal Server Error", status_code=500)
        for failed in batch.failed_statuses:
            await self._status_failed(failed)
        return PlainTextResponse("ok")

    async def _status_failed(self, failed: FailedStatus) -> None:
        logger.warning(
            "WhatsApp reports delivery failed for %s (error code %s)",
            log_ref(failed.wamid),
            failed.code,
        )
        callback = self.on_status_failed
        if callback is None:
            return
        try:
            await callback(failed.wamid, failed.error)
        except Exception:
            logger.warning(
                "on_status_failed callback failed for %s", log_ref(failed.wamid), exc_info=True
            )

    # -- sending ---------------------------------------------------------------------------

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Send ``text`` in ordered parts of at most 4096 characters.

        The first part quotes ``reply_to``. A group id is answered in the group.
        ``thread_id`` is ignored: WhatsApp chats have no threads.
        """
        wa = self._wa
        if wa is None:
            raise PlatformError(
                "WhatsApp adapter is not started", platform=PLATFORM, retryable=True
            )
        if not chat_id or not chat_id.strip():
            raise PlatformError("empty WhatsApp chat id", platform=PLATFORM)
        parts = split_text(text, self.max_text_len)
        if not parts:
            raise PlatformError("nothing to send: the text is blank", platform=PLATFORM)
        if thread_id is not None:
            logger.debug("WhatsApp has no threads; thread_id ignored")
        if await self._window_closed(chat_id):
            logger.info("WhatsApp 24-hour window closed for this person: the reply is a template")
            return await self._send_template(wa, chat_id, text, reply_to)
        logger.debug(
            "WhatsApp send: %d part(s) to a %s",
            len(parts),
            "group" if is_group_chat_id(chat_id) else "person",
        )

        async def send_text(index: int, part: str) -> Any:
            return await wa.send_message(
                to=chat_id, text=part, reply_to_message_id=reply_to if index == 0 else None
            )

        try:
            ids = await self._send_parts(wa, chat_id, parts, send_text)
        except _WindowClosedByMeta as closed:
            # Meta's clock wins over ours. One switch, never a loop: a template
            # refusal is final (see whatsapp_errors).
            if self.template is None:
                raise self._window_closed_error() from closed.__cause__
            logger.info("WhatsApp answered 131047: the reply is sent as the template")
            return await self._send_template(wa, chat_id, text, reply_to)
        return SendResult(message_ids=ids)

    async def _send_parts(
        self,
        wa: WhatsApp,
        chat_id: str,
        parts: Sequence[str],
        send_one: Callable[[int, str], Awaitable[Any]],
        *,
        free_form: bool = True,
    ) -> list[str]:
        """Send ``parts`` in order with ``send_one(index, part)``, paced, each part's id
        kept; Meta's errors translated with how many parts may have arrived. Free-form
        text refused with 131047 on its first part raises ``_WindowClosedByMeta``
        (nothing was sent: the caller may switch to the template)."""
        ids: list[str] = []
        for index, part in enumerate(parts):
            if index and self.send_pause > 0:
                # Meta's pair-rate limit (131056) punishes bursts to one user.
                await _pause(self.send_pause)
            if self._wa is not wa:
                # stop() closed the HTTP client between parts.
                raise PlatformError(
                    "WhatsApp adapter stopped while sending",
                    platform=PLATFORM,
                    retryable=True,
                    ambiguous=index > 0,
                )
            await self._take_turn(chat_id)
            try:
                sent = await send_one(index, part)
            except WhatsAppError as exc:
                if free_form and exc.code == REENGAGEMENT_CODE and index == 0:
                    raise _WindowClosedByMeta from exc
                raise api_error(exc, index, len(parts)) from exc
            except httpx.HTTPError as exc:
                raise transport_error(exc, index, len(parts)) from exc
            ids.append(sent.id)
            self._sent_ids.add(sent.id)
        return ids

    async def _window_closed(self, chat_id: str) -> bool:
        """True when our record says the person's 24-hour window is closed.

        Unknown (never recorded, a group, no record kept, or the database failing)
        is False: free-form is tried and a 131047 still switches to the template.
        """
        windows, length = self.windows, self.service_window_seconds
        if windows is None or length is None or is_group_chat_id(chat_id):
            return False
        try:
            state = await windows.is_open(PLATFORM, chat_id, length)
        except ChatflowError as exc:
            logger.warning("WhatsApp window unknown (%s); trying free-form", type(exc).__name__)
            return False
        return state is False

    def _window_closed_error(self) -> PlatformError:
        logger.warning("WhatsApp 24-hour window closed and WHATSAPP_TEMPLATE_NAME unset")
        return PlatformError(WINDOW_CLOSED_REASON, platform=PLATFORM, code=REENGAGEMENT_CODE)

    async def _send_template(
        self, wa: WhatsApp, chat_id: str, text: str, reply_to: str | None
    ) -> SendResult:
        """Send ``text`` as the operator's template: one message, or several in order
        when it is longer than a parameter holds (``template_parts``); refused whole,
        before anything is sent, past ``MAX_TEMPLATE_PARTS``."""
        template = self.template
        if template is None:
            raise self._window_closed_error()
        parts = template_parts(text)
        if len(parts) > MAX_TEMPLATE_PARTS:
            logger.warning(
                "WhatsApp reply of %d characters refused: it would take %d templates",
                len(text),
                len(parts),
            )
            raise PlatformError(too_long_reason(text, len(parts)), platform=PLATFORM)

        async def send_template(index: int, part: str) -> Any:
            return await wa.send_template(
                to=chat_id,
                name=template.name,
                language=template.language,
                params=template.params(part),
                reply_to_message_id=reply_to if index == 0 else None,
            )

        # A template refused (131047 included) is final: no switch.
        ids = await self._send_parts(wa, chat_id, parts, send_template, free_form=False)
        if len(parts) > 1:
            logger.info("WhatsApp reply sent as %d templates", len(parts))
        return SendResult(message_ids=ids)

    def format_reply(self, text: str, agent_name: str) -> str:
        """WhatsApp shows replies as they are: ``text`` unchanged."""
        return text

    async def fetch_media(self, media: MediaAttachment, *, max_bytes: int) -> bytes:
        """Download a user's file by its media id (see ``whatsapp_media``)."""
        if self._wa is None or self._http is None:
            raise PlatformError(
                "WhatsApp adapter is not started", platform=PLATFORM, retryable=True
            )
        return await fetch_media(
            self._wa, media, max_bytes=max_bytes, http=self._http, hosts=self.media_hosts
        )

    # -- typing ----------------------------------------------------------------------------

    async def indicate_typing(self, event: MessageEvent) -> None:
        """Mark ``event`` read with a typing indicator, once per event and 20 s.

        WhatsApp's indicator lasts 25 s or until we reply, and every call also
        re-marks the message read, so repeats are skipped; a turn still running
        20 s on shows it again (the gateway calls every 4 s: no gap). Errors are
        swallowed.
        """
        wa = self._wa
        window = int(self._clock() // _TYPING_REFRESH_SECONDS)
        if wa is None or not self._typed_ids.add(f"{event.message_id}#{window}"):
            return
        if not await self._take_turn(event.source.chat_id, optional=True):
            return  # replies are waiting for the number's throughput: they come first
        try:
            await wa.indicate_typing(event.message_id)
        except (WhatsAppError, httpx.HTTPError) as exc:
            logger.debug("WhatsApp typing indicator failed: %s", type(exc).__name__)

    async def _take_turn(self, chat_id: str, *, optional: bool = False) -> bool:
        """Wait for the pacer's turn to write a request (True); False: skip an optional one."""
        pacer = self.pacer
        if pacer is None:
            return True
        return await pacer.turn(chat_id, group=is_group_chat_id(chat_id), optional=optional)


async def _pause(seconds: float) -> None:
    await asyncio.sleep(seconds)
