"""Agents for the proof suite (``AGENTS_MODULE=tests.e2e.proof_agents``).

Deliberately small and deterministic: the fake OpenAI server (see
``proof_world.ProofModel``) decides what the model "says"; these agents only
give it a tool that succeeds, a tool that raises, a tool that kills the
process (a poison message), and a handoff.
"""

from __future__ import annotations

import os
import signal

from bot.core.agent import Agent, tool

__all__ = [
    "crash_process",
    "explode",
    "front_desk",
    "lookup_order",
    "specialist",
    "starting_agent",
]


@tool
def lookup_order(order_id: str) -> dict[str, str]:
    """Look up an order.

    Args:
        order_id: The order number.
    """
    return {"order_id": order_id, "status": "in transit"}


@tool
def explode(reason: str) -> str:
    """A tool that always fails (the runner must turn this into an error result).

    Args:
        reason: Anything.
    """
    raise RuntimeError(f"exploded: {reason}")


@tool
def crash_process() -> str:
    """Kill the bot process on the spot, as a poison message might (SIGKILL: no clean-up)."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


specialist = Agent(
    name="Specialist",
    instructions="You are the specialist. Answer briefly.",
    tools=[lookup_order],
    handoff_description="handles anything the front desk hands over",
)
"""Reached only by a handoff."""

front_desk = Agent(
    name="Front Desk",
    instructions="You are the front desk. Answer briefly.",
    tools=[lookup_order, explode, crash_process],
    handoffs=[specialist],
)
"""Where every conversation starts."""

specialist.handoffs = (front_desk,)

starting_agent: Agent = front_desk
"""What ``python -m bot run`` loads."""
