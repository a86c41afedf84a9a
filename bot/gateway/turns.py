"""One inbound message, one committed turn (or a fixed answer), one owed reply.

A message with attachments first goes through the media step (``MediaFetcher``:
download, check, transcribe, read), still before tx 2; what could not be used
is said at the start of the reply.

The turn's reply is recorded in the turn's own transaction (tx 2), already
claimed by this process, then handed to the ``Outbox``. A turn that fails is
rolled back by the Runner and answered with the apology through the same
path, so the user is never left in silence.

A conversation under human takeover (``bot.gateway.takeover``) starts no
turn: its message is kept in the history for the person who answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from bot.core.attachments import OutgoingPart
from bot.core.buttons import Button
from bot.core.compactor import CompactionOutcome
from bot.core.human_handoff import requested_human
from bot.core.long_memory.records import apply_memory_in
from bot.core.long_memory.scope import speaking_as
from bot.core.runner import Runner, RunResult
from bot.core.scheduling import JobRoute, apply_in
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.core.usage import CallUsage
from bot.errors import ChatflowError
from bot.gateway.accounting import TokenAccounting
from bot.gateway.approvals.flow import Approvals
from bot.gateway.approvals.taps import tap_text
from bot.gateway.contract import MessageEvent, PlatformAdapter
from bot.gateway.dispatcher import release_slot
from bot.gateway.inbox import GAVE_UP_ERROR, Inbox, InboxClaimLostError, InboxEntry
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.keyboards import new_keyboard, set_owner_in
from bot.gateway.ledger.obligations import Obligation, compute_obligation_id
from bot.gateway.media_fetch import MediaFetcher, PreparedMedia
from bot.gateway.memory_scope import scope_for
from bot.gateway.outbox import Outbox
from bot.gateway.proactive.jobs import cancel_jobs
from bot.gateway.replies import Replies
from bot.gateway.reply_context import reply_context, with_reply_context
from bot.gateway.resume import database_away
from bot.gateway.streaming import open_drafts, stop_drafts
from bot.gateway.takeover import TakenOverError, Takeovers
from bot.gateway.voice_replies import VoiceReplies
from bot.metrics import Metrics
from bot.tracing import spans

__all__ = ["MAX_INBOUND_CHARS", "TYPING_DELAY", "TYPING_INTERVAL", "Turns", "failure_cause"]

logger = logging.getLogger(__name__)

TYPING_INTERVAL = 4.0
"""Seconds between typing indications (Telegram's indicator fades after ~5 s)."""
TYPING_DELAY = 0.3
"""A turn shows "typing" once it has run this long: a faster answer is on screen
before an indicator would be, so it costs no platform call and no task."""
MAX_INBOUND_CHARS = 16_000
"""Longer inbound texts are refused with a short answer instead of reaching the model."""


def failure_cause(exc: BaseException) -> str:
    """What failed, for a log line, with no text in it: the error's class, the provider's
    HTTP status, and the innermost cause (``ModelError, HTTP 401``, ``ModelError,
    ConnectError``). The error's message may quote a provider's answer: never logged."""
    parts = [type(exc).__name__]
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        parts.append(f"HTTP {status}")
    inner: BaseException = exc
    for _ in range(8):  # a cause chain is short; a cycle is not followed for ever
        if inner.__cause__ is None:
            break
        inner = inner.__cause__
    if inner is not exc:
        parts.append(type(inner).__name__)
    return ", ".join(parts)


class Turns:
    """Runs the turn of an accepted message and hands its reply to the outbox."""

    def __init__(
        self,
        runner: Runner,
        store: TransactionalStore,
        inbox: Inbox,
        ledger: DeliveryLedger,
        outbox: Outbox,
        adapters: Mapping[str, PlatformAdapter],
        replies: Replies,
        metrics: Metrics,
        media: MediaFetcher | None = None,
        takeovers: Takeovers | None = None,
        voice: VoiceReplies | None = None,
    ) -> None:
        self.on_scheduled: Callable[[], None] | None = None
        """Called after a turn committed new scheduled jobs (the gateway wakes its scheduler)."""
        self.accounting: TokenAccounting | None = None
        """Records each turn's model calls (tx 2, or apart when the turn fails); the gateway
        sets it."""
        self.approvals: Approvals | None = None
        """Records pending approvals in tx 2 and runs decided ones' turns; the gateway sets it."""
        self.memory_secret: bytes | None = None
        """Keys the hashes of a turn's memory scope (``bot.gateway.memory_scope``); without
        it (the gateway sets it) turns have no memory."""
        self.keyboard_owner: Callable[[Transaction, InboxEntry], Awaitable[str | None]] | None = (
            None
        )
        """``(tx, entry) -> owner_ref``: whose keyboard a reply to ``entry`` carries (the
        gateway sets it; ``None``: keyboards have no owner)."""
        self.on_database_away: Callable[[InboxEntry, Obligation | None], None] | None = None
        """Called instead of an apology when a turn (or a fixed answer) failed because the
        database was away, with the reply it was committing if any: the gateway resumes it
        once the database is back (``bot.gateway.resume``)."""
        self.runner = runner
        self.store = store
        self.inbox = inbox
        self.ledger = ledger
        self.outbox = outbox
        self._adapters = adapters
        self.replies = replies
        self.metrics = metrics
        self.media = media
        if media is not None and outbox.media is None:
            outbox.media = media.store  # replies' files are read back from the same store
        self.voice = voice
        if voice is not None and outbox.voice is None:
            outbox.voice = voice  # replies spoken here are sent there
        # Read by the operator console too (bot.console): one copy per process.
        self.takeovers = takeovers if takeovers is not None else Takeovers(store)
        # Turns that may still be stopped for a takeover: until their commit begins.
        self._stoppable: dict[str, asyncio.Task[object]] = {}
        self._stopped: set[asyncio.Task[object]] = set()
        self.takeovers.on_take_over(self._stop_for_takeover)

    def _stop_for_takeover(self, session_id: str) -> None:
        """A person took ``session_id`` over: stop its bot turn if it has not begun to
        commit (one that has is decided by ``check_in`` in its commit)."""
        task = self._stoppable.pop(session_id, None)
        if task is not None:
            self._stopped.add(task)
            task.cancel()

    async def process(self, entry: InboxEntry, *, alone: bool = False) -> None:
        event = entry.event
        continues = self.approvals is not None and self.approvals.continues(entry)
        if not continues and await self.takeovers.is_taken_over(entry.session_id):
            # (A decided approval still runs: its person or operator already answered.)
            # A person answers here: journaled, kept in the history, no turn (also for
            # messages queued or recovered from before the takeover began).
            await self.takeovers.record_inbound(entry, self.inbox, self.runner.starting_agent)
            return
        if entry.gave_up:
            # It crashed the process again and again while running alone: the user is
            # told, instead of being left without an answer (or crashing us forever).
            await self._answer_without_turn(entry, self.replies.apology, error=GAVE_UP_ERROR)
            return
        if alone:
            await self.inbox.mark_started_alone(event.message_id)
        command = event.command
        if command == "compact":
            await self._compact(entry)
            return
        if command in ("start", "help", "reset"):
            agent = self.runner.starting_agent.name
            cancelled = 0
            if command == "reset":
                await self.store.delete(entry.session_id)
                # "Forget this conversation": the reminders set in it go too.
                cancelled = await cancel_jobs(self.store, session_id=entry.session_id, why="/reset")
            elif command == "start":
                # A handoff may have moved the conversation: greet as the one who holds it.
                agent = await self._active_agent_name(entry.session_id)
            text = {
                "start": self.replies.greeting.format(agent=agent),
                "help": self.replies.help,
                "reset": self.replies.reset,
            }[command]
            if cancelled:
                text += " " + self.replies.reset_jobs.format(count=cancelled)
            await self._answer_without_turn(entry, text, agent=agent)
            return
        if len(event.text) > MAX_INBOUND_CHARS:
            await self._answer_without_turn(entry, self.replies.too_long, error="message too long")
            return
        if event.media:
            # The media step: after tx 1, before the turn. A crash in it leaves the
            # inbox row 'received', so the next start runs it again from the journal.
            typing = _Typing(self._adapters.get(event.platform), event)
            try:
                prepared = await self._prepare_media(entry)
            finally:
                typing.stop()
            if await self.takeovers.is_taken_over(entry.session_id):
                # A person stepped in while the files were read (no turn ran yet).
                await self.takeovers.record_inbound(entry, self.inbox, self.runner.starting_agent)
                if self.accounting is not None:  # the transcriptions were billed all the same
                    heard = self._heard(prepared, self.runner.starting_agent.name)
                    self.accounting.count(heard)
                    await self.accounting.record_lost(entry.session_id, event, heard)
                return
            if not event.text.strip() and not prepared.parts:
                notice = " ".join(prepared.notices) or self.replies.media_only
                await self._answer_without_turn(entry, notice)
                return
            await self._run_turn(entry, prepared)
            return
        if not event.text.strip():
            await self._answer_without_turn(entry, self.replies.media_only)
            return
        await self._run_turn(entry)

    async def _prepare_media(self, entry: InboxEntry) -> PreparedMedia:
        if self.media is None:
            return PreparedMedia(notices=(self.replies.media_only,))
        return await self.media.prepare(entry.event, self._adapters.get(entry.event.platform))

    async def _run_turn(self, entry: InboxEntry, media: PreparedMedia | None = None) -> None:
        event = entry.event
        adapter = self._adapters.get(event.platform)
        obligation: list[Obligation] = []
        media = media or PreparedMedia()
        handed: list[str] = []  # taken over in tx 2 (transfer_to_human)
        scheduled: list[int] = []
        task: asyncio.Task[object] | None = asyncio.current_task()
        calls: list[CallUsage] = []  # the turn's model calls, as each returns
        committed = False
        secret = self.memory_secret
        scope = None if secret is None else scope_for(event, secret)

        def spent() -> list[CallUsage]:
            """Every billed call of the turn: its transcriptions, then its model calls."""
            agent = calls[0].agent if calls else self.runner.starting_agent.name
            return self._heard(media, agent) + calls

        async def commit(result: RunResult, tx: Transaction) -> None:
            # From here a takeover no longer stops the turn: check_in decides, and a
            # cancellation now would leave the commit's outcome unknown.
            self._stoppable.pop(entry.session_id, None)
            await self.takeovers.check_in(tx, entry.session_id)
            if self.accounting is not None:
                await self.accounting.record_in(tx, entry.session_id, event, spent())
            content = result.content
            if media.notices:
                # What could not be used is said first, in the same reply (one obligation).
                content = "\n".join(media.notices) + "\n\n" + content
            if adapter is not None:
                content = adapter.format_reply(content, result.agent)
            recorded = await self._record(
                tx,
                entry,
                content,
                files=result.attachments,
                buttons=result.buttons,
                anyone_may_tap=result.anyone_may_tap,
            )
            if recorded is not None:
                obligation.append(recorded)
            await self.inbox.mark_done_in(tx, event.message_id)
            if self.approvals is not None:  # the approval asked for, or the one continued
                await self.approvals.record_in(tx, entry, result)
            if result.effects:  # most turns ask for none: no route, no clock read
                # The route is the inbound message's, never the model's: a job goes back
                # to the chat (and topic) it was scheduled from.
                route = JobRoute(
                    entry.session_key,
                    entry.session_id,
                    event.platform,
                    event.source.chat_id,
                    event.source.thread_id,
                    # Who asked: their jobs' turns are charged to them, revoking them stops them.
                    sender=None if self.accounting is None else self.accounting.sender_key(event),
                    traceparent=spans.traceparent(),  # tx 2's span: each firing links to it
                )
                now = self.store.now().timestamp()
                added, _ = await apply_in(tx, result.effects, route, now)
                scheduled.append(added)
                # In the scope of the inbound message, never one the model named.
                await apply_memory_in(tx, result.effects, scope, entry.session_id, now)
            person = requested_human(result.new_messages, self.runner.get_agent)
            if person is not None:
                await self.takeovers.take_over_in(tx, entry.session_id, person)
                handed.append(entry.session_id)

        metadata = {
            "platform": event.platform,
            "chat_type": event.source.chat_type,
            "session_key": entry.session_key,
            "inbound_message_id": event.message_id,
            # The names the platform gave, for the console's list (never logged); a
            # name left out keeps the one stored before.
            **{
                key: name
                for key, name in (
                    ("chat_name", event.source.chat_name),
                    ("sender_name", event.source.sender_name),
                )
                if name
            },
        }
        speak = None
        if self.voice is not None:
            voice = self.voice

            async def speak(result: RunResult) -> RunResult:
                # The answer is final and tx 2 not yet open: synthesis may take seconds.
                return await voice.speak(event, media.parts, result, adapter)

        typing = _Typing(adapter, event)
        drafts = open_drafts(adapter, event, self.runner.stream_replies)  # previews only
        loop = asyncio.get_running_loop()
        started = loop.time()
        if task is not None:
            self._stoppable[entry.session_id] = task
        try:
            context = await reply_context(event, self.ledger, self.inbox)
            text = with_reply_context(tap_text(event), context)
            run: Callable[..., Awaitable[RunResult]] = self.runner.run_async
            if self.approvals is not None and self.approvals.continues(entry):
                run = self.approvals.continuation(entry)  # a decided approval's turn
            with speaking_as(scope):
                result = await run(
                    entry.session_id,
                    text,
                    metadata,
                    on_commit=commit,
                    parts=media.parts,
                    stream=drafts,
                    before_commit=speak,
                    calls=calls,
                )
            committed = True
            if self.approvals is not None:
                self.approvals.committed(result)
        except asyncio.CancelledError:
            if task is None or task not in self._stopped or task.uncancel() > 0:
                raise  # a stop of the gateway, not (only) a takeover
            # Stopped for a takeover before its commit began: nothing was committed
            # (a commit that raced it met check_in and rolled back).
            stop_drafts(drafts)
            logger.info("turn in session %s stopped: a person took over", entry.session_id)
            await self.takeovers.record_inbound(entry, self.inbox, self.runner.starting_agent)
            return
        except InboxClaimLostError:
            # Our lease lapsed and another process answers this message: nothing to send.
            logger.info("turn in session %s discarded: taken over elsewhere", entry.session_id)
            return
        except TakenOverError:
            stop_drafts(drafts)
            await self.takeovers.record_inbound(entry, self.inbox, self.runner.starting_agent)
            return
        except ChatflowError as exc:
            stop_drafts(drafts)  # the apology supersedes a half-written draft
            if self._resumed_later(entry, exc, obligation[0] if obligation else None):
                return
            self.metrics.turns.labels("failed").inc()
            logger.warning(
                "turn failed in session %s (%s); sending an apology",
                entry.session_id,
                failure_cause(exc),
            )
            await self._answer_without_turn(entry, self.replies.apology, error=type(exc).__name__)
            return
        finally:
            if self._stoppable.get(entry.session_id) is task:
                del self._stoppable[entry.session_id]
            if task is not None:
                self._stopped.discard(task)
            typing.stop()
            stop_drafts(drafts)  # before the final is sent: a draft never races it
            self.metrics.turn_duration.observe(loop.time() - started)
            if self.accounting is not None:
                billed = spent()
                self.accounting.count(billed)
                if not committed:  # rolled back, but the provider billed the calls
                    await self.accounting.record_lost(
                        entry.session_id, event, billed, inbox=self.inbox
                    )
        self.metrics.turns.labels("ok").inc()
        # Committed: the send waits on the platform's pace, not on a turn slot (the
        # lane keeps the conversation's order; the ledger row keeps the reply owed).
        release_slot()
        for session_id in handed:
            self.takeovers.note(session_id)
            logger.info("session %s handed to a person by its agent", session_id)
        if any(scheduled) and self.on_scheduled is not None:
            self.on_scheduled()
        for item in obligation:
            await self.outbox.send(item)

    async def _compact(self, entry: InboxEntry) -> None:
        """``/compact``: summarise the conversation now, then say how it went (a fixed
        answer through the ledger, like ``/reset``'s)."""
        outcome = await self.runner.compact(entry.session_id)
        text = {
            CompactionOutcome.COMPACTED: self.replies.compacted,
            CompactionOutcome.FAILED: self.replies.compact_failed,
        }.get(outcome, self.replies.compact_nothing)
        agent = await self._active_agent_name(entry.session_id)
        await self._answer_without_turn(entry, text, agent=agent)

    def _heard(self, media: PreparedMedia, agent: str) -> list[CallUsage]:
        """The transcription calls of the media step that reported usage, as ``agent``'s."""
        model = (self.media.transcription_model if self.media else "") or None
        return [CallUsage("transcription", model, agent, usage) for usage in media.transcriptions]

    async def _active_agent_name(self, session_id: str) -> str:
        """The agent holding ``session_id``: the starting agent for a new conversation,
        one on an agent that no longer exists, or one that cannot be read now."""
        try:
            session = await self.store.get(session_id)
        except ChatflowError as exc:
            logger.warning(
                "could not read session %s for its agent (%s)", session_id, type(exc).__name__
            )
            session = None
        if session is not None and self.runner.get_agent(session.active_agent.name) is not None:
            return session.active_agent.name
        return self.runner.starting_agent.name

    async def _answer_without_turn(
        self, entry: InboxEntry, text: str, *, error: str | None = None, agent: str | None = None
    ) -> None:
        """Record a fixed answer and close the inbox row in one transaction, then send it
        (labelled, where the channel shows labels, as ``agent``; the starting agent by default)."""
        adapter = self._adapters.get(entry.event.platform)
        if adapter is not None:
            text = adapter.format_reply(text, agent or self.runner.starting_agent.name)

        recorded: list[Obligation] = []
        owing = spans.traceparent()  # read here: the store may run the body elsewhere

        async def body(tx: Transaction) -> Obligation | None:
            obligation = await self._record(tx, entry, text, traceparent=owing)
            if obligation is not None:
                recorded.append(obligation)
            await self.inbox.mark_done_in(tx, entry.event.message_id, error=error)
            return obligation

        try:
            obligation = await self.store.run(body)
        except InboxClaimLostError:
            logger.info("answer in session %s dropped: taken over elsewhere", entry.session_id)
            return
        except ChatflowError as exc:
            if self._resumed_later(entry, exc, recorded[-1] if recorded else None):
                return
            # The inbox row stays 'received': the next start-up answers it.
            logger.exception("could not record an answer for session %s", entry.session_id)
            return
        if obligation is not None:
            release_slot()
            await self.outbox.send(obligation)

    def _resumed_later(
        self, entry: InboxEntry, exc: BaseException, owed: Obligation | None
    ) -> bool:
        """Hand ``entry`` to ``on_database_away`` when ``exc`` says the database was away
        (no apology for a fault that may heal in a second); ``False`` otherwise."""
        if self.on_database_away is None or not database_away(exc):
            return False
        logger.warning(
            "turn in session %s interrupted: the database is away (%s); resumed once it is back",
            entry.session_id,
            type(exc).__name__,
        )
        self.on_database_away(entry, owed)
        return True

    async def close_in(
        self, tx: Transaction, entry: InboxEntry, text: str | None, *, error: str
    ) -> Obligation | None:
        """Close ``entry``'s inbox row in ``tx`` without a turn, owing ``text`` if given.

        The answer is recorded ``pending`` (not claimed): the caller queues it in
        the conversation's lane, where it is claimed and sent like an adopted row.
        """
        await self.inbox.mark_done_in(tx, entry.event.message_id, error=error)
        if text is None:
            return None
        # Not through format_reply: no agent ran, so none may seem to speak (the console
        # would print "[Triage] This assistant is private ...").
        return await self._record(tx, entry, text, claimed=False)

    async def _record(
        self,
        tx: Transaction,
        entry: InboxEntry,
        content: str,
        *,
        claimed: bool = True,
        files: Sequence[OutgoingPart] = (),
        buttons: Sequence[Button] = (),
        anyone_may_tap: bool = False,
        traceparent: str | None = None,
    ) -> Obligation | None:
        """Record the reply owed, claimed by this process (sent right after the commit);
        with ``claimed=False`` it is recorded ``pending``, for a lane to claim.

        ``None`` when the ledger already holds this very reply: its own row is
        delivered or on its way, so it is not sent again from here.
        """
        event = entry.event
        keyboard = new_keyboard(buttons)  # fresh tokens; kept only if the row is new
        obligation = Obligation.owed(
            obligation_id=compute_obligation_id(
                entry.session_key, event.message_id, content, files, keyboard
            ),
            session_key=entry.session_key,
            session_id=entry.session_id,
            platform=event.platform,
            chat_id=event.source.chat_id,
            thread_id=event.source.thread_id,
            reply_to=event.platform_message_id,
            content=content,
            message_ref=event.message_id,
            attachments=tuple(files),
            buttons=keyboard,
            traceparent=traceparent,
        )
        if not await self.ledger.record_in(tx, obligation, claimed=claimed):
            return None
        if keyboard:
            # The keyboard belongs to the person the turn answered (see bot.gateway.approvals.taps).
            owner = None if self.keyboard_owner is None else await self.keyboard_owner(tx, entry)
            await set_owner_in(tx, obligation.obligation_id, owner, anyone=anyone_may_tap)
        return obligation.claimed() if claimed else obligation


class _Typing:
    """ "typing" from ``TYPING_DELAY`` into a turn until ``stop``, every ``TYPING_INTERVAL``."""

    __slots__ = ("_adapter", "_event", "_handle", "_task")

    def __init__(self, adapter: PlatformAdapter | None, event: MessageEvent) -> None:
        self._adapter = adapter
        self._event = event
        self._task: asyncio.Task[None] | None = None
        self._handle: asyncio.TimerHandle | None = None
        if adapter is not None:
            self._handle = asyncio.get_running_loop().call_later(TYPING_DELAY, self._begin)

    def _begin(self) -> None:
        self._handle = None
        self._task = asyncio.get_running_loop().create_task(self._keep_typing())

    async def _keep_typing(self) -> None:
        assert self._adapter is not None
        while True:
            with contextlib.suppress(Exception):
                await self._adapter.indicate_typing(self._event)
            await asyncio.sleep(TYPING_INTERVAL)

    def stop(self) -> None:
        """No more indications (a call in flight is cancelled)."""
        if self._handle is not None:
            self._handle.cancel()
        if self._task is not None:
            self._task.cancel()
