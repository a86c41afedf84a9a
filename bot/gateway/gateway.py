"""The gateway loop: adapters -> inbox -> runner -> ledger -> adapters.

Durability points (see docs/ARCHITECTURE.md):
- tx 1, ``Inbox.accept``: dedup claim + journal row. The adapter confirms the
  update to its platform only after it commits.
- tx 2, the turn commit: new messages, pruned rows, session row, inbox row
  ``done`` and the ledger obligation ``pending`` in one SQLite transaction.
- then the send, bracketed by ``mark_attempting`` / ``mark_delivered``.
At start-up the ledger sweep resends what a dead process owed, and the inbox
re-runs turns that never committed. With several processes on PostgreSQL
(``instances`` given) that takeover also runs every few seconds, for the work
of processes whose lease expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from bot.config import Settings
from bot.core.memory import BaseSessionStore, Transaction
from bot.core.runner import Runner, RunResult
from bot.errors import ChatflowError, PlatformError
from bot.gateway.aliases import ChatAliases
from bot.gateway.dispatcher import DispatcherBusyError, SessionDispatcher
from bot.gateway.events import MessageEvent
from bot.gateway.inbox import GAVE_UP_ERROR, Inbox, InboxClaimLostError, InboxEntry
from bot.gateway.instances import InstanceRegistry
from bot.gateway.keys import build_session_key, session_id_for
from bot.gateway.ledger import DeliveryLedger, Obligation, compute_obligation_id
from bot.metrics import Metrics
from bot.platforms.base import PlatformAdapter

__all__ = ["Gateway", "Replies"]

logger = logging.getLogger(__name__)

TYPING_INTERVAL = 4.0
"""Seconds between typing indications (Telegram's indicator fades after ~5 s)."""
RETRY_POLL_SECONDS = 5.0
"""How often failed sends are checked for a due retry."""
SWEEP_INTERVAL_SECONDS = 60.0
"""How often rows the operator re-queued (or a dead process left) are adopted."""
PRUNE_INTERVAL_SECONDS = 3600.0
"""How often delivered ledger rows and done inbox rows past retention are deleted."""
ADAPTER_WAIT_SECONDS = 60.0
"""Delay before a reply whose adapter is disconnected is tried again."""
MAX_INBOUND_CHARS = 16_000
"""Longer inbound texts are refused with a short answer instead of reaching the model."""

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(value: str) -> str:
    return _LONE_SURROGATE.sub("\ufffd", value)


def _clean_opt(value: str | None) -> str | None:
    return None if value is None else _clean(value)


def _encodable(event: MessageEvent) -> MessageEvent:
    """``event`` with lone surrogates replaced by U+FFFD.

    JSON may carry an unpaired ``\\ud800`` escape; such a string cannot be
    encoded as UTF-8, so it would fail every write (SQLite, logs, the model's
    HTTP body) and, refused again at each redelivery, block its chat for good.
    """
    source = event.source
    values = (
        event.message_id,
        event.text,
        event.platform_message_id,
        event.reply_to_id,
        event.command,
        event.media_kind,
        event.migrate_from_chat_id,
        source.chat_id,
        source.sender_id,
        source.thread_id,
        source.chat_name,
        source.sender_name,
    )
    if not any(v is not None and _LONE_SURROGATE.search(v) for v in values):
        return event
    return replace(
        event,
        message_id=_clean(event.message_id),
        text=_clean(event.text),
        platform_message_id=_clean_opt(event.platform_message_id),
        reply_to_id=_clean_opt(event.reply_to_id),
        command=_clean_opt(event.command),
        media_kind=_clean_opt(event.media_kind),
        migrate_from_chat_id=_clean_opt(event.migrate_from_chat_id),
        source=replace(
            source,
            chat_id=_clean(source.chat_id),
            sender_id=_clean(source.sender_id),
            thread_id=_clean_opt(source.thread_id),
            chat_name=_clean_opt(source.chat_name),
            sender_name=_clean_opt(source.sender_name),
        ),
    )


@dataclass(frozen=True)
class Replies:
    """The fixed texts the gateway answers with when no turn runs."""

    apology: str = (
        "Sorry, something went wrong on my side and I could not answer that. "
        "Please try again in a moment."
    )
    """Sent when a turn fails after its retries; the conversation is left as it was."""
    media_only: str = "Sorry, I can only read text messages for now. Could you type it out?"
    """Sent for a photo, voice note, sticker... without a caption."""
    too_long: str = "That message is too long for me. Could you shorten it or split it up?"
    """Sent for a text over ``MAX_INBOUND_CHARS``."""
    reset: str = "Done: I have forgotten this conversation. What can I do for you?"
    """Answer to ``/reset``."""
    help: str = "Just write to me. /reset starts our conversation over, /help shows this message."
    """Answer to ``/help``."""
    greeting: str = "Hello! I'm {agent}. How can I help?"
    """Answer to ``/start``; ``{agent}`` is the starting agent's name."""


class Gateway:
    """Joins platform adapters, the inbox, the Runner and the delivery ledger."""

    def __init__(
        self,
        runner: Runner,
        store: BaseSessionStore,
        adapters: Sequence[PlatformAdapter],
        settings: Settings,
        *,
        secret: bytes,
        metrics: Metrics | None = None,
        replies: Replies | None = None,
        instances: InstanceRegistry | None = None,
    ) -> None:
        names = [a.name for a in adapters]
        if len(set(names)) != len(names):
            raise ValueError(f"two adapters share a name: {names}")
        self.runner = runner
        self.store = store
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.replies = replies or Replies()
        self.instances = instances
        owner = None if instances is None else instances.owner
        self.inbox = Inbox(store, owner=None if owner is None else owner.instance_id)
        self.ledger = DeliveryLedger(
            store, owner=owner, liveness=None if instances is None else instances.is_alive
        )
        self.aliases = ChatAliases(store)
        self._adapters = {a.name: a for a in adapters}
        self._secret = secret
        # Unbounded on purpose: MAX_QUEUED_MESSAGES is applied in _on_event before
        # tx 1, since a message once accepted must be queued whatever happens.
        self._dispatcher: SessionDispatcher[InboxEntry] = SessionDispatcher(
            self._process,
            max_concurrent=settings.max_concurrent_turns,
        )
        self._admitting = 0
        self._early: list[InboxEntry] = []
        self._ready = False
        self._accepting = False
        self._stopping = asyncio.Event()
        self._retry_task: asyncio.Task[None] | None = None
        self._recovery_task: asyncio.Task[None] | None = None
        self._takeover_task: asyncio.Task[None] | None = None

    @property
    def adapters(self) -> dict[str, PlatformAdapter]:
        """Adapters by platform name."""
        return dict(self._adapters)

    @property
    def ready(self) -> bool:
        """True once recovery is done and new traffic is being processed."""
        return self._ready

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Open the tables, start adapters, resend and re-run what a crash left, then serve."""
        await self.inbox.open()
        await self.ledger.open()
        await self.aliases.open()
        self._accepting = True
        for adapter in self._adapters.values():
            if hasattr(adapter, "on_status_failed") and adapter.on_status_failed is None:
                adapter.on_status_failed = self._status_failed_handler(adapter.name)
            try:
                await adapter.start(self._on_event)
            except ChatflowError:
                raise
            except Exception:
                logger.exception("%s adapter failed to start; its replies wait", adapter.name)
        connected = {name for name, a in self._adapters.items() if a.is_connected}
        owed = await self.ledger.sweep_recoverable(deliverable_platforms=connected)
        if owed:
            logger.info("resending %d replies owed from before the restart", len(owed))
        for obligation in owed:
            await self._send(obligation, claimed=True)
        left = await self.inbox.recover(
            self.settings.auto_continue_freshness_seconds, live_owners=await self._live_owners()
        )
        # Read after recover() returns: a message accepted while it ran is in both lists,
        # and must run once, from _early.
        early = {entry.event.message_id for entry in self._early}
        recovered = [entry for entry in left if entry.event.message_id not in early]
        if recovered:
            logger.info("re-running %d messages accepted before the restart", len(recovered))
        # Any message left by a crash may be what caused it. They run one at a time,
        # before anything else, each run counted first: a further crash is blamed on
        # one message only, and innocent ones are never given up.
        suspects = [e for e in recovered if not e.gave_up]
        rest = [e for e in recovered if e.gave_up]
        if suspects:
            self._recovery_task = asyncio.create_task(self._isolate_then_serve(suspects, rest))
        else:
            self._serve(rest)

    async def _isolate_then_serve(self, suspects: list[InboxEntry], rest: list[InboxEntry]) -> None:
        logger.info(
            "running %d message(s) interrupted by the last crash one at a time", len(suspects)
        )
        for entry in suspects:
            try:
                await self._process(entry, alone=True)
            except Exception:
                logger.exception("re-running an interrupted message failed")
        self._serve(rest, already_run={e.event.message_id for e in suspects})

    def _serve(
        self, rest: list[InboxEntry], already_run: frozenset[str] | set[str] = frozenset()
    ) -> None:
        """Queue the recovered and early messages and start serving new ones."""
        for entry in rest:
            self._dispatcher.submit(entry.session_id, entry.event.message_id, entry)
        for entry in self._early:
            if entry.event.message_id not in already_run:
                self._dispatcher.submit(entry.session_id, entry.event.message_id, entry)
        self._early.clear()
        self._ready = True
        self._dispatcher.resume()
        self._retry_task = asyncio.create_task(self._retry_loop())
        if self.instances is not None:
            self._takeover_task = asyncio.create_task(self._takeover_loop())

    async def stop(self, grace: float | None = None) -> None:
        """Stop accepting; let turns in flight finish within ``grace`` s; recovery does the rest."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        # Refuse new events first (platforms keep them), but keep adapters connected
        # until the turns in flight have sent their replies.
        self._accepting = False
        if self._recovery_task is not None and not self._recovery_task.done():
            self._recovery_task.cancel()
            await asyncio.gather(self._recovery_task, return_exceptions=True)
        wait = self.settings.shutdown_grace_seconds if grace is None else grace
        if not await self._dispatcher.drain(wait):
            logger.warning(
                "%d turns still running after %.0f s; they will be re-run at the next start",
                self._dispatcher.in_flight,
                wait,
            )
        await self._dispatcher.cancel()
        for adapter in self._adapters.values():
            with contextlib.suppress(Exception):
                await adapter.stop()
        for loop_task in (self._retry_task, self._takeover_task):
            if loop_task is not None:
                loop_task.cancel()
                await asyncio.gather(loop_task, return_exceptions=True)

    # -- inbound -----------------------------------------------------------

    def _allowed(self, event: MessageEvent) -> bool:
        s = self.settings
        if not s.allowed_users and not s.allowed_chats:
            return True
        return event.source.sender_id in s.allowed_users or event.source.chat_id in s.allowed_chats

    def _addressed(self, event: MessageEvent) -> bool:
        if event.source.chat_type == "dm":
            return True
        return event.addressed or event.source.chat_id in self.settings.group_answer_all_chats

    def session_key_for(self, event: MessageEvent) -> str:
        """The logical session key of an event (hashed ids, aliases applied)."""
        source = event.source
        chat_id = self.aliases.resolve(source.platform, source.chat_id)
        if chat_id != source.chat_id:
            source = replace(source, chat_id=chat_id)
        return build_session_key(
            source,
            group_sessions_per_user=self.settings.group_sessions_per_user,
            secret=self._secret,
        )

    async def _on_event(self, event: MessageEvent) -> bool:
        """Adapter entry point: returns once the event is durably accepted or judged not ours."""
        event = _encodable(event)
        platform = event.platform
        if not self._accepting:
            raise DispatcherBusyError("the bot is shutting down", retry_after=5.0)
        if event.migrate_from_chat_id is not None:
            await self.aliases.record(platform, event.source.chat_id, event.migrate_from_chat_id)
            return False
        if not self._allowed(event) or not self._addressed(event):
            self.metrics.ignored.labels(platform).inc()
            return False
        if not event.text.strip() and event.media_kind is None and event.command is None:
            self.metrics.ignored.labels(platform).inc()
            return False
        if not self._has_room():
            # Refuse before accepting: the platform keeps the message and offers it again.
            self.metrics.busy.labels(platform).inc()
            raise DispatcherBusyError("too many messages waiting", retry_after=5.0)
        session_key = self.session_key_for(event)
        session_id = session_id_for(session_key)
        # Hold a place in the queue while tx 1 runs: other events are admitted
        # meanwhile, and a message once accepted must never find the queue full.
        self._admitting += 1
        try:
            accepted = await self.inbox.accept(
                event, session_key=session_key, session_id=session_id
            )
        finally:
            self._admitting -= 1
        if not accepted:
            self.metrics.dedup_hits.labels(platform).inc()
            logger.info("duplicate %s message dropped (session %s)", platform, session_id)
            return False
        self.metrics.messages_in.labels(platform).inc()
        entry = InboxEntry(
            event=event,
            session_key=session_key,
            session_id=session_id,
            received_at=event.timestamp,
            attempts=0,
        )
        if self._ready:
            self._dispatcher.submit(session_id, event.message_id, entry)
        else:
            self._early.append(entry)
        self.metrics.queued.set(self._dispatcher.queued)
        return True

    def _has_room(self) -> bool:
        """Whether one more message may be accepted under ``MAX_QUEUED_MESSAGES``."""
        waiting = self._dispatcher.queued + len(self._early) + self._admitting
        return waiting < self.settings.max_queued_messages

    def _status_failed_handler(self, platform: str) -> Callable[[str, str], Awaitable[None]]:
        async def handler(platform_message_id: str, error: str) -> None:
            # The ledger logs it against its obligation and keeps the error on the row.
            await self.ledger.status_failed(platform_message_id, error, platform=platform)

        return handler

    # -- one turn ----------------------------------------------------------

    async def _process(self, entry: InboxEntry, *, alone: bool = False) -> None:
        event = entry.event
        if entry.gave_up:
            # It crashed the process again and again while running alone: the user is
            # told, instead of being left without an answer (or crashing us forever).
            await self._answer_without_turn(entry, self.replies.apology, error=GAVE_UP_ERROR)
            return
        if alone:
            await self.inbox.mark_started_alone(event.message_id)
        command = event.command
        if command in ("start", "help", "reset"):
            if command == "reset":
                await self.store.delete(entry.session_id)
            text = {
                "start": self.replies.greeting.format(agent=self.runner.starting_agent.name),
                "help": self.replies.help,
                "reset": self.replies.reset,
            }[command]
            await self._answer_without_turn(entry, text)
            return
        if not event.text.strip():
            await self._answer_without_turn(entry, self.replies.media_only)
            return
        if len(event.text) > MAX_INBOUND_CHARS:
            await self._answer_without_turn(entry, self.replies.too_long, error="message too long")
            return
        await self._run_turn(entry)

    async def _run_turn(self, entry: InboxEntry) -> None:
        event = entry.event
        adapter = self._adapters.get(event.platform)
        obligation: list[Obligation] = []

        async def commit(result: RunResult, tx: Transaction) -> None:
            content = result.content
            if adapter is not None:
                content = adapter.format_reply(content, result.agent)
            obligation.append(await self._record(tx, entry, content))
            await self.inbox.mark_done_in(tx, event.message_id)

        metadata = {
            "platform": event.platform,
            "chat_type": event.source.chat_type,
            "session_key": entry.session_key,
            "inbound_message_id": event.message_id,
        }
        typing = asyncio.create_task(self._keep_typing(event))
        started = asyncio.get_running_loop().time()
        try:
            await self.runner.run_async(entry.session_id, event.text, metadata, on_commit=commit)
        except InboxClaimLostError:
            # Our lease lapsed and another process answers this message: nothing to send.
            logger.info("turn in session %s discarded: taken over elsewhere", entry.session_id)
            return
        except ChatflowError as exc:
            self.metrics.turns.labels("failed").inc()
            logger.warning(
                "turn failed in session %s (%s); sending an apology",
                entry.session_id,
                type(exc).__name__,
            )
            await self._answer_without_turn(entry, self.replies.apology, error=type(exc).__name__)
            return
        finally:
            typing.cancel()
            await asyncio.gather(typing, return_exceptions=True)
            self.metrics.model_latency.observe(asyncio.get_running_loop().time() - started)
        self.metrics.turns.labels("ok").inc()
        for item in obligation:
            await self._send(item, claimed=False)

    async def _answer_without_turn(
        self, entry: InboxEntry, text: str, *, error: str | None = None
    ) -> None:
        """Record a fixed answer and close the inbox row in one transaction, then send it."""
        adapter = self._adapters.get(entry.event.platform)
        if adapter is not None:
            text = adapter.format_reply(text, self.runner.starting_agent.name)
        try:
            async with self.store.transaction() as tx:
                obligation = await self._record(tx, entry, text)
                await self.inbox.mark_done_in(tx, entry.event.message_id, error=error)
        except InboxClaimLostError:
            logger.info("answer in session %s dropped: taken over elsewhere", entry.session_id)
            return
        except ChatflowError:
            # The inbox row stays 'received': the next start-up answers it.
            logger.exception("could not record an answer for session %s", entry.session_id)
            return
        await self._send(obligation, claimed=False)

    async def _record(self, tx: Transaction, entry: InboxEntry, content: str) -> Obligation:
        event = entry.event
        obligation = Obligation.owed(
            obligation_id=compute_obligation_id(entry.session_key, event.message_id, content),
            session_key=entry.session_key,
            session_id=entry.session_id,
            platform=event.platform,
            chat_id=event.source.chat_id,
            thread_id=event.source.thread_id,
            reply_to=event.platform_message_id,
            content=content,
            message_ref=event.message_id,
        )
        await self.ledger.record_in(tx, obligation)
        return obligation

    async def _keep_typing(self, event: MessageEvent) -> None:
        adapter = self._adapters.get(event.platform)
        if adapter is None:
            return
        while True:
            with contextlib.suppress(Exception):
                await adapter.indicate_typing(event)
            await asyncio.sleep(TYPING_INTERVAL)

    # -- outbound ----------------------------------------------------------

    async def _send(self, obligation: Obligation, *, claimed: bool) -> None:
        """Send one owed reply; ``claimed`` means the ledger already moved it to attempting."""
        adapter = self._adapters.get(obligation.platform)
        if adapter is None or not adapter.is_connected:
            logger.warning(
                "no connected %s adapter; reply %s waits",
                obligation.platform,
                obligation.obligation_id,
            )
            if claimed:
                # Give the attempt back and look again later (or at the next start).
                await self.ledger.mark_failed(
                    obligation.obligation_id,
                    "adapter not connected",
                    retryable=True,
                    retry_after=ADAPTER_WAIT_SECONDS,
                )
            return
        if not claimed and not await self.ledger.mark_attempting(obligation.obligation_id):
            return  # already delivered, abandoned, or being sent by someone else
        if obligation.needs_marker:
            self.metrics.resends.labels(obligation.platform).inc()
        try:
            result = await adapter.send(
                obligation.chat_id,
                obligation.outgoing_text,
                thread_id=obligation.thread_id,
                reply_to=obligation.reply_to,
            )
        except PlatformError as exc:
            self.metrics.send_failures.labels(obligation.platform).inc()
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
            if not exc.retryable:
                self.metrics.abandoned.labels(obligation.platform).inc()
            return
        except Exception as exc:
            # An adapter bug: we cannot tell whether the message left, so resend with the marker.
            logger.exception("adapter %s crashed while sending", obligation.platform)
            await self.ledger.mark_failed(
                obligation.obligation_id, repr(exc), retryable=True, ambiguous=True
            )
            return
        self.metrics.replies_delivered.labels(obligation.platform).inc()
        await self.ledger.mark_delivered(obligation.obligation_id, result.message_ids)

    async def retry_due(self, *, sweep: bool = False) -> int:
        """Send the failed replies whose retry is due (and, with ``sweep``, adopt
        rows re-queued by the operator or left by a dead process); returns how many."""
        owed = await self.ledger.due_retries()
        if sweep:
            connected = {n for n, a in self._adapters.items() if a.is_connected}
            owed += await self.ledger.sweep_recoverable(deliverable_platforms=connected)
        for obligation in owed:
            await self._send(obligation, claimed=True)
        return len(owed)

    async def _retry_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + SWEEP_INTERVAL_SECONDS
        next_prune = loop.time()
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), RETRY_POLL_SECONDS)
            if self._stopping.is_set():
                return
            try:
                sweep = loop.time() >= next_sweep
                if sweep:
                    next_sweep = loop.time() + SWEEP_INTERVAL_SECONDS
                await self.retry_due(sweep=sweep)
                if loop.time() >= next_prune:
                    next_prune = loop.time() + PRUNE_INTERVAL_SECONDS
                    await self.ledger.prune()
                    await self.inbox.prune()
            except Exception:
                logger.exception("retrying failed replies failed; trying again later")

    # -- several processes (PostgreSQL) ---------------------------------------

    async def _live_owners(self) -> set[str] | None:
        """Instance ids with a valid lease (``None`` without a registry: take every row)."""
        return None if self.instances is None else await self.instances.live_ids()

    async def take_over(self) -> int:
        """Resend replies and re-run turns that processes with an expired lease left behind.

        Safe at any time and in every process at once: each row is claimed by
        one of them. Returns how many replies and messages this process took.
        """
        connected = {n for n, a in self._adapters.items() if a.is_connected}
        owed = await self.ledger.sweep_recoverable(deliverable_platforms=connected)
        for obligation in owed:
            await self._send(obligation, claimed=True)
        live = await self._live_owners()
        recovered = await self.inbox.recover(
            self.settings.auto_continue_freshness_seconds,
            live_owners=live if live is not None else {self.inbox.owner},
        )
        for entry in recovered:
            self._dispatcher.submit(entry.session_id, entry.event.message_id, entry)
        if recovered:
            logger.info("took over %d message(s) of a process that stopped", len(recovered))
        return len(owed) + len(recovered)

    async def _takeover_loop(self) -> None:
        assert self.instances is not None
        loop = asyncio.get_running_loop()
        next_prune = loop.time() + PRUNE_INTERVAL_SECONDS
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.instances.check_every)
            if self._stopping.is_set():
                return
            try:
                await self.take_over()
                await self.aliases.reload()  # other processes record chat migrations too
                if loop.time() >= next_prune:
                    next_prune = loop.time() + PRUNE_INTERVAL_SECONDS
                    await self.instances.prune()
            except Exception:
                logger.exception("taking over work of stopped processes failed; trying again")
