"""The approvals table (``chatflow_approvals``) and the one rule that decides a row.

A decision is one transaction: an UPDATE guarded by ``state = 'pending'`` and the
journaling of the continuation turn in the inbox (id ``approval:<id>``), so of
several deciders exactly one changes the row, and a crash after the commit leaves
the turn to the inbox's recovery. ``bot.gateway.approvals.flow`` is the service around it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from bot.core.approvals import PendingApproval
from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore
from bot.gateway.contract import ChatType, MessageEvent, SessionSource
from bot.gateway.inbox import Inbox, InboxEntry
from bot.gateway.instances import from_epoch

__all__ = [
    "APPROVAL_REF_PREFIX",
    "COMPONENT",
    "MARKERS",
    "MIGRATIONS",
    "OPERATOR_OWNER",
    "TABLE",
    "ApprovalRow",
    "ApprovalState",
    "DecideOutcome",
    "approval_rows",
    "decide",
    "ensure_approvals_schema_in",
    "find_approval",
    "operator_decide",
    "read_approval_in",
]

logger = logging.getLogger(__name__)

TABLE: Final = "chatflow_approvals"
"""One row per tool call that waited (or waits) for approval."""
COMPONENT: Final = "approvals"
"""The table's row in ``chatflow_schema_versions``."""
MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {TABLE} ("
        "id TEXT PRIMARY KEY NOT NULL, "
        "session_key TEXT NOT NULL, "
        "session_id TEXT NOT NULL, "
        "platform TEXT NOT NULL, "
        "chat_id TEXT NOT NULL, "
        "thread_id TEXT, "
        "sender_ref TEXT NOT NULL, "
        "agent TEXT NOT NULL, "
        "tool_name TEXT NOT NULL, "
        "call_id TEXT NOT NULL, "
        "arguments_json TEXT NOT NULL, "
        "state TEXT NOT NULL CHECK (state IN "
        "('pending', 'approved', 'running', 'done', 'denied', 'expired')), "
        "decided_by TEXT, "
        "created_at REAL NOT NULL, "
        "expires_at REAL NOT NULL, "
        "decided_at REAL, "
        "started_at REAL, "
        "finished_at REAL)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_state ON {TABLE} (state, expires_at)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_session ON {TABLE} (session_id, state)",
    ),
    # 2: what the approved tool returned, kept with the row once it ran (G6 of the
    # 2026-12-07 review: a failed answer after the tool forgot that it ran).
    2: (f"ALTER TABLE {TABLE} ADD COLUMN result_text TEXT",),
    # 3: the trace context of the turn that asked (tracing on); NULL before it.
    3: (f"ALTER TABLE {TABLE} ADD COLUMN traceparent TEXT",),
}
"""``MIGRATIONS[v]`` moves the table from version ``v - 1`` to ``v`` (SQLite DDL)."""

ApprovalState = Literal["pending", "approved", "running", "done", "denied", "expired"]
DecideOutcome = Literal["approved", "denied", "expired", "unknown", "decided"]
"""What ``decide`` did: ``approved``/``denied`` decided it now, ``expired`` found it past
its time (and expired it), ``unknown`` no such approval, ``decided`` it was decided before."""

APPROVAL_REF_PREFIX: Final = "approval:"
"""Inbox id prefix of a continuation turn: ``approval:<id>`` (a replay is a duplicate)."""
OPERATOR_OWNER: Final = "operator-command"
"""Inbox owner of continuations journaled by ``python -m bot approvals``: a running bot
adopts them (``Approvals.adopt_operator_decisions``)."""
MARKERS: Final[Mapping[str, str]] = {
    "approved": "[Approval granted]",
    "denied": "[Approval denied]",
    "expired": "[Approval expired]",
}
"""The text of a continuation's synthetic message, by how the approval was decided."""

_COLUMNS: Final = (
    "id, session_key, session_id, platform, chat_id, thread_id, sender_ref, agent, "
    "tool_name, call_id, arguments_json, state, decided_by, created_at, expires_at, "
    "result_text, traceparent"
)


async def ensure_approvals_schema_in(tx: Transaction) -> None:
    """Create or migrate the approvals table inside ``tx``."""
    await ensure_schema(tx, COMPONENT, MIGRATIONS)


