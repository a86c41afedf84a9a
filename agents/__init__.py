"""The example agents: a front desk that routes to two specialists.

The bot imports ``starting_agent`` from ``AGENTS_MODULE`` when it is set, else
from the ``agents/`` folder of its working directory (this one, in a checkout),
else from the examples it ships (this package, as ``bot.example_agents``). The
graph is hub and spoke::

    Triage ──> Order Tracking ──> Triage
           └─> Billing        ──> Triage

Handoffs that point back (Order Tracking -> Triage) make a cycle, so they are
assigned after the agents exist; the Runner validates the graph when it starts.
See ``agents/README.md`` to add your own agents, tools and handoffs.
"""

from __future__ import annotations

from bot import Agent

from .billing import billing
from .orders import order_tracking
from .triage import triage

__all__ = ["billing", "order_tracking", "starting_agent", "triage"]

triage.handoffs = (order_tracking, billing)
order_tracking.handoffs = (triage,)
billing.handoffs = (triage,)

starting_agent: Agent = triage
"""Where every new conversation starts."""
