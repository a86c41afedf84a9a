"""The gateway loop: adapters -> inbox -> runner -> ledger -> adapters.

Durability points (see docs/ARCHITECTURE.md):
- tx 1, ``Inbox.accept``: dedup claim + journal row. The adapter confirms the
  update to its platform only after it commits.
- tx 2, the turn commit (``Turns``): new messages, pruned rows, session row,
  inbox row ``done`` and the ledger obligation, written already claimed
  (``attempting``) by this process, in one transaction.
- then the send (``Outbox``), and ``mark_delivered`` / ``mark_failed``.
At start-up, once the adapters and the HTTP server are up, the ledger sweep
queues what a dead process owed and the inbox re-runs turns that never
committed, in the background (``ready`` turns true when that is done). With
several processes on PostgreSQL (``instances`` given) that takeover also runs
every few seconds, for the work of processes whose lease expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Sequence

from bot.config import Settings
from bot.core.approvals import APPROVAL_BUTTON_PREFIX
from bot.core.long_memory.tools import POLICY as MEMORY_POLICY
from bot.core.long_memory.tools import MemoryPolicy
from bot.core.models.routing import ModelSettings
from bot.core.runner import Runner
from bot.core.scheduling import POLICY as SCHEDULING_POLICY
from bot.core.scheduling import SchedulingPolicy
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.core.stores.sql import SQLSessionStore
from bot.core.voice import Voice
from bot.errors import ChatflowError, PlatformError, TapRefusedError
from bot.gateway.access.control import AccessControl, budget_notice
from bot.gateway.access.gate import Admission, Gate
from bot.gateway.accounting import TokenAccounting
from bot.gateway.aliases import ChatAliases
from bot.gateway.approvals.flow import APPROVAL_REF_PREFIX, ApprovalRow, Approvals
from bot.gateway.approvals.taps import Taps
from bot.gateway.contract import PlatformAdapter
from bot.gateway.dispatcher import DispatcherBusyError, SessionDispatcher
from bot.gateway.events import MessageEvent, encodable
from bot.gateway.inbox import Inbox, InboxEntry
from bot.gateway.instances import InstanceRegistry
from bot.gateway.keys import log_ref
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation, compute_obligation_id
from bot.gateway.media_fetch import build_media_fetcher
from bot.gateway.outbox import PRUNE_INTERVAL_SECONDS, Outbox
from bot.gateway.proactive.scheduler import Scheduler
from bot.gateway.proactive.windows import ContactWindows
from bot.gateway.replies import Replies
from bot.gateway.resume import Resumer, database_away
from bot.gateway.turns import Turns
from bot.gateway.voice_replies import build_voice_replies
from bot.metrics import Metrics
from bot.tracing import names, spans

__all__ = ["Gateway", "Replies"]

logger = logging.getLogger(__name__)

MAX_ACCEPT_FAILURES = 5
"""Times one message may fail tx 1 while the database answers, before it is dropped
as poison (logged) so the platform stops offering it and the chats behind it move."""
PING_TIMEOUT_SECONDS = 1.0
"""How long ``database_answers`` waits for the database."""
ADAPTER_START_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Seconds between tries to start an adapter whose platform was unreachable."""


