"""The example agents in ``agents/``: their tools, their handoff graph, and a demo run."""

from __future__ import annotations

import ast
import asyncio
import json
import threading
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agents
from agents.billing import (
    REFUNDS_FILE,
    billing,
    get_invoice,
    list_invoices,
    refund_question,
    request_refund,
)
from agents.orders import check_order_status, load_orders, normalise_order_id, order_tracking
from agents.triage import triage
from bot.core.agent import Agent
from bot.core.models.offline import OFFLINE_PREFIX, OfflineModel
from bot.core.runner import Runner
from bot.core.stores.in_memory import SessionStore
from bot.core.tools import FunctionTool, ToolContext


def ctx(inbound: str | None = "wamid.A", session: str = "s-1") -> ToolContext:
    return ToolContext(session_id=session, inbound_message_id=inbound, agent_name="Billing")


async def call(tool: FunctionTool, args: dict[str, Any], context: ToolContext | None = None) -> Any:
    """Invoke a tool as the runner does; decode JSON results."""
    text = await tool.invoke(context or ctx(), args)
    try:
        return json.loads(text)
    except ValueError:
        return text


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    return tmp_path


def _days_from_today(days: int) -> str:
    return (date.today() + timedelta(days=days)).isoformat()


def refund_lines(data_dir: Path) -> list[dict[str, Any]]:
    path = data_dir / REFUNDS_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- Order Tracking -------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [pytest.param(v, id=v) for v in ("1001", "#1001", " #1001 ", "order 1001", "Order #1001")],
)
async def test_check_order_status_known_order(raw: str) -> None:
    result = await call(check_order_status, {"order_id": raw})

    assert result == {
        "order_id": "1001",
        "status": "shipped",
        "carrier": "DHL Express",
        "tracking_number": "JD014600006281144021",
        "eta": _days_from_today(3),  # the sample file says "today+3"
        "note": "Left the Madrid warehouse; out for delivery the day before the ETA",
    }


async def test_check_order_status_leaves_out_unset_fields() -> None:
    result = await call(check_order_status, {"order_id": "1002"})

    assert result["status"] == "processing"
    assert "carrier" not in result
    assert "tracking_number" not in result


async def test_check_order_status_unknown_order() -> None:
    result = await call(check_order_status, {"order_id": "#9999"})

    assert isinstance(result, str)
    assert result.startswith("No order #9999 was found")


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("abc", id="letters"),
        pytest.param("12", id="too-short"),
        pytest.param("123456789", id="too-long"),
        pytest.param("1001; DROP TABLE", id="injection"),
        pytest.param("", id="empty"),
        pytest.param("../1001", id="path"),
    ],
)
async def test_check_order_status_rejects_invalid_ids(raw: str) -> None:
    result = await call(check_order_status, {"order_id": raw})

    assert set(result) == {"error"}
    assert "is not an order number" in result["error"]
    assert "4 to 8 digits" in result["error"]


@given(st.text(max_size=20))
def test_normalise_order_id_returns_digits_or_raises(raw: str) -> None:
    try:
        number = normalise_order_id(raw)
    except ValueError:
        return
    assert number.isascii() and number.isdigit()
    assert 4 <= len(number) <= 8
    assert number in raw


@given(st.from_regex(r"[0-9]{4,8}", fullmatch=True), st.sampled_from(["", "#", "order ", "# "]))
def test_normalise_order_id_accepts_every_valid_number(digits: str, prefix: str) -> None:
    assert normalise_order_id(prefix + digits) == digits


# -- Billing: reading ---------------------------------------------------------------


@pytest.mark.parametrize(
    "raw", [pytest.param(v, id=v) for v in ("INV-2001", "inv-2001", "INV 2001")]
)
async def test_get_invoice_known(raw: str) -> None:
    result = await call(get_invoice, {"invoice_id": raw})

    assert result == {
        "invoice_id": "INV-2001",
        "order_id": "1001",
        "customer_email": "ana@example.com",
        "amount": "59.90",
        "currency": "EUR",
        "status": "paid",
        "issued_on": _days_from_today(-3),
    }


