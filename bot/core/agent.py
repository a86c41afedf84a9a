"""Agents: instructions, a model, tools and handoffs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Agent"]


@dataclass(eq=False)
class Agent:
    """A persona the model plays: what it is told, what it may call, whom it may hand to."""

    name: str
    """Unique name within a Runner; stored in sessions as the active agent."""
    instructions: str
    """System prompt for this agent."""
    model: str | None = None
    """Model name (``"gpt-4o"``, ``"gemini-2.5-flash"``, ``"ollama/llama3"``,
    ``"offline"``); ``None`` uses the Runner's default."""
    tools: Sequence[Any] = field(default_factory=tuple)
    """Tools this agent may call (functions decorated with ``@tool``)."""
    handoffs: Sequence[Agent] = field(default_factory=tuple)
    """Agents this one may transfer the conversation to."""
    handoff_description: str | None = None
    """What this agent is for, shown to agents that may hand off to it."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("Agent name must be non-empty")
        self.tools = tuple(self.tools)
        self.handoffs = tuple(self.handoffs)
