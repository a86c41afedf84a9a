"""Agents: tool wrapping, handoff tool names and specs, validation."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.core.agent import Agent, FunctionTool, handoff_tool_name, snake_case, tool


@tool
def lookup_order(order_id: str) -> str:
    """Look up an order."""
    return order_id


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("OrderTracking", "transfer_to_order_tracking"),
        ("Billing Agent", "transfer_to_billing_agent"),
        ("billing-agent", "transfer_to_billing_agent"),
        ("HTTPSupport", "transfer_to_http_support"),
        ("Facturación", "transfer_to_facturacion"),
        ("Agent2Go", "transfer_to_agent2_go"),
    ],
    ids=["camel", "space", "dash", "acronym", "accent", "digits"],
)
def test_handoff_tool_names(name: str, expected: str) -> None:
    assert handoff_tool_name(name) == expected


@given(st.text(min_size=1, max_size=200))
def test_handoff_tool_names_are_always_valid_provider_names(name: str) -> None:
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", handoff_tool_name(name))
    assert snake_case(name) == snake_case(name)  # deterministic


def test_plain_functions_are_wrapped_as_tools() -> None:
    def business_hours() -> str:
        """Opening hours."""
        return "9-17"

    agent = Agent("Support", "Help.", tools=[business_hours, lookup_order])
    assert all(isinstance(t, FunctionTool) for t in agent.tools)
    assert [t.name for t in agent.function_tools] == ["business_hours", "lookup_order"]
    assert agent.find_tool("lookup_order") is lookup_order
    assert agent.find_tool("nope") is None


def test_tool_specs_include_handoffs_with_target_description() -> None:
    billing = Agent("Billing Agent", "Bills.", handoff_description="Invoices and refunds.")
    triage = Agent("Triage", "Route.", tools=[lookup_order], handoffs=[billing])
    specs = triage.tool_specs()
    assert [s.name for s in specs] == ["lookup_order", "transfer_to_billing_agent"]
    handoff = specs[1]
    assert handoff.handoff_target == "Billing Agent"
    assert "Billing Agent" in handoff.description
    assert "Invoices and refunds." in handoff.description
    assert handoff.parameters == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }
    assert specs[0].handoff_target is None
    assert triage.find_handoff("transfer_to_billing_agent") is not None
    assert triage.find_handoff("transfer_to_billing_agent").target is billing  # type: ignore[union-attr]


def test_handoff_names_that_collide_are_rejected() -> None:
    with pytest.raises(ValueError, match="clashes"):
        Agent("T", "", handoffs=[Agent("Billing Agent", ""), Agent("billing-agent", "")])


def test_duplicate_tool_names_are_rejected() -> None:
    @tool(name="lookup_order")
    def other(order_id: str) -> str:
        """Other."""
        return ""

    with pytest.raises(ValueError, match="two tools"):
        Agent("A", "", tools=[lookup_order, other])


@pytest.mark.parametrize("name", ["", "   "], ids=["empty", "blank"])
def test_empty_agent_name_is_rejected(name: str) -> None:
    with pytest.raises(ValueError):
        Agent(name, "")


def test_non_agent_handoff_is_rejected() -> None:
    with pytest.raises(TypeError):
        Agent("A", "", handoffs=["Billing"])  # type: ignore[list-item]


def test_reachable_agents_follow_cycles_once() -> None:
    billing = Agent("Billing", "")
    triage = Agent("Triage", "", handoffs=[billing])
    billing.handoffs = (triage,)
    assert triage.reachable_agents() == [triage, billing]


def test_constructor_signature_is_kept() -> None:
    agent = Agent("A", "Be nice.", "gpt-4o", (), (), "Does things")
    assert (agent.model, agent.handoff_description) == ("gpt-4o", "Does things")