async def test_get_invoice_unknown_and_invalid() -> None:
    unknown = await call(get_invoice, {"invoice_id": "INV-9999"})
    invalid = await call(get_invoice, {"invoice_id": "2001"})

    assert isinstance(unknown, str) and unknown.startswith("No invoice INV-9999 was found")
    assert "is not an invoice number" in invalid["error"]


async def test_list_invoices_by_email_newest_first() -> None:
    result = await call(list_invoices, {"customer_email": " Ana@Example.com "})

    assert result["customer_email"] == "ana@example.com"
    assert [inv["invoice_id"] for inv in result["invoices"]] == ["INV-2001", "INV-2002"]


async def test_list_invoices_unknown_and_invalid_email() -> None:
    unknown = await call(list_invoices, {"customer_email": "nobody@example.com"})
    invalid = await call(list_invoices, {"customer_email": "not-an-email"})

    assert unknown == "There are no invoices for that e-mail address."
    assert "is not an e-mail address" in invalid["error"]


# -- Billing: refunds -----------------------------------------------------------------

REFUND = {"invoice_id": "INV-2001", "reason": "The parcel arrived damaged."}


async def test_refund_is_recorded(data_dir: Path) -> None:
    result = await call(request_refund, REFUND, ctx("wamid.A"))

    assert result["state"] == "received"
    assert result["invoice_id"] == "INV-2001"
    assert result["amount"] == "59.90"
    assert result["request_id"].startswith("REF-")
    [line] = refund_lines(data_dir)
    assert line["request_id"] == result["request_id"]
    assert line["invoice_id"] == "INV-2001"
    assert line["reason"] == "The parcel arrived damaged."
    assert line["session_id"] == "s-1"
    assert line["idempotency_key"] == "wamid.A|INV-2001"


async def test_refund_is_idempotent_for_the_same_inbound_message(data_dir: Path) -> None:
    first = await call(request_refund, REFUND, ctx("wamid.A"))
    again = await call(request_refund, REFUND, ctx("wamid.A"))

    assert again == first
    assert len(refund_lines(data_dir)) == 1


async def test_concurrent_refunds_for_one_inbound_message_record_one(data_dir: Path) -> None:
    results = await asyncio.gather(
        *(call(request_refund, REFUND, ctx("wamid.A")) for _ in range(8))
    )

    assert len({r["request_id"] for r in results}) == 1
    assert len(refund_lines(data_dir)) == 1


async def test_second_message_for_the_same_invoice_gets_the_open_request(data_dir: Path) -> None:
    first = await call(request_refund, REFUND, ctx("wamid.A"))
    second = await call(request_refund, REFUND, ctx("wamid.B"))

    assert second["state"] == "already_requested"
    assert second["request_id"] == first["request_id"]
    assert len(refund_lines(data_dir)) == 1


async def test_one_message_may_request_two_invoices(data_dir: Path) -> None:
    one = await call(request_refund, REFUND, ctx("wamid.A"))
    two = await call(request_refund, {**REFUND, "invoice_id": "INV-2002"}, ctx("wamid.A"))

    assert one["request_id"] != two["request_id"]
    assert [line["invoice_id"] for line in refund_lines(data_dir)] == ["INV-2001", "INV-2002"]


async def test_refund_without_inbound_id_still_records_once(data_dir: Path) -> None:
    first = await call(request_refund, REFUND, ctx(None))
    second = await call(request_refund, REFUND, ctx(None))

    assert first["state"] == "received"
    assert second["state"] == "already_requested"
    assert len(refund_lines(data_dir)) == 1


@pytest.mark.parametrize(
    ("invoice_id", "expected"),
    [
        pytest.param("INV-2003", "has not been paid yet", id="open"),
        pytest.param("INV-2004", "has already been refunded", id="refunded"),
        pytest.param("INV-9999", "No invoice INV-9999 was found", id="unknown"),
    ],
)
async def test_refund_refused_without_a_record(
    data_dir: Path, invoice_id: str, expected: str
) -> None:
    result = await call(request_refund, {**REFUND, "invoice_id": invoice_id})

    assert isinstance(result, str) and expected in result
    assert refund_lines(data_dir) == []


