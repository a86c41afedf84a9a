"""How the offline demo model answers photos, voice notes, documents, locations and contacts.

Plainly, from what it was given: a photo's size and caption, a voice note's
transcript, a document's name and first words. So the no-key demo shows the
media path end to end, and says what a real model would do instead.
"""

from __future__ import annotations

from bot.core.messages import (
    AudioPart,
    ContactPart,
    DocumentPart,
    ImagePart,
    LocationPart,
    Message,
    MessagePart,
    TextPart,
)
from bot.core.parts import describe_size

__all__ = ["describe_media", "spoken_text"]

_QUOTE_CHARS = 200


def _quote(text: str) -> str:
    flat = " ".join(text.split())
    if len(flat) > _QUOTE_CHARS:
        flat = flat[: _QUOTE_CHARS - 1] + "…"
    return f'"{flat}"'


def _describe(part: MessagePart, caption: str) -> str:
    if isinstance(part, ImagePart):
        with_caption = f" with the caption {_quote(caption)}" if caption else " without a caption"
        return (
            f"I received a photo ({describe_size(part.size)}){with_caption}; "
            "a vision model would describe it."
        )
    if isinstance(part, AudioPart):
        what = "a voice note" if part.voice else "an audio file"
        if part.transcript is None:
            return f"I received {what} ({describe_size(part.size)}) but could not transcribe it."
        return (
            f"I received {what} ({describe_size(part.size)}) that says: {_quote(part.transcript)}."
        )
    if isinstance(part, DocumentPart):
        name = f" {_quote(part.file_name)}" if part.file_name else ""
        head = f"I received the document{name} ({describe_size(part.size)})"
        if not part.text or not part.text.strip():
            return f"{head}, but found no text in it."
        return f"{head}, which begins: {_quote(part.text)}."
    if isinstance(part, LocationPart):
        where = ", ".join(x for x in (part.name, part.address) if x)
        return f"I received a location: {part.latitude:.5f}, {part.longitude:.5f}" + (
            f" ({where})." if where else "."
        )
    if isinstance(part, ContactPart):
        return f"I received a contact card for {part.name}."
    assert isinstance(part, TextPart)
    return ""


def describe_media(message: Message) -> str:
    """One sentence per part of ``message`` (empty when it has none)."""
    caption = (message.content or "").strip()
    sentences = [_describe(part, caption) for part in message.parts]
    return " ".join(s for s in sentences if s)


def spoken_text(message: Message) -> str:
    """The message's text plus its voice-note transcripts: what the user *said*."""
    pieces = [message.content or ""]
    pieces.extend(p.transcript for p in message.parts if isinstance(p, AudioPart) and p.transcript)
    return " ".join(p for p in pieces if p)
