"""Tracing: one OpenTelemetry trace per inbound message, off unless ``OTEL_*`` asks.

- ``bot.tracing.spans``: the helpers the bot calls (no-ops while off);
- ``bot.tracing.recorder``: the live backend, light span records (imported only on);
- ``bot.tracing.export``: the queue and thread feeding the exporter process;
- ``bot.tracing.child``: the exporter process (the SDK and its OTLP/HTTP exporter);
- ``bot.tracing.setup``: reading the ``OTEL_*`` environment, switching tracing on and off;
- ``bot.tracing.names``: Chatflow's span and attribute names;
- ``bot.tracing.genai``: the GenAI conventions' attributes of agent, model and tool spans.
"""

from __future__ import annotations

from bot.tracing.setup import Tracing, TracingPlan, configure, plan

__all__ = ["Tracing", "TracingPlan", "configure", "plan"]
