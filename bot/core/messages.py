"""Conversation messages: the unit stored in a session's history."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from bot.core.ids import new_hex_id

__all__ = [
    "AudioPart",
    "ContactPart",
    "DocumentPart",
    "ImagePart",
    "LocationPart",
    "MediaPart",
    "Message",
    "MessagePart",
    "Role",
    "TextPart",
    "ToolCall",
]


class Role(StrEnum):
    """Who produced a message."""

    SYSTEM = "system"
    USER = "user"
    MODEL = "model"
    TOOL = "tool"


def _new_id() -> str:
    # Unique, not secret: no CSPRNG system call for every message.
    return new_hex_id()


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


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True)


class TextPart(_Part):
    """Extra text that came with a message (e.g. a second caption)."""

    kind: Literal["text"] = "text"
    text: str
    """The text."""


class _Stored(_Part):
    """A part whose bytes live in the media store (``bot.core.media_store``), not in the row."""

    sha256: str
    """Content address of the bytes in ``DATA_DIR/media/``."""
    mime_type: str
    """MIME type as checked on arrival (``image/jpeg``, ``audio/ogg``...)."""
    size: int
    """Size in bytes."""
    file_name: str | None = None
    """The file name the sender gave, if any (never logged)."""


class ImagePart(_Stored):
    """A photo or image; vision models receive its bytes."""

    kind: Literal["image"] = "image"


class AudioPart(_Stored):
    """A voice note or audio file, with its transcript."""

    kind: Literal["audio"] = "audio"
    voice: bool = False
    """True for a voice note (recorded in the chat), False for an audio file."""
    transcript: str | None = None
    """What was said; ``None`` when it could not be transcribed."""


class DocumentPart(_Stored):
    """A file (PDF, text...), with the text extracted from it."""

    kind: Literal["document"] = "document"
    text: str | None = None
    """Extracted text (truncated); ``None`` when none could be read."""
    truncated: bool = False
    """True when ``text`` was cut to the budget."""


class LocationPart(_Part):
    """A shared location or venue."""

    kind: Literal["location"] = "location"
    latitude: float
    longitude: float
    name: str | None = None
    """Venue name, if any."""
    address: str | None = None
    """Venue address, if any."""


class ContactPart(_Part):
    """A shared contact card."""

    kind: Literal["contact"] = "contact"
    name: str
    """Display name."""
    phones: list[str] = Field(default_factory=list)
    """Phone numbers as given."""


MessagePart = Annotated[
    TextPart | ImagePart | AudioPart | DocumentPart | LocationPart | ContactPart,
    Field(discriminator="kind"),
]
"""One attachment of a message; ``kind`` tells which."""
MediaPart = ImagePart | AudioPart | DocumentPart
"""The parts whose bytes are in the media store."""


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
    parts: list[MessagePart] = Field(default_factory=list)
    """Attachments (USER messages): images, audio, documents, locations, contacts.
    Rows written before parts existed load with none."""


def unique_call_ids(
    calls: list[ToolCall], invalid: Mapping[str, str]
) -> tuple[list[ToolCall], dict[str, str]]:
    """Give every tool call of one answer a distinct, non-empty id (results pair by id).

    Returns the calls and the invalid-call reasons keyed by the final ids.
    """
    seen: set[str] = set()
    result: list[ToolCall] = []
    reasons: dict[str, str] = {}
    for call in calls:
        original = call.id
        if not call.id or call.id in seen:
            call = call.model_copy(update={"id": f"call_{uuid.uuid4().hex[:24]}"})
        seen.add(call.id)
        result.append(call)
        if original in invalid:
            reasons[call.id] = invalid[original]
    return result, reasons