@dataclass(frozen=True, slots=True)
class ApprovalRow:
    """One approval as stored."""

    approval_id: str
    session_key: str
    session_id: str
    platform: str
    chat_id: str
    thread_id: str | None
    sender_ref: str
    """Keyed hash of the sender who started the turn (``user_<12hex>``)."""
    agent: str
    tool_name: str
    call_id: str
    arguments: dict[str, Any]
    state: ApprovalState
    decided_by: str | None
    created_at: datetime
    expires_at: datetime
    result: str | None = None
    """What the tool returned (the text the model read), once an approved call ran."""
    traceparent: str | None = None
    """The asking turn's span (tracing on): the continuation's trace links to it."""

    @property
    def pending(self) -> PendingApproval:
        """The call, as the Runner resumes it."""
        return PendingApproval(
            approval_id=self.approval_id,
            tool_name=self.tool_name,
            call_id=self.call_id,
            arguments=self.arguments,
            agent=self.agent,
            result=self.result,
        )

    def arguments_text(self) -> str:
        """The whole arguments, as indented JSON (for a person to read all of them)."""
        return json.dumps(self.arguments, ensure_ascii=False, indent=2, sort_keys=True)

    def describe(self) -> str:
        """The approval in full, for the operator (``python -m bot approvals show``)."""

        def when(moment: datetime) -> str:
            return moment.isoformat(timespec="seconds").replace("+00:00", "Z")

        lines = [
            f"approval {self.approval_id}: {self.state}"
            + (f" (by the {self.decided_by})" if self.decided_by else ""),
            f"call: {self.agent}: {self.tool_name}",
            f"conversation: {self.platform} {self.session_id}",
            f"asked {when(self.created_at)}, expires {when(self.expires_at)}",
            "arguments:",
            self.arguments_text(),
        ]
        if self.result is not None:
            lines += ["result:", self.result]
        return "\n".join(lines)


def _row(values: tuple[Any, ...]) -> ApprovalRow:
    (aid, key, sid, platform, chat, thread, sender, agent, tool_name, call_id, args, state) = (
        values[:12]
    )
    decided_by, created_at, expires_at, result, traceparent = values[12:17]
    return ApprovalRow(
        approval_id=str(aid),
        session_key=str(key),
        session_id=str(sid),
        platform=str(platform),
        chat_id=str(chat),
        thread_id=None if thread is None else str(thread),
        sender_ref=str(sender),
        agent=str(agent),
        tool_name=str(tool_name),
        call_id=str(call_id),
        arguments=json.loads(str(args)),
        state=state,
        decided_by=None if decided_by is None else str(decided_by),
        created_at=datetime.fromtimestamp(float(created_at), UTC),
        expires_at=datetime.fromtimestamp(float(expires_at), UTC),
        result=None if result is None else str(result),
        traceparent=None if traceparent is None else str(traceparent),
    )


async def read_approval_in(tx: Transaction, approval_id: str) -> ApprovalRow | None:
    """The approval ``approval_id`` as stored, ``None`` when unknown."""
    row = await tx.fetchone(f"SELECT {_COLUMNS} FROM {TABLE} WHERE id = ?", (approval_id,))
    return None if row is None else _row(row)


async def find_approval(store: TransactionalStore, approval_id: str) -> ApprovalRow | None:
    """The approval ``approval_id`` in any state, ``None`` when unknown."""

    async def body(tx: Transaction) -> ApprovalRow | None:
        await ensure_approvals_schema_in(tx)  # a database no bot has run on yet
        return await read_approval_in(tx, approval_id)

    return await store.run(body)


async def approval_rows(
    store: TransactionalStore, *, states: tuple[ApprovalState, ...] = ("pending",)
) -> list[ApprovalRow]:
    """Approvals in ``states`` (default: those waiting), oldest first."""

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        await ensure_approvals_schema_in(tx)  # a database no bot has run on yet
        marks = ", ".join("?" * len(states))
        return await tx.fetchall(
            f"SELECT {_COLUMNS} FROM {TABLE} WHERE state IN ({marks}) ORDER BY created_at, id",
            states,
        )

    return [_row(values) for values in await store.run(body)]


