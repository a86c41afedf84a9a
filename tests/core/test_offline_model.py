"""The offline demo model: labelled, deterministic rules for tools, handoffs and echo."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from bot.core.agent import Agent, tool
from bot.core.attachments import attachment_note
from bot.core.messages import DocumentPart, Message, Role, ToolCall
from bot.core.models import OFFLINE_PREFIX, OfflineModel, ToolSpec, current_agent_name


@tool
def lookup_order(order_id: str) -> str:
    """Look up an order."""
    return order_id


@tool
def business_hours() -> str:
    """Opening hours."""
    return "9-17"


@tool
def count_items(order_id: int) -> int:
    """Count items."""
    return 1


BILLING = Agent("Billing", "Bills.", handoff_description="Invoices, payments and refunds.")
TRIAGE = Agent("Triage", "Route.", tools=[lookup_order, business_hours], handoffs=[BILLING])


async def ask(
    messages: Sequence[Message], tools: Sequence[ToolSpec], agent: str = "Triage"
) -> tuple[str | None, list[ToolCall]]:
    token = current_agent_name.set(agent)
    try:
        response = await OfflineModel().complete(
            model="offline", system="sys", messages=messages, tools=tools
        )
    finally:
        current_agent_name.reset(token)
    assert response.usage.total > 0
    return response.content, response.tool_calls


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


@pytest.mark.parametrize(
    "text",
    ["I need a refund", "question about my bill", "where is my INVOICE?", "billing please"],
    ids=["refund", "bill", "invoice-upper", "billing"],
)
async def test_billing_words_hand_off(text: str) -> None:
    content, calls = await ask([user(text)], TRIAGE.tool_specs())
    assert content is None
    assert [c.name for c in calls] == ["transfer_to_billing"]
    assert calls[0].arguments == {}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("where is order #1234?", "1234"),
        ("status of order 1234 please", "1234"),
        ("my order number: A-77", "A-77"),
        ("#98 has not arrived", "98"),
    ],
    ids=["hash", "order-space", "order-number", "bare-hash"],
)
async def test_order_ids_call_the_order_tool(text: str, expected: str) -> None:
    content, calls = await ask([user(text)], TRIAGE.tool_specs())
    assert content is None
    assert [(c.name, c.arguments) for c in calls] == [("lookup_order", {"order_id": expected})]


async def test_integer_parameters_get_integers() -> None:
    agent = Agent("A", "", tools=[count_items])
    _, calls = await ask([user("items in order 42")], agent.tool_specs())
    assert calls[0].arguments == {"order_id": 42}


async def test_tool_without_arguments_is_called_on_a_name_word() -> None:
    _, calls = await ask([user("what are your hours?")], TRIAGE.tool_specs())
    assert [(c.name, c.arguments) for c in calls] == [("business_hours", {})]


async def test_plain_text_is_echoed_with_the_agent_name_and_demo_label() -> None:
    content, calls = await ask([user("hello there")], TRIAGE.tool_specs())
    assert calls == []
    assert content is not None
    assert content.startswith(OFFLINE_PREFIX)
    assert "Triage" in content
    assert "hello there" in content


async def test_a_tool_result_is_summarised() -> None:
    call = ToolCall(id="c1", name="lookup_order", arguments={"order_id": "1"})
    history = [
        user("order #1"),
        Message(role=Role.MODEL, tool_calls=[call]),
        Message(
            role=Role.TOOL, tool_call_id="c1", name="lookup_order", content='{"status": "shipped"}'
        ),
    ]
    content, calls = await ask(history, TRIAGE.tool_specs())
    assert calls == []
    assert content == f"{OFFLINE_PREFIX}I checked lookup order: status: shipped."


async def test_a_tool_error_is_reported() -> None:
    call = ToolCall(id="c1", name="lookup_order", arguments={})
    history = [
        user("order #1"),
        Message(role=Role.MODEL, tool_calls=[call]),
        Message(role=Role.TOOL, tool_call_id="c1", content='{"error": "not found"}'),
    ]
    content, _ = await ask(history, TRIAGE.tool_specs())
    assert content == f"{OFFLINE_PREFIX}lookup order reported a problem: not found"


async def test_after_a_handoff_the_new_agent_answers_without_bouncing_back() -> None:
    back = Agent("Billing", "", handoff_description="x", handoffs=[Agent("Triage", "")])
    call = ToolCall(id="h1", name="transfer_to_billing")
    history = [
        user("refund for order #55 please, triage"),
        Message(role=Role.MODEL, tool_calls=[call]),
        Message(role=Role.TOOL, tool_call_id="h1", content="Transferred to Billing"),
    ]
    content, calls = await ask(history, back.tool_specs(), agent="Billing")
    assert calls == []
    assert content is not None and "Billing" in content


async def test_answers_are_deterministic() -> None:
    first = await ask([user("hello")], TRIAGE.tool_specs())
    second = await ask([user("hello")], TRIAGE.tool_specs())
    assert first == second


# -- a demo that flows: hub and spoke, several handoffs in one turn ----------------------


@tool
def get_invoice(invoice_id: str) -> str:
    """Get one invoice.

    Args:
        invoice_id: The invoice number, e.g. "INV-2001".
    """
    return invoice_id


@tool
def request_refund(invoice_id: str, reason: str) -> str:
    """Open a refund request.

    Args:
        invoice_id: The invoice number, e.g. "INV-2001".
        reason: Why, in the customer's words.
    """
    return invoice_id


def hub_and_spoke() -> tuple[Agent, Agent, Agent]:
    front = Agent("Front", "", handoff_description="Front desk: greetings.")
    orders = Agent("Orders", "", tools=[lookup_order], handoff_description="Orders, parcels.")
    bills = Agent(
        "Bills", "", tools=[get_invoice, request_refund], handoff_description="Invoices, refunds."
    )
    front.handoffs = [orders, bills]
    orders.handoffs = [front]
    bills.handoffs = [front]
    return front, orders, bills


def handed(caller: str, target: str, call_id: str) -> list[Message]:
    call = ToolCall(id=call_id, name=f"transfer_to_{target.lower()}")
    return [
        Message(role=Role.MODEL, tool_calls=[call], agent=caller),
        Message(role=Role.TOOL, tool_call_id=call_id, content=f"Transferred to {target}"),
    ]


async def test_a_specialist_hands_what_is_not_its_job_back_to_where_it_started() -> None:
    _, orders, _ = hub_and_spoke()
    earlier = [user("where is order #1001?"), *handed("Front", "Orders", "h1")]

    for text in ("hello", "I need a refund for invoice INV-2001"):
        _, calls = await ask([*earlier, user(text)], orders.tool_specs(), agent="Orders")
        assert [c.name for c in calls] == ["transfer_to_front"], text


async def test_in_one_turn_a_message_travels_on_but_never_back() -> None:
    front, _, bills = hub_and_spoke()
    turn = [
        user("where is order #1001?"),
        *handed("Front", "Orders", "h1"),
        user("I need a refund for invoice INV-2001"),
        *handed("Orders", "Front", "h2"),
    ]
    _, calls = await ask(turn, front.tool_specs(), agent="Front")
    assert [c.name for c in calls] == ["transfer_to_bills"]
    # Bills held nothing yet; Front and Orders did this turn: no way back to them.
    refund_turn = [*turn, *handed("Front", "Bills", "h3")]
    _, calls = await ask(refund_turn, bills.tool_specs(), agent="Bills")
    assert [(c.name, c.arguments) for c in calls] == [
        (
            "request_refund",
            {"invoice_id": "INV-2001", "reason": "I need a refund for invoice INV-2001"},
        )
    ]
    hello = [*turn[:-2], user("hello"), *handed("Orders", "Front", "h2")]
    content, calls = await ask(hello, front.tool_specs(), agent="Front")
    assert calls == [] and content is not None and 'You said: "hello"' in content


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("show me invoice INV-2001", ("get_invoice", {"invoice_id": "INV-2001"})),
        ("INV-2002 please", ("get_invoice", {"invoice_id": "INV-2002"})),
        ("refund inv-2003, it broke", ("request_refund", {"invoice_id": "inv-2003"})),
    ],
    ids=["named", "by-its-shape", "refund"],
)
async def test_the_tool_the_text_names_and_fills_best_wins(
    text: str, expected: tuple[str, dict[str, str]]
) -> None:
    _, _, bills = hub_and_spoke()
    _, calls = await ask([user(text)], bills.tool_specs(), agent="Bills")
    name, arguments = expected
    assert [c.name for c in calls] == [name]
    assert calls[0].arguments.items() >= arguments.items()


async def test_another_kind_of_number_is_not_read_as_an_invoice_number() -> None:
    _, _, bills = hub_and_spoke()
    content, calls = await ask([user("where is my order #1001?")], bills.tool_specs(), "Bills")
    assert calls == [] and content is not None and "Bills here" in content


async def test_a_named_tool_without_its_id_asks_for_it() -> None:
    _, _, bills = hub_and_spoke()
    content, calls = await ask([user("I want a refund")], bills.tool_specs(), agent="Bills")
    assert calls == []
    assert content == (
        f'{OFFLINE_PREFIX}Bills here. To request refund I need the invoice number, e.g. "INV-2001".'
    )


async def test_the_note_about_an_attached_file_is_not_repeated() -> None:
    part = DocumentPart(sha256="a" * 64, mime_type="text/csv", size=70, file_name="sales.csv")
    call = ToolCall(id="c1", name="sales_chart", arguments={})
    history = [
        user("sales chart"),
        Message(role=Role.MODEL, tool_calls=[call]),
        Message(
            role=Role.TOOL,
            tool_call_id="c1",
            content=f"Chart of May ready.\n{attachment_note(part)}",
            parts=[part],
        ),
    ]
    content, _ = await ask(history, [])
    assert content == f"{OFFLINE_PREFIX}I checked sales chart: Chart of May ready."


async def test_a_question_is_looked_up_in_the_knowledge_base_and_the_answer_cites_it() -> None:
    from bot.knowledge_tools import search_knowledge

    desk = Agent("Desk", "Answer.", tools=[search_knowledge])
    question = user("How long  do refunds take?")
    _, calls = await ask([question], desk.tool_specs(), agent="Desk")
    assert [(c.name, c.arguments) for c in calls] == [
        ("search_knowledge", {"query": "How long do refunds take?"})
    ]
    passage = {"source": "returns.md", "heading": "Returns › Refunds", "score": 2.1}
    found = json.dumps({"passages": [{**passage, "text": "Refunds take 5 days."}]})
    asked = Message(role=Role.MODEL, tool_calls=[calls[0]])
    result = Message(role=Role.TOOL, content=found, tool_call_id=calls[0].id, name=calls[0].name)
    content, _ = await ask([question, asked, result], desk.tool_specs(), agent="Desk")
    assert content == (
        f"{OFFLINE_PREFIX}According to returns.md, Returns › Refunds: Refunds take 5 days. "
        "(source: returns.md)"
    )
    nothing = Message(
        role=Role.TOOL, content='{"passages": []}', tool_call_id=calls[0].id, name=calls[0].name
    )
    content, _ = await ask([question, asked, nothing], desk.tool_specs(), agent="Desk")
    assert content == f"{OFFLINE_PREFIX}I found nothing about that in our documents."
    # A greeting is no question: echoed, not looked up.
    content, calls = await ask([user("hello there")], desk.tool_specs(), agent="Desk")
    assert calls == [] and content is not None and "hello there" in content
