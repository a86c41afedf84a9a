"""``python -m bot usage`` and ``sessions show``'s totals; ``MODEL_PRICES``, never guessed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.config import load_settings
from bot.core.models.base import Usage
from bot.core.prices import ModelPrice, cost_of, cost_of_totals, format_usd, parse_prices
from bot.core.stores.base import TransactionalStore
from bot.core.stores.postgres import PostgresSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.usage import UsageTotals, record_usage_in
from bot.errors import ConfigurationError
from tests.cli_inprocess import cli as _bot
from tests.pgtest import pg_dsn
from tests.test_cli import _bot as _bot_subprocess

__all__ = ["pg_dsn"]

TODAY = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
YESTERDAY = TODAY - timedelta(days=1)
PRICES = {"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}


async def _seed(tmp_path: Path, store: TransactionalStore | None = None) -> None:
    if store is None:
        (tmp_path / "data").mkdir(exist_ok=True)
        store = SQLiteSessionStore(str(tmp_path / "data" / "chatflow.db"))
    await store.open()
    async with store.transaction() as tx:
        for agent, model, usage, at in [
            ("Triage", "gpt-4o-mini", Usage(1_000_000, 0), YESTERDAY),
            ("Triage", "gpt-4o-mini", Usage(2_000, 1_000, cached_input_tokens=1_024), TODAY),
            ("Triage", "gpt-4o-mini", Usage(1_000, 500, reasoning_tokens=64), TODAY),
            ("Billing", "o4-mini", Usage(300, 30), TODAY),
        ]:
            await record_usage_in(
                tx,
                session_id="s1",
                agent=agent,
                kind="chat",
                model=model,
                usage=usage,
                sender="d1",
                at=at,
            )
    await store.close()


def _rows(out: str) -> dict[tuple[str, str], list[str]]:
    """``usage``'s table as cells by (day, agent); the total row under ("total", "")."""
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["day", "agent"]
    rows: dict[tuple[str, str], list[str]] = {}
    for line in lines[1:]:
        cells = line.split("  ")
        cells = [c.strip() for c in cells if c.strip()]
        if cells[0] == "total":
            rows[("total", "")] = cells[1:]
        else:
            rows[(cells[0], cells[1])] = cells[2:]
    return rows


def test_usage_of_an_empty_database_says_so(tmp_path: Path) -> None:
    result = _bot_subprocess(tmp_path, "usage")  # the other usage tests run it in-process
    assert (result.returncode, result.stdout) == (0, "No token usage recorded.\n"), result.stderr
    since = _bot(tmp_path, "usage", "--since", "2026-01-01")
    assert since.stdout == "No token usage recorded since 2026-01-01.\n"


async def test_usage_prints_tokens_per_agent_and_day_without_money(tmp_path: Path) -> None:
    await _seed(tmp_path)
    result = _bot(tmp_path, "usage")
    assert result.returncode == 0, result.stderr
    assert "cost" not in result.stdout and "$" not in result.stdout
    rows = _rows(result.stdout)
    day, before = TODAY.date().isoformat(), YESTERDAY.date().isoformat()
    # calls, prompt, cached, completion, reasoning, total
    assert rows[(before, "Triage")] == ["1", "1000000", "0", "0", "0", "1000000"]
    assert rows[(day, "Triage")] == ["2", "3000", "1024", "1500", "64", "4500"]
    assert rows[(day, "Billing")] == ["1", "300", "0", "30", "0", "330"]
    assert rows[("total", "")] == ["4", "1003300", "1024", "1530", "64", "1004830"]
    recent = _rows(_bot(tmp_path, "usage", "--days", "1").stdout)
    assert set(recent) == {(day, "Triage"), (day, "Billing"), ("total", "")}
    assert set(_rows(_bot(tmp_path, "usage", "--since", day).stdout)) == set(recent)


async def test_usage_with_model_prices_shows_money_and_no_price_for_unknown_models(
    tmp_path: Path,
) -> None:
    await _seed(tmp_path)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps(PRICES), encoding="utf-8")
    result = _bot(tmp_path, "usage", MODEL_PRICES=str(prices))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].endswith("cost (USD)")
    rows = _rows(result.stdout)
    day, before = TODAY.date().isoformat(), YESTERDAY.date().isoformat()
    assert rows[(before, "Triage")][-1] == "$0.1500"  # a million prompt tokens at $0.15
    # (3000 - 1024) * 0.15 + 1024 * 0.075 + 1500 * 0.6, per million
    assert rows[(day, "Triage")][-1] == "$0.0013"
    assert rows[(day, "Billing")][-1] == "no price"  # o4-mini is not in the file
    assert rows[("total", "")][-1] == "no price"  # never a partial sum


