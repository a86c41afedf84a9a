"""Approvals: a gated tool call waits in ``chatflow_approvals`` for a person's yes.

The path (see docs/ARCHITECTURE.md, "Approvals"):

1. A turn whose model called a gated tool ends with ``RunResult.pending_approval``;
   its tx 2 records the question (the reply, with Approve / Deny buttons) and the
   row here, ``pending`` (``record_in``), so both survive a crash.
2. A decision is one guarded UPDATE ``pending -> approved | denied`` (or, past
   ``APPROVAL_TTL_SECONDS``, ``-> expired``), in a transaction that also journals
   the continuation turn in the inbox, id ``approval:<id>``: of two taps, two
   operators or two processes exactly one decides, and a crash after the commit
   leaves the turn to the inbox's recovery. Only the sender who started the turn
   decides from the chat (``on_tap``); the operator decides from the console or
   ``python -m bot approvals``.
3. The continuation turn (``resume``) first moves ``approved -> running`` in its
   own committed transaction, then runs the tool. Once the tool returned, the
   call and its result join the history in a commit of their own, which also
   moves the row ``running -> done`` with the result kept (``result_text``);
   then the model is asked. A failing model call rolls back only its answer: the
   history and the row still say the tool ran, and a retry needs a new approval
   to run it again. Finding ``running`` means a process died while the tool
   ran: the tool is not run again, the model hears that the outcome is unknown.
   Finding ``done`` with a result (a process died after that commit) asks the
   model again with the kept result.

The table and the decision rule are in ``bot.gateway.approvals.table`` (re-exported
here). Rows hold the raw chat id (the continuation's reply needs it, like the
ledger's) but only the keyed hash of the requesting sender.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal

from bot.core.approvals import ApprovalDecision, details_text, parse_approval_button
from bot.core.buttons import Button
from bot.core.runner import Runner, RunResult
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.core.waiting import wait_any
from bot.errors import ApprovalError
from bot.gateway.approvals.table import (
    APPROVAL_REF_PREFIX,
    MARKERS,
    OPERATOR_OWNER,
    TABLE,
    ApprovalRow,
    DecideOutcome,
    approval_rows,
    decide,
    ensure_approvals_schema_in,
    find_approval,
    operator_decide,
    read_approval_in,
)
from bot.gateway.approvals.taps import FAILED_NOTICE, NOT_YOURS, TapInfo, TapOutcome
from bot.gateway.contract import MessageEvent
from bot.gateway.inbox import Inbox, InboxEntry
from bot.gateway.keys import hash_sender_id
from bot.gateway.ledger.keyboards import find_button_in
from bot.metrics import Metrics
from bot.tracing import spans

__all__ = [
    "APPROVAL_REF_PREFIX",
    "DEFAULT_TTL_SECONDS",
    "DETAILS_SENT",
    "DONE_BEFORE",
    "EXPIRED_NOTICE",
    "NOT_YOURS",
    "OPERATOR_OWNER",
    "POLL_SECONDS",
    "TABLE",
    "ApprovalRow",
    "Approvals",
    "DecideOutcome",
    "approval_rows",
    "decide",
    "ensure_approvals_schema_in",
    "find_approval",
    "operator_decide",
]

logger = logging.getLogger(__name__)

DEFAULT_TTL_SECONDS: Final = 3600.0
POLL_SECONDS: Final = 5.0
"""Longest wait between two looks for expired approvals and operator decisions."""

DONE_BEFORE: Final = "This was already answered."
DETAILS_SENT: Final = "The whole request is in the chat now."
EXPIRED_NOTICE: Final = "This request has expired."
_NOTICES: Final[Mapping[DecideOutcome, str]] = {
    "approved": "Approved.",
    "denied": "Denied.",
    "expired": EXPIRED_NOTICE,
    "unknown": EXPIRED_NOTICE,
    "decided": DONE_BEFORE,
}
_OUTCOMES: Final = {marker: outcome for outcome, marker in MARKERS.items()}


class Approvals:
    """Records pending approvals, decides them, expires them and resumes their turns."""

    def __init__(
        self,
        store: TransactionalStore,
        inbox: Inbox,
        runner: Runner,
        metrics: Metrics,
        *,
        secret: bytes,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        """``ttl_seconds``: ``APPROVAL_TTL_SECONDS``."""
        self._store = store
        self._inbox = inbox
        self._runner = runner
        self._metrics = metrics
        self._secret = secret
        self.ttl_seconds = ttl_seconds
        self.poll_seconds = poll_seconds
        self.on_turns: Callable[[list[InboxEntry]], None] | None = None
        """Queues continuation turns (the gateway's lanes); set before ``run``."""
        self.send_details: Callable[[ApprovalRow, str], Awaitable[None]] | None = None
        """Owes the whole call (the Details button's message) to the approval's chat,
        through the delivery ledger; the gateway sets it."""
        self._wake = asyncio.Event()

    def now(self) -> float:
        return self._store.now().timestamp()

    async def open(self) -> None:
        """Create or migrate the table (at start, before the bot is ready)."""
        await self._store.run(ensure_approvals_schema_in)

    # -- the pausing turn ------------------------------------------------------

    @staticmethod
    def continues(entry: InboxEntry) -> bool:
        """Whether ``entry`` is a continuation turn (journaled by a decision)."""
        event = entry.event
        return event.scheduled and event.message_id.startswith(APPROVAL_REF_PREFIX)

    async def record_in(self, tx: Transaction, entry: InboxEntry, result: RunResult) -> None:
        """In a turn's tx 2: close the approval it continued, record the one it asks for."""
        continued = self.continues(entry)
        approval_id = entry.event.message_id[len(APPROVAL_REF_PREFIX) :]
        if continued:
            await tx.execute(
                f"UPDATE {TABLE} SET state = 'done', finished_at = ? "
                "WHERE id = ? AND state = 'running'",
                (self.now(), approval_id),
            )
        pending = result.pending_approval
        if pending is None:
            return
        sender_ref = await self.requester_in(tx, entry)
        now = self.now()
        event = entry.event
        await tx.execute(
            f"INSERT INTO {TABLE} (id, session_key, session_id, platform, chat_id, thread_id, "
            "sender_ref, agent, tool_name, call_id, arguments_json, state, created_at, "
            "expires_at, traceparent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?)",
            (
                pending.approval_id,
                entry.session_key,
                entry.session_id,
                event.platform,
                event.source.chat_id,
                event.source.thread_id,
                sender_ref,
                pending.agent,
                pending.tool_name,
                pending.call_id,
                pending.arguments_json(),
                now,
                now + self.ttl_seconds,
                spans.traceparent(),  # tx 2's span: the continuation's trace links to it
            ),
        )

    async def keyboard_owner_in(self, tx: Transaction, entry: InboxEntry) -> str | None:
        """Whose keyboard a reply to ``entry`` carries: the person its turn answered;
        ``None`` for a scheduled turn's (the chat stands in for its sender) and in a
        channel (a post's sender is the channel: any subscriber may tap)."""
        if entry.event.source.chat_type == "channel":
            return None
        if entry.event.scheduled and not self.continues(entry):
            return None
        return await self.requester_in(tx, entry)

    async def requester_in(self, tx: Transaction, entry: InboxEntry) -> str:
        """The keyed hash of the person ``entry``'s turn answers: who may approve what it
        asks, and whose keyboard its reply carries.

        A continuation answers the person who asked first; a tap on a keyboard any
        member may use (a poll) answers the person the keyboard was sent to, so the
        conversation's owner stays its approver; any other turn its sender.
        """
        event = entry.event
        if self.continues(entry):
            parent = await read_approval_in(tx, event.message_id[len(APPROVAL_REF_PREFIX) :])
            if parent is not None:
                return parent.sender_ref
        if event.button is not None and event.tap_token:
            keyboard = await find_button_in(tx, event.tap_token)
            if keyboard is not None and keyboard.owner_ref is not None:
                return keyboard.owner_ref
        return hash_sender_id(event.source.sender_id, self._secret)

    def committed(self, result: RunResult) -> None:
        """After a turn's commit: count the approval it asked for (a rolled-back tx 2
        asked for none) and let the timer learn its expiry."""
        if result.pending_approval is None:
            return
        self._metrics.approvals.labels("requested").inc()
        self._wake.set()

    # -- decisions ---------------------------------------------------------------

    async def decide(
        self,
        approval_id: str,
        choice: Literal["approve", "deny"],
        *,
        by: Literal["user", "operator"],
    ) -> DecideOutcome:
        """Decide in this process (a tap, the console) and queue the continuation here."""
        outcome, entry = await decide(
            self._store, self._inbox, approval_id, choice, by=by, now=self.now()
        )
        self._decided(outcome, entry)
        return outcome

    def _decided(self, outcome: DecideOutcome, entry: InboxEntry | None) -> None:
        if entry is None:
            return
        self._metrics.approvals.labels(outcome).inc()
        if self.on_turns is not None:
            self.on_turns([entry])

    async def on_tap(self, event: MessageEvent, button: Button, info: TapInfo) -> TapOutcome:
        """The Approve / Deny buttons' interceptor (``Taps.intercept``)."""
        parsed = parse_approval_button(button.effective_value)
        if parsed is None:
            return TapOutcome(consumed=True, notice=EXPIRED_NOTICE)
        approval_id, choice = parsed

        async def read(tx: Transaction) -> ApprovalRow | None:
            return await read_approval_in(tx, approval_id)

        row = await self._store.run(read, write=False)
        if row is None or row.session_id != info.session_id:
            return TapOutcome(consumed=True, notice=EXPIRED_NOTICE)
        if hash_sender_id(event.source.sender_id, self._secret) != row.sender_ref:
            # Another member of the group: nothing changes, the buttons stay usable.
            return TapOutcome(consumed=False, notice=NOT_YOURS)
        if row.state != "pending":  # decided before (a keyboard shown twice, say)
            late = EXPIRED_NOTICE if row.state == "expired" else DONE_BEFORE
            return TapOutcome(consumed=True, notice=late)
        if choice == "details":
            # The whole call, as a message to the person deciding; the keyboard stays.
            if self.send_details is None:
                return TapOutcome(consumed=False, notice=FAILED_NOTICE)
            await self.send_details(row, details_text(row.tool_name, row.arguments))
            return TapOutcome(consumed=False, notice=DETAILS_SENT)
        outcome = await self.decide(approval_id, choice, by="user")
        return TapOutcome(consumed=True, notice=_NOTICES[outcome])

    # -- the continuation turn -----------------------------------------------------

    def continuation(self, entry: InboxEntry) -> Callable[..., Awaitable[RunResult]]:
        """``Runner.run_async``'s stand-in for ``entry``'s turn (the text and parts of the
        synthetic message are not the person's: nothing of them joins the history)."""

        async def run(
            session_id: str,
            user_message: str,
            metadata: Mapping[str, Any] | None = None,
            *,
            parts: object = (),
            **options: Any,
        ) -> RunResult:
            return await self.resume(entry, metadata or {}, **options)

        return run

    async def resume(
        self, entry: InboxEntry, metadata: Mapping[str, Any], **options: Any
    ) -> RunResult:
        """Run the continuation turn of ``entry`` (``Runner.resume_async``; ``options``
        are its ``on_commit``, ``stream``...). An approved call is claimed ``running``
        in its own transaction first, so it runs at most once."""
        approval_id = entry.event.message_id[len(APPROVAL_REF_PREFIX) :]
        row, decision = await self._claim(approval_id)
        logger.info("approval %s resumes (%s)", approval_id, decision)
        return await self._runner.resume_async(
            entry.session_id,
            row.pending,
            decision,
            metadata,
            inbound_message_id=entry.event.message_id,
            on_ran=functools.partial(self._ran_in, approval_id),
            **options,
        )

    async def _ran_in(self, approval_id: str, tx: Transaction, result: str) -> None:
        """In the commit of the approved call and its result: the row is ``done``, with
        what the tool returned (a failing answer after it no longer hides that it ran)."""
        await tx.execute(
            f"UPDATE {TABLE} SET state = 'done', finished_at = ?, result_text = ? "
            "WHERE id = ? AND state = 'running'",
            (self.now(), result, approval_id),
        )

    async def _claim(self, approval_id: str) -> tuple[ApprovalRow, ApprovalDecision]:
        now = self.now()

        async def body(tx: Transaction) -> tuple[ApprovalRow | None, int]:
            changed = await tx.execute(
                f"UPDATE {TABLE} SET state = 'running', started_at = ? "
                "WHERE id = ? AND state = 'approved'",
                (now, approval_id),
            )
            return await read_approval_in(tx, approval_id), changed

        row, changed = await self._store.run(body)
        if row is None:
            raise ApprovalError(f"approval {approval_id} is unknown")
        if changed == 1:
            return row, "approved"
        if row.state == "running":
            logger.warning(
                "approval %s was running when a process stopped: not run again", approval_id
            )
            return row, "unknown"
        if row.state in ("denied", "expired"):
            return row, "denied" if row.state == "denied" else "expired"
        if row.state == "done" and row.result is not None:
            # It ran and its result was committed, then the turn stopped (a crash):
            # the model is asked again with that result, nothing runs twice.
            return row, "ran"
        raise ApprovalError(f"approval {approval_id} is {row.state}: nothing to resume")

    # -- the timer ------------------------------------------------------------------

    async def expire_due(self) -> int:
        """Expire every pending approval past its time; returns how many this process did."""

        async def due(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(
                f"SELECT id FROM {TABLE} WHERE state = 'pending' AND expires_at <= ? "
                "ORDER BY expires_at, id",
                (self.now(),),
            )

        entries: list[InboxEntry] = []
        for (approval_id,) in await self._store.run(due, write=False):
            outcome, entry = await decide(
                self._store, self._inbox, str(approval_id), "expire", by="timer", now=self.now()
            )
            if entry is not None:
                self._metrics.approvals.labels(outcome).inc()
                entries.append(entry)
        if entries and self.on_turns is not None:
            self.on_turns(entries)
        return len(entries)

    async def adopt_operator_decisions(self) -> int:
        """Queue continuations that ``python -m bot approvals`` journaled (no bot ran
        them): each is taken by one process (a guarded change of the inbox row's owner)."""
        entries = await self._inbox.adopt(OPERATOR_OWNER, APPROVAL_REF_PREFIX)
        for entry in entries:
            self._metrics.approvals.labels(_OUTCOMES.get(entry.event.text, "approved")).inc()
        if entries and self.on_turns is not None:
            self.on_turns(entries)
        return len(entries)

    async def next_expiry(self) -> float | None:
        """The earliest expiry time of a pending approval, ``None`` with none."""

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(f"SELECT MIN(expires_at) FROM {TABLE} WHERE state = 'pending'")

        row = await self._store.run(body, write=False)
        return None if row is None or row[0] is None else float(row[0])

    async def run(self, stopping: asyncio.Event) -> None:
        """Expire approvals as they fall due and adopt operator decisions until ``stopping``."""
        while not stopping.is_set():
            self._wake.clear()
            wait = self.poll_seconds
            try:
                await self.expire_due()
                await self.adopt_operator_decisions()
                next_at = await self.next_expiry()
                if next_at is not None:
                    wait = min(wait, max(0.0, next_at - self.now()))
            except Exception:
                logger.exception("the approvals timer failed; trying again later")
            await wait_any(wait, stopping, self._wake)