async def test_refund_needs_a_reason(data_dir: Path) -> None:
    result = await call(request_refund, {**REFUND, "reason": "   "})

    assert "a reason is required" in result["error"]
    assert refund_lines(data_dir) == []


async def test_refund_after_a_torn_line_starts_a_fresh_line(data_dir: Path) -> None:
    (data_dir / REFUNDS_FILE).write_text('{"request_id": "REF-TORN", "invoice_id": "INV-20')

    result = await call(request_refund, REFUND, ctx("wamid.A"))

    assert result["state"] == "received"
    lines = (data_dir / REFUNDS_FILE).read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["request_id"] == result["request_id"]


# -- The graph ---------------------------------------------------------------------


def test_starting_agent_and_handoff_graph() -> None:
    assert agents.starting_agent is triage
    assert triage.name == "Triage"
    assert triage.handoffs == (order_tracking, billing)
    assert order_tracking.handoffs == (triage,)
    assert billing.handoffs == (triage,)
    assert [h.name for h in triage.handoff_tools] == [
        "transfer_to_order_tracking",
        "transfer_to_billing",
    ]
    assert [h.name for h in billing.handoff_tools] == ["transfer_to_triage"]
    assert all(a.model is None for a in (triage, order_tracking, billing))


def test_each_agent_has_its_documented_tools() -> None:
    assert [t.name for t in triage.function_tools] == [
        "search_knowledge",
        "remember",
        "recall",
        "forget",
    ]
    assert [t.name for t in order_tracking.function_tools] == [
        "check_order_status",
        "search_knowledge",
    ]
    assert [t.name for t in billing.function_tools] == [
        "get_invoice",
        "list_invoices",
        "request_refund",
    ]
    refund_schema = dict(request_refund.params_json_schema)
    assert set(refund_schema["properties"]) == {"invoice_id", "reason"}  # ctx is hidden
    assert request_refund.takes_context


def test_runner_registers_the_whole_graph() -> None:
    runner = Runner(agents.starting_agent, SessionStore(), model=OfflineModel())

    assert set(runner.agents) == {"Triage", "Order Tracking", "Billing"}


@pytest.mark.parametrize(
    ("agent", "words"),
    [
        pytest.param(order_tracking, ("order", "track", "delivery", "shipping"), id="orders"),
        pytest.param(billing, ("billing", "invoice", "refund", "payment"), id="billing"),
    ],
)
def test_handoff_descriptions_name_their_topics(agent: Agent, words: tuple[str, ...]) -> None:
    text = f"{agent.name} {agent.handoff_description}".lower()
    assert all(word in text for word in words)


# -- A demo turn with the offline model ----------------------------------------------


async def test_offline_order_question_ends_in_order_tracking() -> None:
    runner = Runner(agents.starting_agent, SessionStore(), model=OfflineModel())

    result = await runner.run_async("console-demo-1", "where is my order #1001?")

    assert result.agent == "Order Tracking"
    assert result.content.startswith(OFFLINE_PREFIX)
    assert "shipped" in result.content
    assert "DHL Express" in result.content
    calls = [c.name for m in result.new_messages for c in m.tool_calls]
    assert calls == ["transfer_to_order_tracking", "check_order_status"]
    session = await runner.store.get("console-demo-1")
    assert session is not None and session.active_agent.name == "Order Tracking"


async def test_offline_refund_request_hands_off_to_billing(data_dir: Path) -> None:
    runner = Runner(agents.starting_agent, SessionStore(), model=OfflineModel())

    asked = await runner.run_async("console-demo-2", "I need a refund for invoice INV-2001")

    # The refund waits for the customer's yes: nothing is recorded yet.
    assert asked.agent == "Billing"
    assert [c.name for m in asked.new_messages for c in m.tool_calls] == ["transfer_to_billing"]
    pending = asked.pending_approval
    assert pending is not None and pending.tool_name == "request_refund"
    assert asked.content == (
        "Shall I open a refund request for invoice INV-2001 (59.90 EUR)? "
        "Your reason: I need a refund for invoice INV-2001"
    )
    assert [b.label for b in asked.buttons] == ["Approve", "Deny"]
    assert refund_lines(data_dir) == []
    result = await runner.resume_async("console-demo-2", pending, "approved")
    calls = [c.name for m in result.new_messages for c in m.tool_calls]
    assert calls == ["request_refund"]
    assert "INV-2001" in result.content
    assert [r["invoice_id"] for r in refund_lines(data_dir)] == ["INV-2001"]


