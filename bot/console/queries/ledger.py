"""The ledger page: undelivered replies, what needs a person first, their counts, and
this process's metrics in brief."""

from __future__ import annotations

from typing import Any, Final

from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.gateway.ledger.obligations import COLUMNS, TABLE, Obligation, decode_row
from bot.metrics import Metrics

__all__ = ["ATTENTION", "IN_FLIGHT", "UNDELIVERED", "ledger_counts", "ledger_rows", "metric_totals"]

UNDELIVERED: Final = ("pending", "attempting", "failed", "abandoned")
"""Ledger states the ledger page lists."""
ATTENTION: Final = ("abandoned", "failed")
"""Undelivered states a person should look at: listed first."""
IN_FLIGHT: Final = ("attempting", "pending")
"""Undelivered states still on their way: listed after ``ATTENTION``."""


async def ledger_rows(store: TransactionalStore, *, limit: int = 100) -> list[Obligation]:
    """Undelivered replies, what needs a person first: abandoned ones (given up:
    only a person can still help), failed ones (retried by the bot), then those
    on their way; newest first within each, up to ``limit`` in all."""

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        rows: list[tuple[Any, ...]] = []
        for states in (("abandoned",), ("failed",), IN_FLIGHT):
            if len(rows) >= limit:
                break
            marks = ", ".join("?" for _ in states)
            rows += await tx.fetchall(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE state IN ({marks}) "
                "ORDER BY created_at DESC, obligation_id LIMIT ?",
                (*states, limit - len(rows)),
            )
        return rows

    return [decode_row(r).obligation for r in await store.run(body, write=False)]


async def ledger_counts(store: TransactionalStore) -> dict[str, int]:
    """Undelivered obligations per state (``UNDELIVERED``)."""

    async def body(tx: Transaction) -> list[tuple[Any, ...]]:
        # Undelivered states only: an index range, where counting 'delivered' would
        # read the whole ledger on the database thread the message path uses.
        marks = ", ".join("?" for _ in UNDELIVERED)
        return await tx.fetchall(
            f"SELECT state, COUNT(*) FROM {TABLE} WHERE state IN ({marks}) GROUP BY state",
            UNDELIVERED,
        )

    counts = dict.fromkeys(UNDELIVERED, 0)
    for state, count in await store.run(body, write=False):
        counts[str(state)] = int(count)
    return counts


def metric_totals(metrics: Metrics) -> dict[str, float]:
    """This process's counters and gauges, summed over their labels (``/metrics`` in brief)."""
    totals: dict[str, float] = {}
    for family in metrics.registry.collect():
        if family.type not in ("counter", "gauge"):
            continue
        values = [
            sample.value
            for sample in family.samples
            if family.type == "gauge" or sample.name.endswith("_total")
        ]
        totals[family.name.removeprefix("chatflow_").replace("_", " ")] = sum(values)
    return totals
