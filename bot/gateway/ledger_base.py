"""What every part of the delivery ledger shares: the store, the owner, the schema, fencing.

``LedgerBase`` holds the state of a ``DeliveryLedger`` (``bot.gateway.ledger``);
the ledger's behaviour lives in mixins built on it, one concept each. Nothing
here decides a row's state.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Final

from bot.core.memory import Transaction, TransactionalStore, require_transactional
from bot.errors import StorageError
from bot.gateway.instances import (
    Owner,
    OwnerLiveness,
    ensure_instances_schema,
    is_owner_alive,
    lease_liveness,
    to_epoch,
)
from bot.gateway.obligations import MIGRATIONS
from bot.gateway.schema import ensure_schema

__all__ = ["STORAGE_ERRORS", "LedgerBase"]

# One logger for every ledger module: operators filter on this name.
logger = logging.getLogger("bot.gateway.ledger")

_COMPONENT: Final = "delivery_ledger"

STORAGE_ERRORS: Final = (StorageError, sqlite3.Error)
"""Storage failures swallowed by the best-effort methods (the store translates
sqlite3 errors into ``StorageError``; the second is belt and braces)."""


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