async def test_usage_reads_toml_prices_too(tmp_path: Path) -> None:
    await _seed(tmp_path)
    prices = tmp_path / "prices.toml"
    prices.write_text(
        '["gpt-4o-mini"]\ninput = 0.15\noutput = 0.6\n\n["o4-mini"]\ninput = 1.1\noutput = 4.4\n',
        encoding="utf-8",
    )
    result = _bot(tmp_path, "usage", "--days", "1", MODEL_PRICES=str(prices))
    assert result.returncode == 0, result.stderr
    rows = _rows(result.stdout)
    assert rows[(TODAY.date().isoformat(), "Billing")][-1] == "$0.0005"
    assert rows[("total", "")][-1].startswith("$")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        pytest.param("{not json", "is not valid JSON", id="not-json"),
        pytest.param('{"gpt-4o": {"input": 2.5}}', "'output' is missing", id="missing"),
        pytest.param('{"gpt-4o": {"input": "cheap", "output": 1}}', "must be a number", id="text"),
        pytest.param('{"gpt-4o": {"in": 1, "output": 1}}', "unknown key 'in'", id="typo"),
        pytest.param('[["gpt-4o", 1]]', "must hold an object", id="list"),
    ],
)
def test_a_malformed_prices_file_is_a_configuration_error_that_says_what(
    tmp_path: Path, content: str, says: str
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigurationError, match="MODEL_PRICES: ") as raised:
        load_settings(data_dir=tmp_path, model_prices=prices)
    assert says in str(raised.value)


def test_a_malformed_prices_file_stops_usage_and_run_with_one_clear_line(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text('{"gpt-4o": {"in": 1, "output": 1}}', encoding="utf-8")
    for command in (["usage"], ["run"]):
        result = _bot(tmp_path, *command, MODEL_PRICES=str(prices))
        assert result.returncode == 2
        [line] = result.stderr.strip().splitlines()
        assert line.startswith("chatflow: configuration error: MODEL_PRICES: ")
        assert "unknown key 'in'" in line


def test_a_missing_prices_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="MODEL_PRICES: cannot read"):
        load_settings(data_dir=tmp_path, model_prices=tmp_path / "nope.json")


def test_a_bad_since_is_refused(tmp_path: Path) -> None:
    result = _bot(tmp_path, "usage", "--since", "yesterday")
    assert result.returncode == 2 and "usage:" in result.stderr
    both = _bot(tmp_path, "usage", "--since", "2026-01-01", "--days", "2")
    assert both.returncode == 2  # one period or the other


def test_costs_are_computed_from_the_operators_prices_only() -> None:
    price = ModelPrice(input=1.0, output=4.0, cached_input=0.25)
    assert cost_of(price, prompt=1_000_000, cached_prompt=400_000, completion=0) == 0.7
    uncached = ModelPrice(input=1.0, output=4.0)  # cached tokens cost what input costs
    assert cost_of(uncached, prompt=1_000_000, cached_prompt=400_000, completion=0) == 1.0
    assert cost_of(None, prompt=1, cached_prompt=0, completion=1) is None
    prices = parse_prices({"m": {"input": 1, "output": 2}})
    assert cost_of_totals({"m": UsageTotals(1_000_000, 0, 500_000, 0, 1)}, prices) == 2.0
    assert cost_of_totals({"other": UsageTotals(1, 0, 1, 0, 1)}, prices) is None
    assert cost_of_totals({"other": UsageTotals()}, prices) == 0.0  # no tokens, no cost
    assert (format_usd(None), format_usd(0.00123), format_usd(12.5)) == (
        "no price",
        "$0.0012",
        "$12.50",
    )


def test_sessions_show_prints_the_conversation_totals(tmp_path: Path) -> None:
    chat = _bot(tmp_path, "chat", stdin="where is my order #1001?\n")
    assert chat.returncode == 0, chat.stderr
    [session_id] = _bot(tmp_path, "sessions", "list").stdout.split()
    shown = _bot(tmp_path, "sessions", "show", session_id).stdout.splitlines()
    # The offline demo model reports its usage like a provider: two agents, three calls.
    assert shown[1].startswith("tokens: ") and "over 3 model calls" in shown[1]
    assert "cost" not in shown[1]
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"offline": {"input": 1, "output": 1}}), encoding="utf-8")
    priced = _bot(tmp_path, "sessions", "show", session_id, MODEL_PRICES=str(prices))
    assert "; cost: $" in priced.stdout.splitlines()[1]


def test_doctor_shows_the_token_budget(tmp_path: Path) -> None:
    result = _bot(tmp_path, "doctor", MAX_TOKENS_PER_SENDER_PER_DAY="200000")
    assert "token budget 200000 per sender per UTC day" in result.stdout
    assert "token budget" not in _bot(tmp_path, "doctor").stdout


async def test_usage_on_postgres(pg_dsn: str, tmp_path: Path) -> None:
    await _seed(tmp_path, PostgresSessionStore(pg_dsn))
    result = _bot(tmp_path, "usage", DATABASE_URL=pg_dsn)
    assert result.returncode == 0, result.stderr
    assert _rows(result.stdout)[("total", "")] == ["4", "1003300", "1024", "1530", "64", "1004830"]
