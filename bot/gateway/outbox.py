"""Sending owed replies: the adapter call, its outcome in the ledger, retries later.

Every reply reaches an adapter through ``Outbox.send``, which the ledger
already holds as ``attempting`` for this process (claimed in tx 2, by a sweep
or by ``due_retries``), so whatever happens around the send, the row says
whether the reply may have arrived.

Each adapter that declares ``send_limits`` gets its account's ``AccountPacer``
(``bot.gateway.pacing``) here. A flood refusal (``retry_after`` set, nothing
sent) pauses that account for the time the platform asked, and the reply is
sent again as soon as the pause allows, not at the next retry poll; its row
stays ``attempting`` meanwhile, so a crash still leaves it owed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from bot.core.media_store import MediaStore
from bot.core.scheduling import SCHEDULED_REF
from bot.errors import PlatformError
from bot.gateway.attachments import send_reply
from bot.gateway.contract import PlatformAdapter, SendResult, StatusFailedHandler
from bot.gateway.keys import chat_type_of
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import MAX_ATTEMPTS, Obligation
from bot.gateway.pacing import AccountPacer
from bot.gateway.voice_replies import VoiceReplies
from bot.metrics import Metrics
from bot.tracing import names, spans

__all__ = [
    "ADAPTER_WAIT_SECONDS",
    "FLOOD_RESENDS",
    "PRUNE_INTERVAL_SECONDS",
    "RETRY_POLL_SECONDS",
    "SWEEP_INTERVAL_SECONDS",
    "Outbox",
]

logger = logging.getLogger(__name__)

RETRY_POLL_SECONDS = 5.0
"""How often failed sends are checked for a due retry."""
SWEEP_INTERVAL_SECONDS = 60.0
"""How often rows the operator re-queued (or a dead process left) are adopted."""
PRUNE_INTERVAL_SECONDS = 3600.0
"""How often delivered ledger rows and done inbox rows past retention are deleted."""
ADAPTER_WAIT_SECONDS = 60.0
"""Delay before a reply whose adapter is disconnected is tried again."""
FLOOD_RESENDS = 3
"""Flood refusals of one reply resent in place (after the pause) before it is left
to the retry poll."""


class Outbox:
    """Sends owed replies through their adapters and records each outcome."""

    def __init__(
        self,
        ledger: DeliveryLedger,
        adapters: Mapping[str, PlatformAdapter],
        metrics: Metrics,
        *,
        housekeeping: Sequence[Callable[[], Awaitable[object]]] = (),
        media: MediaStore | None = None,
    ) -> None:
        """``housekeeping``: more prunes to run beside the ledger's (the inbox's).
        ``media``: where the files replies carry are read from."""
        self.ledger = ledger
        self._adapters = adapters
        self.metrics = metrics
        self._housekeeping = tuple(housekeeping)
        self.media = media
        """The media store of reply attachments (``Turns`` sets the media step's)."""
        self.voice: VoiceReplies | None = None
        """Sends replies that carry voice notes (``Turns`` sets it); ``None``: text and files."""
        self.fence: Callable[[Obligation], Awaitable[bool]] | None = None
        """Asked right before each platform send: ``False`` leaves the row as it is, unsent
        (this process's lease lapsed and the row is no longer surely its own)."""
        self.sending: set[str] = set()
        """Obligation ids being sent now (a row in flight is nobody's quiet work)."""
        self.pacers: dict[str, AccountPacer] = {}
        """The outbound scheduler of each adapter that declared ``send_limits``."""
        for name, adapter in adapters.items():
            # A structural adapter (not a PlatformAdapter subclass) may lack the hooks.
            limits = getattr(adapter, "send_limits", None)
            if limits is not None and getattr(adapter, "pacer", None) is None:
                pacer = AccountPacer(limits, name=name)
                adapter.pacer = pacer
                self.pacers[name] = pacer

    def flood(self, platform: str, exc: PlatformError) -> bool:
        """Tell ``platform``'s pacer about a flood refusal; True if it paces that account."""
        pacer = self.pacers.get(platform)
        if pacer is None or exc.retry_after is None or not exc.retryable or exc.ambiguous:
            return False
        pacer.refused(exc.retry_after)
        return True

    async def send(self, obligation: Obligation) -> None:
        """Send one owed reply the ledger holds as ``attempting`` for this process.

        Traced as ``chatflow.send`` inside the turn's trace; a send outside it (a
        resend after a crash, a retry, a scheduled message, work taken over) starts
        a new trace linked to the span that recorded the reply.
        """
        if not spans.enabled():
            await self._send(obligation, spans.NO_SPAN)
            return
        attributes: dict[str, spans.AttributeValue] = {
            names.PLATFORM: obligation.platform,
            names.CONVERSATION_ID: spans.conversation_id(obligation.session_key),
            "chatflow.send.attempt": obligation.attempts,
        }
        if spans.capture() is not None:
            with spans.span(names.SEND, attributes, kind="producer") as traced:
                await self._send(obligation, traced)
            return
        # An earlier attempt ran (crashed, failed, or was refused for flood): a resend.
        again = (
            obligation.needs_marker or obligation.attempts > 1 or obligation.last_error is not None
        )
        name = names.RESEND if again else names.SEND  # SEND: e.g. an operator's message
        if not again and obligation.message_ref.startswith(SCHEDULED_REF):
            name = names.SCHEDULED
        attributes["chatflow.send.marker"] = obligation.needs_marker
        with spans.span(
            name, attributes, kind="producer", root=True, link=obligation.traceparent
        ) as traced:
            await self._send(obligation, traced)

    async def _send(self, obligation: Obligation, traced: spans.SpanHandle) -> None:
        adapter = self._adapters.get(obligation.platform)
        if adapter is None or not adapter.is_connected:
            logger.warning(
                "no connected %s adapter; reply %s waits",
                obligation.platform,
                obligation.obligation_id,
            )
            # Nothing was tried: the row waits (pending, its attempt given back) and is
            # looked at again later, or at the next start. Not a failure: no marker.
            traced.set(names.OUTCOME, "waiting")
            traced.set("chatflow.send.reason", "adapter not connected")
            await self.ledger.mark_waiting(
                obligation.obligation_id,
                f"waiting: {obligation.platform} is not connected",
                wait=ADAPTER_WAIT_SECONDS,
            )
            return
        self.sending.add(obligation.obligation_id)
        try:
            await self._send_owned(adapter, obligation, traced)
        finally:
            self.sending.discard(obligation.obligation_id)

    async def _send_owned(
        self, adapter: PlatformAdapter, obligation: Obligation, traced: spans.SpanHandle
    ) -> None:
        pacer = self.pacers.get(obligation.platform)
        if pacer is not None and obligation.message_ref.startswith(SCHEDULED_REF):
            # A scheduled post waits for the chat's replies (and leaves a group's window room).
            group = chat_type_of(obligation.session_key) != "dm"
            await pacer.make_way(obligation.chat_id, group=group)
        # Fenced after that wait (up to a group's minute), right before the send.
        if self.fence is not None and not await self.fence(obligation):
            traced.set(names.OUTCOME, "fenced")
            logger.warning(
                "reply %s not sent: this process's lease lapsed and the reply is no longer "
                "surely its own (whoever owns it sends it, marked)",
                obligation.obligation_id,
            )
            return
        if obligation.needs_marker:
            self.metrics.resends.labels(obligation.platform).inc()
        try:
            # Text, then the files the reply carries (bot.gateway.attachments).
            result = await self._send_reply(adapter, obligation, traced)
        except PlatformError as exc:
            self.metrics.send_failures.labels(obligation.platform).inc()
            _failed(traced, obligation, exc)
            logger.warning(
                "sending reply %s failed (%s, retryable=%s, ambiguous=%s)",
                obligation.obligation_id,
                exc,
                exc.retryable,
                exc.ambiguous,
            )
            await self.ledger.mark_failed(
                obligation.obligation_id,
                str(exc),
                retryable=exc.retryable,
                retry_after=exc.retry_after,
                ambiguous=exc.ambiguous,
            )
            return
        except Exception as exc:
            # An adapter bug: we cannot tell whether the message left, so resend with the marker.
            logger.exception("adapter %s crashed while sending", obligation.platform)
            traced.set(names.OUTCOME, "failed")
            traced.fail(type(exc).__name__)
            await self.ledger.mark_failed(
                obligation.obligation_id, repr(exc), retryable=True, ambiguous=True
            )
            return
        self.metrics.replies_delivered.labels(obligation.platform).inc()
        traced.set(names.OUTCOME, "sent")
        # Not awaited to the commit: the mark joins the next group commit and the lane
        # moves on; a crash before it lands resends with the marker.
        await self.ledger.mark_delivered(
            obligation.obligation_id,
            result.message_ids,
            platform=obligation.platform,
            wait=False,
        )

    async def _send_reply(
        self, adapter: PlatformAdapter, obligation: Obligation, traced: spans.SpanHandle
    ) -> SendResult:
        """``send_reply``, resent in place after a flood refusal once the pause is over."""
        for resend in range(FLOOD_RESENDS + 1):
            try:
                if self.voice is not None:
                    return await self.voice.send(adapter, obligation, self.media)
                return await send_reply(adapter, obligation, self.media)
            except PlatformError as exc:
                # Nothing left (not ambiguous): the row is still ours and still owed.
                if resend == FLOOD_RESENDS or not self.flood(obligation.platform, exc):
                    raise
                self.metrics.send_failures.labels(obligation.platform).inc()
                traced.event(
                    "chatflow.send.flood_refused",
                    {"chatflow.send.retry_after_s": float(exc.retry_after or 0.0)},
                )
                traced.set("chatflow.send.flood_retries", resend + 1)
                logger.info(
                    "reply %s refused for flood; resent after %.1f s",
                    obligation.obligation_id,
                    exc.retry_after,
                )
        raise AssertionError("unreachable")

    async def retry_due(self, *, sweep: bool = False) -> int:
        """Send the failed replies whose retry is due (and, with ``sweep``, adopt
        rows re-queued by the operator or left by a dead process); returns how many."""
        owed = await self.ledger.due_retries()
        if sweep:
            connected = {n for n, a in self._adapters.items() if a.is_connected}
            owed += await self.ledger.sweep_recoverable(deliverable_platforms=connected)
        for obligation in owed:
            await self.send(obligation)
        return len(owed)

    async def run(self, stopping: asyncio.Event) -> None:
        """Retry due sends, adopt re-queued rows and prune, until ``stopping`` is set."""
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + SWEEP_INTERVAL_SECONDS
        next_prune = loop.time()
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), RETRY_POLL_SECONDS)
            if stopping.is_set():
                return
            try:
                await self.ledger.record_unrecorded()
                sweep = loop.time() >= next_sweep
                if sweep:
                    next_sweep = loop.time() + SWEEP_INTERVAL_SECONDS
                await self.retry_due(sweep=sweep)
                if loop.time() >= next_prune:
                    next_prune = loop.time() + PRUNE_INTERVAL_SECONDS
                    await self.ledger.prune()
                    for prune in self._housekeeping:
                        await prune()
            except Exception:
                logger.exception("retrying failed replies failed; trying again later")

    def status_failed_handler(self, platform: str) -> StatusFailedHandler:
        async def handler(platform_message_id: str, error: str) -> None:
            # The ledger logs it against its obligation and keeps the error on the row.
            await self.ledger.status_failed(platform_message_id, error, platform=platform)

        return handler


def _failed(traced: spans.SpanHandle, obligation: Obligation, exc: PlatformError) -> None:
    """A failed send's outcome on its span: retried later (after the wait the platform
    asked for), or abandoned (refused for good, or out of attempts), and why."""
    abandoned = not exc.retryable or (
        exc.retry_after is None and obligation.attempts >= MAX_ATTEMPTS
    )
    traced.set(names.OUTCOME, "abandoned" if abandoned else "retry_later")
    # The platform's code and our error class, never its message (it may quote the chat).
    reason = type(exc).__name__ if exc.code is None else f"{type(exc).__name__} {exc.code}"
    traced.set("chatflow.send.reason", reason)
    traced.set("chatflow.send.ambiguous", exc.ambiguous)
    if exc.retry_after is not None:
        traced.set("chatflow.send.retry_after_s", float(exc.retry_after))
    traced.fail(type(exc).__name__)