def test_the_refund_tool_asks_for_approval() -> None:
    assert request_refund.needs_approval is refund_question


async def test_an_unpaid_invoice_is_declined_before_anyone_is_asked(data_dir: Path) -> None:
    """N4: the demo asks no approval for a refund that cannot happen (INV-2003 is open)."""
    runner = Runner(agents.starting_agent, SessionStore(), model=OfflineModel())

    result = await runner.run_async("console-demo-5", "I need a refund for invoice INV-2003")

    assert result.pending_approval is None and result.buttons == ()
    assert "INV-2003 has not been paid yet" in result.content
    assert refund_lines(data_dir) == []


async def test_offline_specialists_hand_other_topics_back_through_triage(data_dir: Path) -> None:
    runner = Runner(agents.starting_agent, SessionStore(), model=OfflineModel())
    await runner.run_async("console-demo-3", "where is my order #1001?")

    refund = await runner.run_async("console-demo-3", "I need a refund for invoice INV-2001")
    hello = await runner.run_async("console-demo-3", "hello")

    assert [c.name for m in refund.new_messages for c in m.tool_calls] == [
        "transfer_to_triage",
        "transfer_to_billing",
    ]
    assert refund.pending_approval is not None
    assert (hello.agent, [c.name for m in hello.new_messages for c in m.tool_calls]) == (
        "Triage",
        ["transfer_to_triage"],
    )


def test_sample_data_dates_are_relative_to_today() -> None:
    orders = load_orders()
    today = date.today()

    assert all(o.eta >= today for o in orders.values() if o.eta is not None)
    assert all(o.delivered_on <= today for o in orders.values() if o.delivered_on is not None)


# -- what the examples teach ------------------------------------------------------------

AGENTS_DIR = Path(__file__).resolve().parents[2] / "agents"


@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.name) for p in sorted(AGENTS_DIR.glob("*.py"))]
)
def test_examples_import_the_engine_only_through_its_public_api(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    engine_imports = [
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
        if node.module.split(".")[0] == "bot"
    ]
    engine_imports += [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] == "bot"
    ]
    assert set(engine_imports) <= {"bot"}, engine_imports


async def test_refund_does_not_depend_on_unrelated_settings(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wrong values for settings the tool does not use must not stop a refund.
    monkeypatch.setenv("HTTP_PORT", "not-a-port")
    monkeypatch.setenv("WHATSAPP_PHONE_ID", "123")  # without its token: invalid for the bot

    result = await call(request_refund, REFUND, ctx("wamid.A"))

    assert result["state"] == "received"
    assert len(refund_lines(data_dir)) == 1


async def test_refund_reads_data_dir_from_dotenv_like_the_bot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("DATA_DIR=from-dotenv\nHTTP_PORT=not-a-port\n")

    result = await call(request_refund, REFUND, ctx("wamid.A"))

    assert result["state"] == "received"
    assert len(refund_lines(tmp_path / "from-dotenv")) == 1


def test_refunds_from_two_event_loops_record_once(data_dir: Path) -> None:
    # A tool may be called from several loops in one process (tests, a CLI
    # command beside the bot); the writers must still be ordered.
    start = threading.Barrier(2)
    results: list[Any] = []

    def worker() -> None:
        async def burst() -> list[Any]:
            return await asyncio.gather(
                *(call(request_refund, REFUND, ctx("wamid.A")) for _ in range(4))
            )

        start.wait(timeout=10)
        results.extend(asyncio.run(burst()))

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(results) == 8
    assert len({r["request_id"] for r in results}) == 1
    assert len(refund_lines(data_dir)) == 1


def test_the_reminders_example_offers_the_three_scheduling_tools() -> None:
    from agents.reminders import reminders, starting_agent

    assert starting_agent is reminders
    assert [t.name for t in reminders.function_tools] == [
        "schedule_message",
        "list_scheduled_messages",
        "cancel_scheduled_message",
    ]
    assert "schedule_message" in reminders.instructions
