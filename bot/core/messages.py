"""Conversation messages: the unit stored in a session's history."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Message", "Role", "ToolCall"]


class Role(StrEnum):
    """Who produced a message."""

    SYSTEM = "system"
    USER = "user"
    MODEL = "model"
    TOOL = "tool"


def _new_id() -> str:
    return uuid.uuid4().hex


def _now() -> datetime:
    return datetime.now(UTC)


class ToolCall(BaseModel):
    """A tool invocation requested by the model."""

    model_config = ConfigDict(frozen=True)

    id: str
    """Provider-assigned call id; the TOOL result carries it back."""
    name: str
    """Name of the tool (or ``transfer_to_<agent>`` handoff)."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Decoded JSON arguments."""


class Message(BaseModel):
    """One entry of a conversation history. Round-trips through JSON."""

    model_config = ConfigDict(frozen=True)

    role: Role
    """Who produced it."""
    content: str | None = None
    """Text; ``None`` for a MODEL message that only calls tools."""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """Tool calls requested (MODEL messages only)."""
    tool_call_id: str | None = None
    """The call this message answers (TOOL messages only)."""
    name: str | None = None
    """Tool name for TOOL messages; optional speaker name otherwise."""
    agent: str | None = None
    """Name of the agent that produced it (MODEL and TOOL messages)."""
    id: str = Field(default_factory=_new_id)
    """Unique id of this message."""
    created_at: datetime = Field(default_factory=_now)
    """When it was created (UTC)."""
