"""Agents for the approvals end-to-end tests (``AGENTS_MODULE=tests.fakes.approval_agents``).

``refund`` needs approval (its own question) and leaves one line per run in
``DATA_DIR/refunds.log``,
so a test counts the runs of a tool that ran in the bot's own process.
"""

from __future__ import annotations

import os
from pathlib import Path

from bot import Agent, ToolContext, tool

__all__ = ["RUNS_FILE", "runs", "starting_agent"]

RUNS_FILE = "refunds.log"
"""Under ``DATA_DIR``: one line per run of ``refund``."""


def runs(data_dir: Path) -> list[str]:
    """The runs of ``refund`` so far: ``<order_id> <amount> <inbound message id>``."""
    path = data_dir / RUNS_FILE
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


@tool(needs_approval="May I refund order {order_id} for {amount:.2f}?")
def refund(ctx: ToolContext, order_id: str, amount: float) -> str:
    """Refund an order (asks the customer first, in its own words).

    Args:
        order_id: The order number.
        amount: How much to refund.
    """
    path = Path(os.environ.get("DATA_DIR", "data")) / RUNS_FILE
    with path.open("a", encoding="utf-8") as handle:
        handle.write(f"{order_id} {amount} {ctx.inbound_message_id}\n")
    return f"refunded {amount} on order {order_id}"


starting_agent = Agent(
    name="Billing",
    instructions="You refund orders with the refund tool.",
    tools=[refund],
)
"""What ``python -m bot run`` loads."""
