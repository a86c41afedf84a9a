"""Agents for the buttons end-to-end tests (``AGENTS_MODULE=tests.fakes.button_agents``).

One agent with three tools, as an operator's shop would have: ``offer_sizes``
(two buttons, one with a value other than its label), ``offer_flavours``
(five choices: a WhatsApp list message) and ``offer_days`` (a poll any member
of a group may answer).
"""

from __future__ import annotations

from bot import Agent, Button, ToolOutput, tool

__all__ = ["FLAVOURS", "starting_agent"]

FLAVOURS = ("Vanilla", "Chocolate", "Strawberry", "Pistachio", "Lemon <sorbet>")
"""The five choices of ``offer_flavours`` (one with markup in it: shown as typed)."""


@tool
def offer_sizes() -> ToolOutput:
    """Offer the sizes as buttons."""
    return ToolOutput("Sizes offered.", buttons=["Small *S*", Button("Large", value="size:L")])


@tool
def offer_flavours() -> ToolOutput:
    """Offer the flavours as buttons."""
    return ToolOutput("Flavours offered.", buttons=list(FLAVOURS))


@tool
def offer_days() -> ToolOutput:
    """Ask the whole group which day suits."""
    return ToolOutput("Days offered.", buttons=["Monday", "Tuesday"], anyone_may_tap=True)


starting_agent = Agent(
    name="Shop",
    instructions="You sell ice cream; offer choices with your tools.",
    tools=[offer_sizes, offer_flavours, offer_days],
)
"""What ``python -m bot run`` loads."""