class Gateway:
    """Joins platform adapters, the inbox, the Runner and the delivery ledger."""

    def __init__(
        self,
        runner: Runner,
        store: TransactionalStore,
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
        # Platforms that allow free-form replies only for a while after the person's
        # last message (WhatsApp: 24 h) learn that time from tx 1 of each message.
        windowed = [a for a in adapters if getattr(a, "service_window_seconds", None)]
        self.windows = ContactWindows(store, secret, platforms=[a.name for a in windowed])
        for adapter in windowed:
            adapter.windows = self.windows
        self._windowed = bool(windowed)
        self.inbox = Inbox(
            store,
            owner=None if owner is None else owner.instance_id,
            on_accept_in=self._on_accept_in,
        )
        # Button taps: resolved before tx 1, their keyboard marked used in it.
        self.taps = Taps(
            store,
            ttl_seconds=settings.button_ttl_seconds,
            inbox=self.inbox,
            metrics=self.metrics,
            secret=secret,
        )
        self.ledger = DeliveryLedger(
            store,
            owner=owner,
            liveness=None if instances is None else instances.is_alive,
            on_abandoned=lambda platform: self.metrics.abandoned.labels(platform).inc(),
        )
        self.aliases = ChatAliases(store)
        self._adapters = {a.name: a for a in adapters}
        self._receipts: dict[str, str] = {}  # platform: how it delivers ("webhook"/"poll")
        media = build_media_fetcher(settings)
        self.voice = build_voice_replies(
            ModelSettings.from_settings(settings),
            store,
            media.store,
            default=Voice(settings.voice_replies, settings.tts_voice, settings.tts_model),
            with_text=settings.voice_with_text,
            agents=runner.get_agent,
            timeout=settings.model_timeout_seconds,
            metrics=self.metrics,
        )
        housekeeping = (self.inbox.prune, media.store.prune, self.taps.prune)
        self.outbox = Outbox(self.ledger, self._adapters, self.metrics, housekeeping=housekeeping)
        self.turns = Turns(
            runner,
            store,
            self.inbox,
            self.ledger,
            self.outbox,
            self._adapters,
            self.replies,
            self.metrics,
            media=media,
            voice=self.voice,
        )
        self.scheduler = Scheduler(
            store,
            self.ledger,
            self.metrics,
            max_lateness=settings.schedule_max_lateness_seconds,
            on_fired=self._queue_sends,
            inbox=self.inbox,
            on_turns=self._queue_turns,
        )
        self.turns.on_scheduled = self.scheduler.wake
        # Gated tool calls: recorded in tx 2, decided by a tap, the console or the CLI.
        self.approvals = Approvals(
            store,
            self.inbox,
            runner,
            self.metrics,
            secret=secret,
            ttl_seconds=settings.approval_ttl_seconds,
        )
        self.approvals.on_turns = self._queue_turns
        self.turns.approvals = self.approvals
        self.turns.keyboard_owner = self.approvals.keyboard_owner_in
        self.approvals.send_details = self._send_details
        self.taps.intercept(APPROVAL_BUTTON_PREFIX, self.approvals.on_tap)
        runner.tool_services[SCHEDULING_POLICY] = SchedulingPolicy(
            settings.max_scheduled_per_chat,
            min_repeat_seconds=settings.min_repeat_seconds,
            timezone=settings.schedule_timezone,
        )
        runner.tool_services[MEMORY_POLICY] = MemoryPolicy(
            settings.max_memories_per_person,
            settings.max_memory_chars,
            settings.memory_prompt_chars,
        )
        self.turns.memory_secret = secret
        self.access = AccessControl(settings, self.turns, secret, self._queue_answers)
        # Token usage recorded with each turn; the daily budget judged with the rate limits.
        self.accounting = TokenAccounting(
            store,
            self.metrics,
            secret=secret,
            max_tokens_per_day=settings.max_tokens_per_sender_per_day,
        )
        self.turns.accounting = self.access.budget = self.accounting
        # Summaries are billed like turns: counted in /metrics as their call returns.
        runner.compactor.on_usage = self.accounting.count_one
        self.gate = Gate(settings, self.aliases, secret, pairing=self.access.pairing)
        # A job's owner is judged when it falls due: access now, and the budget its turn costs.
        self.scheduler.admit_owner = self.gate.admits_owner
        self.scheduler.accounting = self.accounting if self.accounting.budgeted else None
        self.scheduler.budget_notice = budget_notice
        # Unbounded on purpose: MAX_QUEUED_MESSAGES is applied in _on_event before
        # tx 1, since a message once accepted must be queued whatever happens.
        # Turns and owed replies share the per-session lanes: a reply owed from
        # before a restart goes out before the next turn of its conversation.
        self._dispatcher: SessionDispatcher[InboxEntry | Obligation] = SessionDispatcher(
            self._work,
            max_concurrent=settings.max_concurrent_turns,
        )
        # Work a database failure interrupted in this live process: resumed, not stranded.
        self.resumer = Resumer(
            self.inbox,
            self.ledger,
            self.outbox,
            instances,
            answers=self.database_answers,
            clock=lambda: store.now().timestamp(),
            submit_turn=self._submit_turn,
            queue_sends=self._queue_sends,
            holds=self._dispatcher.holds,
            freshness_seconds=settings.auto_continue_freshness_seconds,
        )
        self.turns.on_database_away = self.resumer.resume_when_back
        if instances is not None:
            self.outbox.fence = self.resumer.may_send
        self._queued_sends = 0
        self._admitting = 0
        self._admitted = asyncio.Event()
        self._admitted.set()
        self._accept_failures: dict[str, int] = {}
        # Accepted before recovery ended, in arrival order: turns, and the answers
        # given without one (a notice must not overtake the turn of an earlier message).
        self._early: list[InboxEntry | Obligation] = []
        self._starters: list[asyncio.Task[None]] = []
        self.metrics.queued.set_function(lambda: self._waiting_turns)
        self.metrics.turns_running.set_function(lambda: self.runner.turns_running)
        self.metrics.turns_waiting.set_function(lambda: self.runner.turns_waiting)
        sql_store = runner.store
        if isinstance(sql_store, SQLSessionStore):
            self.metrics.connection_waiters.set_function(lambda: sql_store.connection_waiters)
        self._ready = False
        self._ready_event = asyncio.Event()
        self._accepting = False
        self._stopping = asyncio.Event()
        self._retry_task: asyncio.Task[None] | None = None
        self._recovery_task: asyncio.Task[None] | None = None
        self._takeover_task: asyncio.Task[None] | None = None
        self._scheduler_task: asyncio.Task[None] | None = None
        self._approvals_task: asyncio.Task[None] | None = None

    @property
    def adapters(self) -> dict[str, PlatformAdapter]:
        """Adapters by platform name."""
        return dict(self._adapters)

    @property
    def ready(self) -> bool:
        """True once recovery is done and new traffic is being processed."""
        return self._ready

    async def wait_ready(self) -> None:
        """Return once recovery is done and new messages are being processed."""
        await self._ready_event.wait()

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Open the tables and start the adapters; recovery goes on in the background.

        Returns as soon as the adapters run, so the HTTP server (webhooks,
        ``/healthz``) can start at once; ``ready`` turns true once the replies a
        crash left are queued and interrupted turns are re-run. An adapter whose
        platform is unreachable is retried in the background while the others
        serve; a wrong setting (a non-retryable error) stops start-up.
        """
        await self.inbox.open()
        await self.ledger.open()
        await self.aliases.open()
        await self.voice.open()
        await self.access.open()
        await self.accounting.open()
        await self.scheduler.open()
        await self.approvals.open()
        if self.windows.platforms:
            await self.windows.open()
        self._accepting = True
        for adapter in self._adapters.values():
            if adapter.on_status_failed is None:
                adapter.on_status_failed = self.outbox.status_failed_handler(adapter.name)
            if not await self._start_adapter(adapter, first=True, retry_in=_backoff(0)):
                self._starters.append(asyncio.create_task(self._keep_starting(adapter)))
        self._recovery_task = asyncio.create_task(self._recover())

    async def _start_adapter(
        self, adapter: PlatformAdapter, *, retry_in: float, first: bool = False
    ) -> bool:
        try:
            await adapter.start(self._on_event)
        except PlatformError as exc:
            if not exc.retryable:
                raise
            logger.warning(
                "%s adapter could not start (%s); retrying in %.0f s", adapter.name, exc, retry_in
            )
            return False
        except ChatflowError:
            raise
        except Exception:
            logger.exception(
                "%s adapter failed to start; retrying in %.0f s", adapter.name, retry_in
            )
            return False
        if not first:
            logger.info("%s adapter started", adapter.name)
        return True

    async def _keep_starting(self, adapter: PlatformAdapter) -> None:
        for attempt in itertools.count():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), _backoff(attempt))
            if self._stopping.is_set():
                return
            try:
                if await self._start_adapter(adapter, retry_in=_backoff(attempt + 1)):
                    break
            except ChatflowError as exc:
                logger.error("%s adapter cannot start: %s", adapter.name, exc)
                return
        # Replies a dead process owed on this platform were left alone while it was down.
        if self._ready:
            self._queue_sends(
                await self.ledger.sweep_recoverable(
                    deliverable_platforms={adapter.name}, adopt_only=True
                )
            )

    def _queue_answers(self, owed: list[Obligation]) -> None:
        """Queue answers given without a turn behind the turns accepted before them."""
        if self._ready:
            self._queue_sends(owed)
        else:
            self._early.extend(owed)

    def _queue_turns(self, entries: list[InboxEntry]) -> None:
        """Queue turns journaled without an adapter (``run_agent`` jobs) in their lanes."""
        for entry in entries:
            if self._ready:
                self._dispatcher.submit(entry.session_id, entry.event.message_id, entry)
            else:
                self._early.append(entry)

    def _submit_turn(self, entry: InboxEntry) -> None:
        """Queue a turn in its conversation's lane (before recovery ends: with the rest)."""
        if self._ready:
            self._dispatcher.submit(entry.session_id, entry.event.message_id, entry)
        else:
            self._early.append(entry)

    def _queue_sends(self, owed: list[Obligation]) -> None:
        """Queue adopted rows in their conversations' lanes; each is claimed when its turn comes."""
        for obligation in owed:
            key = f"reply:{obligation.obligation_id}"
            if self._dispatcher.submit(obligation.session_id, key, obligation):
                self._queued_sends += 1

    async def _recover(self) -> None:
        """Queue what a crash left: owed replies first, then interrupted turns; then serve."""
        try:
            await self._queue_recovered()
        except Exception:
            # Serve anyway: what was not recovered stays in the tables for the next start.
            logger.exception("recovery at start-up failed; serving new messages")
            if not self._ready:
                self._serve([])

    async def _queue_recovered(self) -> None:
        connected = {name for name, a in self._adapters.items() if a.is_connected}
        owed = await self.ledger.sweep_recoverable(deliverable_platforms=connected, adopt_only=True)
        if owed:
            logger.info("resending %d replies owed from before the restart", len(owed))
        self._queue_sends(owed)
        left = await self.inbox.recover(
            self.settings.auto_continue_freshness_seconds,
            live_owners=await self._live_owners(),
            lasting=(APPROVAL_REF_PREFIX,),
        )
        # Read after recover() returns: a message accepted while it ran is in both lists,
        # and must run once, from _early.
        early = {e.event.message_id for e in self._early if isinstance(e, InboxEntry)}
        recovered = [entry for entry in left if entry.event.message_id not in early]
        recovered = await self.access.rescreen(recovered, self.gate.admit)
        if recovered:
            logger.info("re-running %d messages accepted before the restart", len(recovered))
        # Any message left by a crash may be what caused it. They run one at a time,
        # before anything else, each run counted first: a further crash is blamed on
        # one message only, and innocent ones are never given up.
        suspects = [e for e in recovered if not e.gave_up]
        rest = [e for e in recovered if e.gave_up]
        if suspects:
            await self._isolate_then_serve(suspects, rest)
        else:
            self._serve(rest)

    async def _isolate_then_serve(self, suspects: list[InboxEntry], rest: list[InboxEntry]) -> None:
        logger.info(
            "running %d message(s) interrupted by the last crash one at a time", len(suspects)
        )
        for entry in suspects:
            try:
                await self.turns.process(entry, alone=True)
            except Exception:
                logger.exception("re-running an interrupted message failed")
        self._serve(rest, already_run={e.event.message_id for e in suspects})

    def _serve(
        self, rest: list[InboxEntry], already_run: frozenset[str] | set[str] = frozenset()
    ) -> None:
        """Queue the recovered and early messages and start serving new ones."""
        for entry in rest:
            self._dispatcher.submit(entry.session_id, entry.event.message_id, entry)
        for item in self._early:
            if isinstance(item, Obligation):
                self._queue_sends([item])
            elif item.event.message_id not in already_run:
                self._dispatcher.submit(item.session_id, item.event.message_id, item)
        self._early.clear()
        self._ready = True
        self._ready_event.set()
        self._dispatcher.resume()
        self._retry_task = asyncio.create_task(self.outbox.run(self._stopping))
        self._scheduler_task = asyncio.create_task(self.scheduler.run(self._stopping))
        self._approvals_task = asyncio.create_task(self.approvals.run(self._stopping))
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
        wait = self.settings.shutdown_grace_seconds if grace is None else grace
        if self._recovery_task is not None:
            # Let recovery queue what it found (and what arrived meanwhile), so it is
            # drained below; past the grace it is cancelled and the next start resumes.
            await asyncio.wait({self._recovery_task}, timeout=wait)
        for task in (self._recovery_task, *self._starters):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        # An event past the _accepting check is finishing tx 1: let it reach the
        # queue, so it is drained with the rest (or left to recovery), never run later.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._admitted.wait(), wait)
        if not await self._dispatcher.drain(wait):
            logger.warning(
                "%d turns still running after %.0f s; they will be re-run at the next start",
                self._dispatcher.in_flight,
                wait,
            )
        await self._dispatcher.cancel()
        for adapter in self._adapters.values():
            try:
                await adapter.stop()
            except Exception as exc:
                logger.warning("%s adapter did not stop cleanly: %r", adapter.name, exc)
        with contextlib.suppress(Exception):
            await self.voice.aclose()
        await self.resumer.close()
        loops = (self._retry_task, self._takeover_task, self._scheduler_task, self._approvals_task)
        for loop_task in loops:
            if loop_task is not None:
                loop_task.cancel()
                await asyncio.gather(loop_task, return_exceptions=True)
        # The lanes are drained: commit their buffered delivered marks, then retry
        # whatever a storage failure kept out (that includes a failed flush).
        await self.ledger.flush()
        if await self.ledger.record_unrecorded():
            logger.warning(
                "%d send outcome(s) could not be recorded; those replies are resent with "
                "the marker at the next start",
                self.ledger.unrecorded,
            )

    # -- inbound -----------------------------------------------------------

    def session_key_for(self, event: MessageEvent) -> str:
        """The logical session key of an event (hashed ids, aliases applied)."""
        return self.gate.session_key_for(event)

    async def _on_event(self, event: MessageEvent) -> bool:
        """Adapter entry point: returns once the event is durably accepted or judged not ours."""
        event = encodable(event)
        platform = event.platform
        if not self._accepting:
            raise DispatcherBusyError("the bot is shutting down", retry_after=5.0)
        if event.migrate_from_chat_id is not None:
            await self.aliases.record(platform, event.source.chat_id, event.migrate_from_chat_id)
            return False
        if event.tap_token is not None and event.button is None:
            # A button tap: resolved (or refused) first, then on as the button's label.
            return await self.taps.handle(event, self._adapters.get(platform), self._on_event)
        admission = await self.gate.admit(event) if self.gate.addressed(event) else "ignore"
        if admission == "ignore":
            self.metrics.ignored.labels(platform).inc()
            return False
        if not (event.text.strip() or event.media_kind or event.media or event.command):
            self.metrics.ignored.labels(platform).inc()
            return False
        if not self._has_room():
            # Refuse before accepting: the platform keeps the message and offers it again.
            self.metrics.busy.labels(platform).inc()
            raise DispatcherBusyError("too many messages waiting", retry_after=5.0)
        # A tap goes to the conversation of the reply that carried its keyboard.
        session_key, session_id = self.taps.route(event) or self.gate.session_of(event)
        # The message's trace begins here (off: a no-op) and ends with its reply's send.
        with spans.span(
            names.RECEIVE, self._receipt(event, session_key), kind="server", root=True
        ) as receipt:
            return await self._admit(event, session_key, session_id, admission, receipt)

    def _receipt(self, event: MessageEvent, session_key: str) -> dict[str, spans.AttributeValue]:
        """The receive span's attributes (empty while tracing is off): the platform, how
        it delivered (an adapter with webhook routes: ``webhook``, else ``poll``), the
        conversation as a hash."""
        if not spans.enabled():
            return {}
        receipt = self._receipts.get(event.platform)
        if receipt is None:  # once a platform: an adapter's routes() builds its routes
            adapter = self._adapters.get(event.platform)
            receipt = "webhook" if adapter is not None and adapter.routes() else "poll"
            self._receipts[event.platform] = receipt
        return {
            names.PLATFORM: event.platform,
            "chatflow.receipt": receipt,
            names.CONVERSATION_ID: spans.conversation_id(session_key),
        }

    async def _admit(
        self,
        event: MessageEvent,
        session_key: str,
        session_id: str,
        admission: Admission,
        receipt: spans.SpanHandle,
    ) -> bool:
        """tx 1, then the entry queued (or answered by the access screen)."""
        # Hold a place in the queue from tx 1 until the entry is queued: other events
        # are admitted meanwhile, a message once accepted must never find the queue
        # full, and stop() waits for it.
        self._admitting += 1
        self._admitted.clear()
        try:
            with spans.span(names.TX1):
                accepted = await self._accept(event, session_key, session_id)
            if not accepted:
                receipt.set("chatflow.accepted", False)
                return False
            entry = InboxEntry(
                event=event,
                session_key=session_key,
                session_id=session_id,
                received_at=event.timestamp,
                attempts=0,
                trace=spans.capture(),
                queued_ns=time.time_ns() if spans.enabled() else 0,
            )
            if not await self.access.screen(entry, admission):
                return True  # journaled and answered (or closed) without a turn
            if self._ready:
                self._dispatcher.submit(session_id, event.message_id, entry)
            else:
                self._early.append(entry)
        finally:
            self._admitting -= 1
            if self._admitting == 0:
                self._admitted.set()
        return True

    async def _accept(self, event: MessageEvent, session_key: str, session_id: str) -> bool:
        """tx 1; False for a duplicate, or for a message that keeps failing it (poison)."""
        platform = event.platform
        try:
            accepted = await self.inbox.accept(
                event, session_key=session_key, session_id=session_id
            )
        except TapRefusedError:
            raise  # another tap used the keyboard first: refused, not a failure
        except Exception as exc:
            # The database away is no fault of the message: never counted as poison (its
            # fifth failure could land just as the database came back, and drop it).
            if database_away(exc) or not await self._is_poison(event.message_id):
                raise
            self.metrics.ignored.labels(platform).inc()
            logger.error(
                "%s message %s failed to be accepted %d times while the database works; "
                "dropped so the messages behind it can be answered (%s)",
                platform,
                log_ref(event.message_id),
                MAX_ACCEPT_FAILURES,
                type(exc).__name__,
            )
            return False
        self._accept_failures.pop(event.message_id, None)
        if not accepted:
            self.metrics.dedup_hits.labels(platform).inc()
            logger.info("duplicate %s message dropped (session %s)", platform, session_id)
            return False
        self.metrics.count_in(platform)
        return True

    async def _send_details(self, row: ApprovalRow, text: str) -> None:
        """Owe ``text`` (an approval's whole call) to its chat through the ledger and send
        it now; once per approval and text (a second tap finds it recorded)."""
        message_ref = f"approval-details:{row.approval_id}"
        obligation = Obligation.owed(
            obligation_id=compute_obligation_id(row.session_key, message_ref, text),
            session_key=row.session_key,
            session_id=row.session_id,
            platform=row.platform,
            chat_id=row.chat_id,
            thread_id=row.thread_id,
            reply_to=None,
            content=text,
            message_ref=message_ref,
        )

        async def owe(tx: Transaction) -> bool:
            return await self.ledger.record_in(tx, obligation, claimed=True)

        if await self.store.run(owe):
            await self.outbox.send(obligation.claimed())

    async def _on_accept_in(self, tx: Transaction, event: MessageEvent) -> None:
        """In tx 1 of every accepted message: the contact window, the tapped keyboard."""
        if self._windowed:
            await self.windows.record_in(tx, event)
        await self.taps.accept_in(tx, event)

    async def _is_poison(self, message_id: str) -> bool:
        """Count a failed tx 1; True once it failed ``MAX_ACCEPT_FAILURES`` times and the
        database itself answers (so the message, not an outage, is the cause)."""
        failures = self._accept_failures.get(message_id, 0) + 1
        if len(self._accept_failures) > 10_000:  # bounded: a burst of distinct failures
            self._accept_failures.clear()
        self._accept_failures[message_id] = failures
        if failures < MAX_ACCEPT_FAILURES or not await self.database_answers():
            return False
        del self._accept_failures[message_id]
        return True

    async def database_answers(self) -> bool:
        """Whether the store answers a read (no write lock taken) within a second."""
        try:
            async with asyncio.timeout(PING_TIMEOUT_SECONDS):
                await self.store.ping()
        except (ChatflowError, OSError, TimeoutError):
            return False
        return True

    @property
    def _waiting_turns(self) -> int:
        """Accepted messages waiting for a worker (owed replies queued are not counted)."""
        return self._dispatcher.queued - self._queued_sends + len(self._early)

    def _has_room(self) -> bool:
        """Whether one more message may be accepted under ``MAX_QUEUED_MESSAGES``."""
        waiting = self._waiting_turns + self._admitting
        return waiting < self.settings.max_queued_messages

    # -- one turn ----------------------------------------------------------

    async def _work(self, item: InboxEntry | Obligation) -> None:
        if isinstance(item, Obligation):
            self._queued_sends -= 1
            # A lane's task keeps the context it was started in (maybe some message's
            # trace): an owed reply queued here is traced on its own, linked to its owner.
            with spans.detached():
                claimed = await self.ledger.claim(item)
                if claimed is not None:
                    await self.outbox.send(claimed)
            return
        if not spans.enabled():
            await self.turns.process(item)  # (no span: nothing to name or link)
            return
        if item.trace is None:
            # Recovered from the journal, scheduled or continued after an approval: its
            # own trace, linked to the span that owed it where one was stored.
            name = names.TURN_RECOVERED
            if item.event.message_id.startswith(APPROVAL_REF_PREFIX):
                name = names.CONTINUATION
            elif item.event.scheduled:
                name = names.SCHEDULED
            attributes = {
                names.PLATFORM: item.event.platform,
                names.CONVERSATION_ID: spans.conversation_id(item.session_key),
            }
            with spans.span(name, attributes, root=True, link=item.link):
                await self.turns.process(item)
            return
        if item.queued_ns:
            spans.start(names.QUEUE, parent=item.trace, start_ns=item.queued_ns).end()
        with spans.resume(item.trace):
            await self.turns.process(item)

    # -- outbound ----------------------------------------------------------

    async def retry_due(self, *, sweep: bool = False) -> int:
        """Send the failed replies whose retry is due (and, with ``sweep``, adopt
        rows re-queued by the operator or left by a dead process); returns how many."""
        return await self.outbox.retry_due(sweep=sweep)

    # -- several processes (PostgreSQL) ---------------------------------------

    async def _live_owners(self) -> set[str] | None:
        """Instance ids with a valid lease (``None`` without a registry: take every row)."""
        return None if self.instances is None else await self.instances.live_ids()

    async def take_over(self) -> int:
        """Resend replies and re-run turns that processes with an expired lease left behind.

        Safe at any time and in every process at once: each row is claimed by
        one of them. Returns how many replies and messages this process took.
        Nothing is taken while this process may not (its lease lapsed, or within the
        grace after an outage: the others renew theirs first); the expired owners'
        database sessions are ended first (their locks go with them), and the replies
        taken go through their conversations' lanes, behind the turns queued there.
        """
        if self.instances is not None:
            if not self.instances.may_take_over():
                return 0
            try:
                await self.instances.end_backends_of_expired()
            except ChatflowError as exc:
                logger.warning("could not end the sessions of expired processes (%s)", exc)
        connected = {n for n, a in self._adapters.items() if a.is_connected}
        owed = await self.ledger.sweep_recoverable(deliverable_platforms=connected, adopt_only=True)
        self._queue_sends(owed)
        live = await self._live_owners()
        recovered = await self.inbox.recover(
            self.settings.auto_continue_freshness_seconds,
            live_owners=live if live is not None else {self.inbox.owner},
            lasting=(APPROVAL_REF_PREFIX,),
        )
        recovered = await self.access.rescreen(recovered, self.gate.admit)
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
                # This process's own work a database failure left undone.
                await self.resumer.reconcile(self.instances.lease_seconds)
                await self.aliases.reload()  # other processes record chat migrations too
                if loop.time() >= next_prune:
                    next_prune = loop.time() + PRUNE_INTERVAL_SECONDS
                    await self.instances.prune()
            except Exception:
                logger.exception("taking over work of stopped processes failed; trying again")


def _backoff(attempt: int) -> float:
    """Seconds before start attempt ``attempt + 1`` of an unreachable platform."""
    return ADAPTER_START_BACKOFF[min(attempt, len(ADAPTER_START_BACKOFF) - 1)]
