"""The offline demo model: labelled, deterministic rules for tools, handoffs and echo."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from bot.core.agent import Agent, tool
from bot.core.messages import Message, Role, ToolCall
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
