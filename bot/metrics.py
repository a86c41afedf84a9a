"""Prometheus metrics of one bot process (served at ``/metrics``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from bot.core.models.base import Usage

__all__ = ["Metrics"]


def _registry() -> CollectorRegistry:
    return CollectorRegistry(auto_describe=True)


@dataclass
class Metrics:
    """The counters the gateway updates; one registry per instance so tests stay isolated."""

    registry: CollectorRegistry = field(default_factory=_registry)
    """Where the metrics live."""

    def __post_init__(self) -> None:
        r = self.registry
        self.messages_in = Counter(
            "chatflow_messages_in", "Inbound messages accepted", ["platform"], registry=r
        )
        self.dedup_hits = Counter(
            "chatflow_dedup_hits",
            "Inbound messages dropped as duplicates",
            ["platform"],
            registry=r,
        )
        self.ignored = Counter(
            "chatflow_messages_ignored",
            "Inbound messages not addressed to the bot",
            ["platform"],
            registry=r,
        )
        self.busy = Counter(
            "chatflow_messages_busy",
            "Inbound messages pushed back because the queue was full",
            ["platform"],
            registry=r,
        )
        self.rate_limited = Counter(
            "chatflow_messages_rate_limited",
            "Inbound messages stored but not answered: their sender was over the rate limit",
            ["platform"],
            registry=r,
        )
        self.pairing_requests = Counter(
            "chatflow_pairing_requests",
            "Messages from unknown senders answered with a pairing code",
            ["platform"],
            registry=r,
        )
        self.turns = Counter(
            "chatflow_turns", "Turns finished, by outcome", ["outcome"], registry=r
        )
        self.replies_delivered = Counter(
            "chatflow_replies_delivered", "Replies delivered", ["platform"], registry=r
        )
        self.send_failures = Counter(
            "chatflow_send_failures", "Failed send attempts", ["platform"], registry=r
        )
        self.resends = Counter(
            "chatflow_resends",
            "Replies sent again after a restart or a failure",
            ["platform"],
            registry=r,
        )
        self.abandoned = Counter(
            "chatflow_abandoned", "Replies given up on", ["platform"], registry=r
        )
        self.scheduled_fired = Counter(
            "chatflow_scheduled_fired", "Scheduled messages sent at their time", registry=r
        )
        self.scheduled_dropped = Counter(
            "chatflow_scheduled_dropped",
            "Scheduled messages not sent: over SCHEDULE_MAX_LATENESS_SECONDS late",
            registry=r,
        )
        self.scheduled_failed = Counter(
            "chatflow_scheduled_failed",
            "Scheduled jobs set aside (state failed): their next time could not be computed, "
            "or firing them failed; the other jobs go on",
            registry=r,
        )
        self.scheduled_skipped = Counter(
            "chatflow_scheduled_skipped",
            "Scheduled occurrences not sent, by reason: over budget (the person who scheduled "
            "a run_agent job is over MAX_TOKENS_PER_SENDER_PER_DAY), no access (they were "
            "revoked: the job is cancelled)",
            ["reason"],
            registry=r,
        )
        self.approvals = Counter(
            "chatflow_approvals",
            "Tool calls that waited for approval, by event: requested, approved, denied, expired",
            ["event"],
            registry=r,
        )
        self.taps = Counter(
            "chatflow_taps",
            "Button taps, by outcome: accepted (as a message), intercepted (an approval's "
            "decision), duplicate (a redelivery), refused (expired, forged, used or lost a race)",
            ["outcome"],
            registry=r,
        )
        self.voice_replies = Counter(
            "chatflow_voice_replies",
            "Replies to be spoken, by outcome: synthesized, failed (sent as text), "
            "refused_by_chat (the chat accepts no voice notes: text from then on)",
            ["outcome"],
            registry=r,
        )
        self.turn_duration = Histogram(
            "chatflow_turn_seconds",
            "Time to play one turn (model and tools)",
            registry=r,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
        )
        # One family for every token count: ``kind`` is which count (prompt, cached_prompt,
        # completion, reasoning), ``call`` what the model call was for (chat,
        # transcription, compaction). Cached and reasoning tokens are also inside
        # prompt and completion, as providers count them: sum prompt + completion only.
        self.tokens = Counter(
            "chatflow_tokens",
            "Tokens the model provider reported, by agent, kind of count and kind of call",
            ["agent", "kind", "call"],
            registry=r,
        )
        self.over_budget = Counter(
            "chatflow_messages_over_budget",
            "Inbound messages stored but not answered: their sender was over "
            "MAX_TOKENS_PER_SENDER_PER_DAY",
            ["platform"],
            registry=r,
        )
        # Read at each scrape (the gateway sets the function), never a stale last value.
        self.queued = Gauge("chatflow_queued_messages", "Messages waiting for a worker", registry=r)
        self.turns_running = Gauge(
            "chatflow_turns_running",
            "Turns inside their conversation (model, tools, save)",
            registry=r,
        )
        self.connection_waiters = Gauge(
            "chatflow_database_connection_waiters",
            "Tasks (turns' short transactions among them) waiting for a pooled database connection",
            registry=r,
        )
        self.turns_waiting = Gauge(
            "chatflow_turns_waiting",
            "Turns waiting for their conversation: an earlier turn of it, here or in "
            "another process (PostgreSQL)",
            registry=r,
        )
        self._in_by_platform: dict[str, Counter] = {}

    def count_in(self, platform: str) -> None:
        """Count one accepted message of ``platform`` in ``messages_in``."""
        # Once per message: ``labels()`` checks and locks on every call, a bound child does not.
        child = self._in_by_platform.get(platform)
        if child is None:
            child = self._in_by_platform[platform] = self.messages_in.labels(platform)
        child.inc()

    def count_tokens(self, agent: str, call: str, usage: Usage) -> None:
        """Add one model call's ``usage`` to ``chatflow_tokens_total`` (zeros are not added)."""
        for kind, value in (
            ("prompt", usage.input_tokens),
            ("cached_prompt", usage.cached_input_tokens),
            ("completion", usage.output_tokens),
            ("reasoning", usage.reasoning_tokens),
        ):
            if value:
                self.tokens.labels(agent, kind, call).inc(value)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