def _chat_type(session_key: str) -> ChatType:
    """The chat type a session key was built for (``agent:main:<platform>:<type>:...``)."""
    parts = session_key.split(":")
    kind = parts[3] if len(parts) > 3 else ""
    return "group" if kind == "group" else "channel" if kind == "channel" else "dm"


def _continuation(row: ApprovalRow, outcome: str, now: float) -> InboxEntry:
    """The turn a decision owes, in the approval's own session: nobody wrote it, so the
    chat stands in for the sender (as for a scheduled turn)."""
    received_at = from_epoch(now)
    event = MessageEvent(
        platform=row.platform,
        message_id=f"{APPROVAL_REF_PREFIX}{row.approval_id}",
        source=SessionSource(
            platform=row.platform,
            chat_id=row.chat_id,
            chat_type=_chat_type(row.session_key),
            sender_id=row.chat_id,
            thread_id=row.thread_id,
        ),
        text=MARKERS[outcome],
        timestamp=received_at,
        scheduled=True,
    )
    return InboxEntry(
        event=event,
        session_key=row.session_key,
        session_id=row.session_id,
        received_at=received_at,
        attempts=0,
        link=row.traceparent,
    )


async def decide(
    store: TransactionalStore,
    inbox: Inbox,
    approval_id: str,
    choice: Literal["approve", "deny", "expire"],
    *,
    by: Literal["user", "operator", "timer"],
    now: float,
) -> tuple[DecideOutcome, InboxEntry | None]:
    """Decide ``approval_id`` once, journaling its continuation turn in the same transaction.

    The UPDATE is guarded by ``state = 'pending'`` (and, for a yes or a no, by the
    expiry time): whoever loses a race gets ``"decided"``, and a decision after the
    expiry time expires the approval instead. Returns the outcome and, when this
    call decided, the inbox entry to queue.
    """

    async def body(tx: Transaction) -> tuple[DecideOutcome, InboxEntry | None]:
        await ensure_approvals_schema_in(tx)
        outcome: DecideOutcome
        if choice == "expire":
            changed = await tx.execute(
                f"UPDATE {TABLE} SET state = 'expired', decided_by = ?, decided_at = ? "
                "WHERE id = ? AND state = 'pending'",
                (by, now, approval_id),
            )
            outcome = "expired"
        else:
            outcome = "approved" if choice == "approve" else "denied"
            changed = await tx.execute(
                f"UPDATE {TABLE} SET state = ?, decided_by = ?, decided_at = ? "
                "WHERE id = ? AND state = 'pending' AND expires_at > ?",
                (outcome, by, now, approval_id, now),
            )
            if changed == 0:
                # Past its time but not yet expired by the timer: expire it now.
                changed = await tx.execute(
                    f"UPDATE {TABLE} SET state = 'expired', decided_by = 'timer', "
                    "decided_at = ? WHERE id = ? AND state = 'pending'",
                    (now, approval_id),
                )
                outcome = "expired"
        row = await read_approval_in(tx, approval_id)
        if row is None:
            return "unknown", None
        if changed != 1:
            return "decided", None
        entry = _continuation(row, outcome, now)
        accepted = await inbox.accept_in(
            tx, entry.event, session_key=entry.session_key, session_id=entry.session_id
        )
        return outcome, entry if accepted else None

    outcome, entry = await store.run(body)
    if entry is not None:
        logger.info("approval %s %s by the %s", approval_id, outcome, by)
    return outcome, entry


async def operator_decide(
    store: TransactionalStore, approval_id: str, choice: Literal["approve", "deny"]
) -> DecideOutcome:
    """The operator's decision from outside the bot (``python -m bot approvals``).

    The continuation is journaled for a bot to run: a running one adopts it within
    ``POLL_SECONDS`` (``Approvals.adopt_operator_decisions``), a stopped one runs it at
    its next start (the inbox's recovery).
    """
    inbox = Inbox(store, owner=OPERATOR_OWNER)
    outcome, _ = await decide(
        store, inbox, approval_id, choice, by="operator", now=store.now().timestamp()
    )
    return outcome
