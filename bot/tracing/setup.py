"""Switching tracing on from the standard ``OTEL_*`` environment, and off at exit.

Tracing is on when an OTLP endpoint is set (``OTEL_EXPORTER_OTLP_ENDPOINT``, or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` used as is) or ``OTEL_TRACES_EXPORTER=console``,
unless ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``. Everything else
is OpenTelemetry's own reading of the environment: ``OTEL_EXPORTER_OTLP_HEADERS``
(and ``..._TRACES_HEADERS``), ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER`` / ``..._ARG``, ``OTEL_BSP_*`` (the batch's schedule delay,
queue and export timeout). Spans are recorded in this process by
``bot.tracing.recorder`` and exported over OTLP/HTTP (protobuf) by the SDK in an
exporter process of their own (``bot.tracing.export``, ``bot.tracing.child``),
never from the event loop nor on this process's GIL.

The ``OTEL_*`` names may also be in the ``.env`` file the settings come from; the
process environment wins, as for every setting. Off, none of OpenTelemetry is
imported: the span helpers stay no-ops.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dotenv import dotenv_values

from bot.tracing import spans

__all__ = [
    "CAPTURE_CONTENT_VAR",
    "DEFAULT_SERVICE_NAME",
    "SHUTDOWN_SECONDS",
    "Tracing",
    "TracingPlan",
    "configure",
    "environment",
    "plan",
]

logger = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "chatflow"
CAPTURE_CONTENT_VAR = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class TracingPlan:
    """What the environment asks for (``plan``), before anything is imported."""

    exporter: str | None
    """``"otlp"``, ``"console"``, or ``None`` (tracing off)."""
    endpoint: str | None
    """Where OTLP/HTTP spans are posted (the full ``/v1/traces`` URL)."""
    reason: str
    """Why it is off, or a line saying where traces go."""
    service_name: str
    sampler: str
    capture_content: bool

    @property
    def on(self) -> bool:
        return self.exporter is not None


def environment(env_file: Path = Path(".env")) -> dict[str, str]:
    """The process environment, plus the ``OTEL_*`` names only ``env_file`` sets."""
    merged = dict(os.environ)
    if env_file.is_file():
        for name, value in dotenv_values(env_file).items():
            if name.upper().startswith("OTEL_") and value is not None:
                merged.setdefault(name.upper(), value)
    return merged


def plan(env: Mapping[str, str] | None = None) -> TracingPlan:
    """Read the ``OTEL_*`` settings from ``env`` (default: ``environment()``)."""
    env = environment() if env is None else env
    service = env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    sampler = env.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on"
    if env.get("OTEL_TRACES_SAMPLER_ARG"):
        sampler += f" ({env['OTEL_TRACES_SAMPLER_ARG']})"
    content = _true(env.get(CAPTURE_CONTENT_VAR))

    def off(reason: str) -> TracingPlan:
        return TracingPlan(None, None, reason, service, sampler, False)

    if _true(env.get("OTEL_SDK_DISABLED")):
        return off("off (OTEL_SDK_DISABLED=true)")
    exporter = (env.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip().lower()
    if exporter == "none":
        return off("off (OTEL_TRACES_EXPORTER=none)")
    if exporter == "console":
        return TracingPlan(
            "console", None, f"to stdout (service {service}, sampler {sampler})", service,
            sampler, content,
        )  # fmt: skip
    if exporter != "otlp":
        return off(f"off (OTEL_TRACES_EXPORTER={exporter} is not supported: otlp or console)")
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    if not endpoint:
        return off("off (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces)")
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL"
    )
    note = ""
    if protocol and protocol != "http/protobuf":
        note = f"; OTEL_EXPORTER_OTLP_PROTOCOL={protocol} ignored, only http/protobuf"
    headers = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS")
    auth = ", with headers" if headers else ""
    where = (
        f"OTLP/HTTP to {_shown(endpoint)}{auth} (service {service}, sampler {sampler}"
        f"{', message content captured' if content else ''}){note}"
    )
    return TracingPlan("otlp", endpoint, where, service, sampler, content)


def _shown(endpoint: str) -> str:
    """``endpoint`` fit for the INFO log and doctor: without a password or a query (a
    collector's key may ride in either)."""
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(an unparsable URL)"
    if parts.password is None and not parts.query:
        return endpoint  # nothing to hide: shown as written
    if ":" in host:
        host = f"[{host}]"
    user = f"{parts.username}:***@" if parts.password is not None else ""
    query = "?***" if parts.query else ""
    return f"{parts.scheme}://{user}{host}{'' if port is None else f':{port}'}{parts.path}{query}"


SHUTDOWN_SECONDS = 10.0
"""How long ``Tracing.shutdown`` waits for the exporter process's last export."""


class Tracing:
    """Tracing on: the recorder installed, the exporter process running behind it;
    ``shutdown`` sends what is queued, lets the exporter flush it, and ends it."""

    def __init__(
        self, chosen: TracingPlan, env: Mapping[str, str] | None = None, *, json_logs: bool = False
    ) -> None:
        from bot.tracing.export import ChildExporter
        from bot.tracing.recorder import Recorder, sampler_from

        env = environment() if env is None else env
        self.plan = chosen
        assert chosen.exporter is not None
        self.exporter = ChildExporter(
            chosen.exporter, chosen.endpoint, chosen.service_name, env, json_logs=json_logs
        )
        spans.install(
            Recorder(
                self.exporter.submit, sampler_from(env), capture_content=chosen.capture_content
            )
        )

    def shutdown(self, timeout: float = SHUTDOWN_SECONDS) -> None:
        """Export what is queued and stop (blocking: call it off the event loop)."""
        spans.install(None)
        try:
            self.exporter.shutdown(timeout)
        except Exception as exc:  # the collector's fault never fails a shutdown
            logger.warning("tracing did not shut down cleanly: %s", type(exc).__name__)


def configure(env: Mapping[str, str] | None = None, *, json_logs: bool = False) -> Tracing | None:
    """Switch tracing on if the environment asks (``None``: it stays off, nothing imported).

    ``json_logs``: the exporter process writes its log lines (a collector refusing an
    export, say) as JSON lines, as the bot does, else as the bot's text lines.

    With ``env`` omitted, ``OTEL_*`` names from ``.env`` join the process environment,
    where the SDK reads the rest of them (headers, sampler, batch settings).
    """
    if env is None:
        env = environment()
        for name, value in env.items():
            if name.startswith("OTEL_"):
                os.environ.setdefault(name, value)
    chosen = plan(env)
    if not chosen.on:
        return None
    try:
        tracing = Tracing(chosen, env, json_logs=json_logs)
    except OSError as exc:  # the exporter process could not start: the bot runs untraced
        logger.warning("tracing stays off: its exporter did not start (%s)", type(exc).__name__)
        return None
    logger.info("tracing %s", chosen.reason)
    return tracing
