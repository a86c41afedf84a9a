"""The gateway's token accounting: each turn's model calls recorded, and the daily budget.

Recording. A turn's calls (its chat calls, and the transcriptions of its voice
notes) are written to ``chatflow_usage`` (``bot.core.usage``) inside the turn's
tx 2, so a committed turn has its tokens. A turn that fails rolls back its
history, but the provider billed the calls it made: those are written in a
small transaction of their own once the turn has ended (``record_lost``), unless
the inbox says the turn committed after all (a shutdown's cancellation that
arrived while tx 2 landed), so no call is counted twice. The
``/metrics`` counters are added once per turn, whatever its outcome.

Budget. With ``MAX_TOKENS_PER_SENDER_PER_DAY`` set, access control asks
``budget_in`` before a message starts a turn: the sender's prompt plus
completion tokens of the current UTC day, summed from the usage table (so
every process on one PostgreSQL database sees the same sum). A sender at or
over the budget gets no turn, like a rate-limited message: the message is
journaled and closed, not added to the history. The first such message of the
day earns one short notice (``budget_notice``, in ``bot.gateway.access.control``)
through the ledger, decided by an insert into ``chatflow_budget_notices`` keyed
by (sender, day): exactly one process wins it, and later messages that day get
nothing. The budget is checked before a
turn, not during one, so the turn that crosses it finishes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore
from bot.core.usage import (
    CallUsage,
    ensure_usage_schema_in,
    record_usage_in,
    sender_tokens_on,
    usage_day,
)
from bot.errors import ChatflowError
from bot.gateway.access.rate_limits import sender_digest
from bot.gateway.contract import MessageEvent
from bot.gateway.inbox import Inbox
from bot.metrics import Metrics

__all__ = ["BudgetVerdict", "TokenAccounting"]

logger = logging.getLogger(__name__)

_COMPONENT: Final = "budget_notices"
_NOTICES: Final = "chatflow_budget_notices"
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {_NOTICES} ("
        "sender TEXT NOT NULL, "
        "day TEXT NOT NULL, "
        "created_at REAL NOT NULL, "
        "PRIMARY KEY (sender, day))",
    ),
}
_KEEP_NOTICE_DAYS: Final = 3


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """What the budget says about one message."""

    over: bool
    """The sender is at or over the budget: no turn."""
    notice: bool
    """The first message over it today: the sender is told, once."""
    spent: int
    """Tokens the sender cost today, before this message."""


class TokenAccounting:
    """Records turns' usage and judges the per-sender daily budget, in the store's database."""

    def __init__(
        self,
        store: TransactionalStore,
        metrics: Metrics,
        *,
        secret: bytes,
        max_tokens_per_day: int | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        if max_tokens_per_day is not None and max_tokens_per_day <= 0:
            raise ValueError("max_tokens_per_day must be positive")
        self._store = store
        self._metrics = metrics
        self._secret = secret
        self.max_tokens_per_day = max_tokens_per_day
        self._clock = clock or store.now
        self._schema_ready = False  # the usage table made sure of by ``open``

    @property
    def budgeted(self) -> bool:
        """Whether a daily budget is set."""
        return self.max_tokens_per_day is not None

    def now(self) -> datetime:
        """The accounting clock (the store's, or the one given: tests move it)."""
        return self._clock()

    async def open(self) -> None:
        """Create or migrate the usage table (and the notices table with a budget)."""

        async def body(tx: Transaction) -> None:
            await ensure_usage_schema_in(tx)
            if self.budgeted:
                await ensure_schema(tx, _COMPONENT, _MIGRATIONS)

        await self._store.run(body)
        self._schema_ready = True

    def sender_key(self, event: MessageEvent) -> str | None:
        """The sender as the usage table stores it (an HMAC digest, as access control
        stores senders). A scheduled ``run_agent`` turn is charged to the person who
        scheduled it (``scheduled_by``); other scheduled turns to nobody."""
        if event.scheduled:
            return event.scheduled_by
        if not event.source.sender_id:
            return None
        return sender_digest(event.platform, event.source.sender_id, self._secret)

    async def record_in(
        self,
        tx: Transaction,
        session_id: str,
        event: MessageEvent,
        calls: Sequence[CallUsage],
    ) -> None:
        """Record ``calls`` inside ``tx`` (the turn's tx 2)."""
        sender = self.sender_key(event)
        at = self.now()
        for call in calls:
            await record_usage_in(
                tx,
                session_id=session_id,
                agent=call.agent,
                kind=call.kind,
                model=call.model,
                usage=call.usage,
                sender=sender,
                at=at,
                schema_ready=self._schema_ready,
            )

    async def record_lost(
        self,
        session_id: str,
        event: MessageEvent,
        calls: Sequence[CallUsage],
        *,
        inbox: Inbox | None = None,
    ) -> None:
        """Record the calls of a turn that did not commit, in a transaction of their own.

        With ``inbox``, nothing is recorded if the turn committed after all (a
        cancellation that arrived while its commit landed): its tx 2 has the rows.
        A storage failure is logged, not raised: the user's answer matters more.
        """
        if not calls:
            return

        async def body(tx: Transaction) -> None:
            if inbox is not None and await inbox.committed_in(tx, event.message_id):
                return
            await self.record_in(tx, session_id, event, calls)

        try:
            await self._store.run(body)
        except ChatflowError as exc:
            logger.warning(
                "usage of a failed turn in session %s not recorded (%s)",
                session_id,
                type(exc).__name__,
            )

    def count(self, calls: Sequence[CallUsage]) -> None:
        """Add ``calls`` to the ``/metrics`` token counters (once per call, after the turn)."""
        for call in calls:
            self._metrics.count_tokens(call.agent, call.kind, call.usage)

    def count_one(self, call: CallUsage) -> None:
        """Add one call made outside a turn (a compaction) to the ``/metrics`` counters."""
        self._metrics.count_tokens(call.agent, call.kind, call.usage)

    async def budget_in(self, tx: Transaction, event: MessageEvent) -> BudgetVerdict:
        """Judge ``event``'s sender against the daily budget inside ``tx``."""
        return await self.sender_budget_in(tx, self.sender_key(event))

    async def sender_budget_in(self, tx: Transaction, sender: str | None) -> BudgetVerdict:
        """Judge ``sender`` (a ``sender_key``) against the daily budget inside ``tx``: a
        message of theirs, or a ``run_agent`` job they scheduled falling due."""
        if self.max_tokens_per_day is None or sender is None:
            return BudgetVerdict(over=False, notice=False, spent=0)
        moment = self.now()
        day = usage_day(moment)
        spent = await sender_tokens_on(tx, sender, day)
        if spent < self.max_tokens_per_day:
            return BudgetVerdict(over=False, notice=False, spent=spent)
        # One row per sender and day: the insert that adds it earns the notice, in
        # whichever process runs it first; every later message that day conflicts.
        added = await tx.execute(
            f"INSERT INTO {_NOTICES} (sender, day, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT(sender, day) DO NOTHING",
            (sender, day, moment.timestamp()),
        )
        if added > 0:
            # Old days' rows are worth nothing: dropped here, once per notice given.
            await tx.execute(
                f"DELETE FROM {_NOTICES} WHERE day < ?",
                (usage_day(moment - timedelta(days=_KEEP_NOTICE_DAYS)),),
            )
        return BudgetVerdict(over=True, notice=added > 0, spent=spent)
