"""The gateway's usage accounting: what a turn's tx 2 pays for it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bot.core.models.base import Usage
from bot.core.sql import Transaction
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.usage import CallUsage
from bot.gateway.accounting import TokenAccounting
from bot.metrics import Metrics
from tests.gateway.conftest import build_event

SECRET = b"accounting-test-secret"


class SeenTransaction:
    """A transaction that notes each statement it is asked to run."""

    def __init__(self, tx: Transaction) -> None:
        self._tx = tx
        self.dialect = tx.dialect
        self.statements: list[str] = []

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        self.statements.append(sql)
        return await self._tx.execute(sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self.statements.append(sql)
        return await self._tx.fetchone(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)


async def test_an_opened_accounting_records_a_turn_without_reading_the_schema(
    tmp_path: Path,
) -> None:
    """The usage table is made sure of once, at start: not by every turn's transaction."""
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    try:
        accounting = TokenAccounting(store, Metrics(), secret=SECRET)
        await accounting.open()
        seen: list[str] = []

        async def body(tx: Transaction) -> None:
            watched = SeenTransaction(tx)
            usage = Usage(input_tokens=3, output_tokens=2)
            call = CallUsage("chat", "offline", "Helper", usage)
            await accounting.record_in(watched, "session-1", build_event(), [call])
            seen.extend(watched.statements)

        await store.run(body)
        assert len(seen) == 1 and seen[0].startswith("INSERT INTO chatflow_usage")

        async def spent(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone("SELECT SUM(prompt_tokens) FROM chatflow_usage")

        assert await store.run(spent) == (3,)
    finally:
        await store.close()
