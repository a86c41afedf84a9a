"""What every part of the delivery ledger shares: the store, the owner, the schema, fencing.

``LedgerBase`` holds the state of a ``DeliveryLedger`` (``bot.gateway.ledger``);
the ledger's behaviour lives in mixins built on it, one concept each. Nothing
here decides a row's state; the buffer of delivered marks lives here because
every part flushes it before it reads or claims rows (``SendMarks`` writes it).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeVar

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, TransactionBody, require_transactional
from bot.errors import StorageError
from bot.gateway.instances import (
    Owner,
    OwnerLiveness,
    ensure_instances_schema,
    is_owner_alive,
    lease_liveness,
    to_epoch,
)
from bot.gateway.ledger.obligations import MIGRATIONS

__all__ = ["STORAGE_ERRORS", "DeliveredMark", "LedgerBase"]

# One logger for every ledger module: operators filter on this name.
logger = logging.getLogger("bot.gateway.ledger")

_COMPONENT: Final = "delivery_ledger"

_T = TypeVar("_T")

STORAGE_ERRORS: Final = (StorageError, sqlite3.Error)
"""Storage failures swallowed by the best-effort methods (the store translates
sqlite3 errors into ``StorageError``; the second is belt and braces)."""


@dataclass(slots=True)
class DeliveredMark:
    """A successful send waiting for the next group commit of delivered marks."""

    obligation_id: str
    message_ids: list[str]
    platform: str | None
    check: bool
    """Look the row up in the commit: to learn its platform, or for a caller that waits
    to know whether the row exists."""


class _Round:
    """The marks one commit writes; ``done`` resolves after it, ``written`` names the rows."""

    __slots__ = ("done", "marks", "written")

    def __init__(self) -> None:
        self.marks: dict[str, DeliveredMark] = {}
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.written: set[str] = set()


class LedgerBase:
    """The ledger's store, owner and liveness, and the helpers all its parts use."""

    def __init__(
        self,
        store: TransactionalStore,
        *,
        clock: Callable[[], datetime] | None = None,
        owner: Owner | None = None,
        liveness: OwnerLiveness | None = None,
        on_abandoned: Callable[[str], None] | None = None,
    ) -> None:
        """``on_abandoned(platform)`` is called for every row this ledger abandons."""
        self._store = store = require_transactional(store, "the delivery ledger")
        self._on_abandoned = on_abandoned
        # Outcomes of sends that a storage failure kept out of the ledger, retried
        # by ``record_unrecorded``; the rows stay 'attempting' meanwhile, so a
        # crash before they land resends with the marker.
        self._unrecorded: dict[str, Callable[[], Awaitable[bool]]] = {}
        # Group commit of delivered marks: ``_queued`` fills while ``_writing`` commits;
        # one flusher task writes rounds back to back while any are queued (no timer).
        self._queued: _Round | None = None
        self._writing: _Round | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._clock = clock or store.now
        self._owner = owner or Owner.current()
        self._opened = False
        # PostgreSQL: owners hold leases, and updates around a send are fenced by owner.
        self._fenced = store.dialect == "postgres"
        if liveness is None and self._fenced:
            liveness = lease_liveness(store)
        self._liveness = liveness

    @property
    def owner(self) -> Owner:
        """The owner stamped on rows this ledger records or claims."""
        return self._owner

    async def open(self) -> None:
        """Create or migrate the ledger tables; idempotent."""
        async with self._store.transaction() as tx:
            await ensure_schema(tx, _COMPONENT, MIGRATIONS)
            if self._fenced:
                await ensure_instances_schema(tx)  # leases decide who is alive
        self._opened = True

    async def _ensure_open_in(self, tx: Transaction) -> None:
        # Not marked open here: the caller's transaction may still roll back.
        if not self._opened:
            await ensure_schema(tx, _COMPONENT, MIGRATIONS)
            if self._fenced:
                await ensure_instances_schema(tx)

    @asynccontextmanager
    async def _tx(self) -> AsyncIterator[Transaction]:
        """A store transaction, the tables created first if ``open`` was not called."""
        if not self._opened:
            await self.open()
        async with self._store.transaction() as tx:
            yield tx

    async def _run(self, body: TransactionBody[_T], *, write: bool = True) -> _T:
        """``store.run(body)``, the tables created first if ``open`` was not called.

        One call on the database thread (it joins the group commit), where a
        ``_tx()`` block costs a round trip per statement: the body may await
        only ``tx``'s methods.
        """
        if not self._opened:
            await self.open()
        return await self._store.run(body, write=write)

    def _now(self, now: datetime | None = None) -> float:
        return to_epoch(now if now is not None else self._clock())

    async def _is_alive(self, owner: Owner) -> bool:
        if owner.pid == self._owner.pid and owner.instance_id == self._owner.instance_id:
            return True
        if self._liveness is not None:
            return await self._liveness(owner)
        return is_owner_alive(owner)

    def _fence(self) -> tuple[str, tuple[str, ...]]:
        """WHERE clause (and parameter) that keeps an update to our own rows on PostgreSQL."""
        if self._fenced:
            return " AND owner_instance = ?", (self._owner.instance_id,)
        return "", ()

    def _abandoned(self, platform: str) -> None:
        if self._on_abandoned is not None:
            self._on_abandoned(platform)

    def _log_storage_failure(self, what: str, obligation_id: str, exc: BaseException) -> None:
        logger.error(
            "delivery ledger could not %s obligation %s (%s: %s); the reply is not held up",
            what,
            obligation_id,
            type(exc).__name__,
            exc,
        )

    # -- group commit of delivered marks ------------------------------------------------

    def _queue_delivered(self, mark: DeliveredMark) -> _Round:
        """Buffer ``mark`` for the next commit (started at once if none is writing)."""
        round_ = self._queued
        if round_ is None:
            round_ = self._queued = _Round()
        earlier = round_.marks.get(mark.obligation_id)
        if earlier is not None:
            mark.check = mark.check or earlier.check
        round_.marks[mark.obligation_id] = mark
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_rounds())
        return round_

    def _buffered(self, obligation_id: str) -> bool:
        return any(
            r is not None and obligation_id in r.marks for r in (self._queued, self._writing)
        )

    async def flush(self) -> None:
        """Commit the delivered marks buffered so far (a failed commit keeps them for
        ``record_unrecorded``); never raises a storage error."""
        round_ = self._queued or self._writing
        if round_ is None:
            return
        if self._flusher is None:  # the last flusher was cancelled with rounds left
            self._flusher = asyncio.get_running_loop().create_task(self._flush_rounds())
        # Shielded: a caller cancelled while waiting must not cancel everyone's commit.
        await asyncio.shield(round_.done)

    async def _flush_rounds(self) -> None:
        try:
            while (round_ := self._queued) is not None:
                self._queued, self._writing = None, round_
                marks = list(round_.marks.values())
                try:
                    round_.written = await self._write_delivered(marks)
                except Exception as exc:
                    self._keep_delivered(marks, exc)
                except BaseException as exc:  # cancelled (the loop is closing): keep them too
                    self._keep_delivered(marks, exc)
                    raise
                else:
                    for mark in marks:
                        self._unrecorded.pop(mark.obligation_id, None)
                finally:
                    self._writing = None
                    if not round_.done.done():
                        round_.done.set_result(None)
        finally:
            self._flusher = None

    def _keep_delivered(self, marks: Iterable[DeliveredMark], exc: BaseException) -> None:
        """Hold marks a failed commit kept out for ``record_unrecorded``; the rows stay
        'attempting', so a crash before they land resends with the marker."""
        marks = list(marks)
        shown = ", ".join(m.obligation_id for m in marks[:5])
        more = f" and {len(marks) - 5} more" if len(marks) > 5 else ""
        self._log_storage_failure("mark delivered", shown + more, exc)
        for mark in marks:
            self._unrecorded[mark.obligation_id] = self._requeue(mark)

    def _requeue(self, mark: DeliveredMark) -> Callable[[], Awaitable[bool]]:
        async def write() -> bool:
            self._queue_delivered(mark)
            return True

        return write

    async def _write_delivered(self, marks: Sequence[DeliveredMark]) -> set[str]:
        """Write ``marks`` in one transaction; returns the ids of the rows updated."""
        raise NotImplementedError
