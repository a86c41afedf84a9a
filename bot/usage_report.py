"""``python -m bot usage``: tokens per agent and UTC day, and money where prices are given.

Reads ``chatflow_usage`` (``bot.core.usage``) in the bot's database, running or
not. With ``MODEL_PRICES`` the table gains a cost column; a row with a model
the file does not name says ``no price`` (never a guess, never a partial sum).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from bot.core.prices import Prices, cost_of_totals, format_usd, load_prices
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore, require_transactional
from bot.core.usage import UsageRow, UsageTotals, daily_totals_in, session_totals_in

__all__ = [
    "NO_USAGE",
    "UsageLine",
    "format_session_totals",
    "format_usage_table",
    "group_usage",
    "read_prices",
    "session_usage",
    "since_day",
    "usage_lines",
]

NO_USAGE = "No token usage recorded"
"""What ``usage`` prints for an empty table (followed by the period, if one was asked)."""

_HEADERS = ("day", "agent", "calls", "prompt", "cached", "completion", "reasoning", "total")


@dataclass
class UsageLine:
    """One agent's usage on one day, summed over its models."""

    day: str
    agent: str
    by_model: dict[str | None, UsageTotals] = field(default_factory=dict)

    @property
    def totals(self) -> UsageTotals:
        """Summed over the models."""
        total = UsageTotals()
        for totals in self.by_model.values():
            total = total + totals
        return total


def since_day(since: str | None, days: int | None, today: date | None = None) -> str | None:
    """The first day to report (``YYYY-MM-DD``): ``since``, or ``days`` days back
    counting today; ``None`` for everything. ``ValueError`` for a malformed date."""
    if since is not None:
        return date.fromisoformat(since).isoformat()
    if days is not None:
        if days <= 0:
            raise ValueError("--days must be at least 1")
        today = today or datetime.now(UTC).date()
        return (today - timedelta(days=days - 1)).isoformat()
    return None


def group_usage(rows: Sequence[UsageRow]) -> list[UsageLine]:
    """Rows per (day, agent, model) as lines per (day, agent), in order."""
    lines: dict[tuple[str, str], UsageLine] = {}
    for row in rows:
        line = lines.setdefault((row.day, row.agent), UsageLine(row.day, row.agent))
        line.by_model[row.model] = line.by_model.get(row.model, UsageTotals()) + row.totals
    return list(lines.values())


def _cells(totals: UsageTotals) -> list[str]:
    return [
        str(totals.calls),
        str(totals.prompt),
        str(totals.cached_prompt),
        str(totals.completion),
        str(totals.reasoning),
        str(totals.total),
    ]


def format_usage_table(lines: Sequence[UsageLine], prices: Prices | None) -> str:
    """The table ``usage`` prints: one row per agent and day, then the total."""
    headers = list(_HEADERS) + (["cost (USD)"] if prices is not None else [])
    body: list[list[str]] = []
    everything: dict[str | None, UsageTotals] = {}
    for line in lines:
        row = [line.day, line.agent, *_cells(line.totals)]
        if prices is not None:
            row.append(format_usd(cost_of_totals(line.by_model, prices)))
        body.append(row)
        for model, totals in line.by_model.items():
            everything[model] = everything.get(model, UsageTotals()) + totals
    total_row = ["total", "", *_cells(sum(everything.values(), UsageTotals()))]
    if prices is not None:
        total_row.append(format_usd(cost_of_totals(everything, prices)))
    table = [headers, *body, total_row]
    widths = [max(len(row[i]) for row in table) for i in range(len(headers))]

    def render(row: list[str]) -> str:
        # Names left-aligned, numbers right-aligned.
        return "  ".join(
            cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()

    return "\n".join(render(row) for row in table)


def format_session_totals(by_model: Mapping[str | None, UsageTotals], prices: Prices | None) -> str:
    """One line of a conversation's totals, as ``sessions show`` and the console print it."""
    total = sum(by_model.values(), UsageTotals())
    if not total.calls:
        return "tokens: none recorded"
    text = (
        f"tokens: {total.total} over {total.calls} model call{'s' if total.calls != 1 else ''}"
        f" (prompt {total.prompt}, cached {total.cached_prompt}, "
        f"completion {total.completion}, reasoning {total.reasoning})"
    )
    if prices is not None:
        text += f"; cost: {format_usd(cost_of_totals(by_model, prices))}"
    return text


async def read_prices(path: Path | None) -> Prices | None:
    """The ``MODEL_PRICES`` file, read off the event loop; ``None`` when unset.

    ``ValueError`` in one line for a file that became unreadable or malformed
    since the settings were checked."""
    if path is None:
        return None
    return await asyncio.to_thread(load_prices, path)


async def usage_lines(store: TransactionalStore, since: str | None) -> list[UsageLine]:
    """The lines of the ``usage`` table from ``store``'s database."""

    async def body(tx: Transaction) -> list[UsageRow]:
        return await daily_totals_in(tx, since)

    return group_usage(await require_transactional(store, "usage").run(body))


async def session_usage(
    store: TransactionalStore, session_id: str
) -> dict[str | None, UsageTotals]:
    """One conversation's usage by model."""

    async def body(tx: Transaction) -> dict[str | None, UsageTotals]:
        return await session_totals_in(tx, session_id)

    return await require_transactional(store, "usage").run(body)
