"""Tracing: one OpenTelemetry trace per inbound message, off unless ``OTEL_*`` asks.

- ``bot.tracing.spans``: the helpers the bot calls (no-ops while off);
- ``bot.tracing.otel``: the live backend over OpenTelemetry's API (imported only on);
- ``bot.tracing.setup``: reading the ``OTEL_*`` environment, the SDK and exporter;
- ``bot.tracing.names``: Chatflow's span and attribute names;
- ``bot.tracing.genai``: the GenAI conventions' attributes of agent, model and tool spans.
"""

from __future__ import annotations

from bot.tracing.setup import Tracing, TracingPlan, configure, plan

__all__ = ["Tracing", "TracingPlan", "configure", "plan"]
