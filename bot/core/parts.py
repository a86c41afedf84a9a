"""How message parts read as text: for models, for models without vision, for the demo model.

Images are the only part a model receives as more than text (provider clients
turn ``ImagePart`` into their own content blocks). Everything else reads as a
short bracketed line, so any text model understands it: a voice note becomes
the user's words marked ``[voice note]``, a document its file name and text.
"""

from __future__ import annotations

from collections.abc import Sequence

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

__all__ = ["NO_VISION_NOTE", "describe_size", "part_text", "text_with_parts", "without_images"]

NO_VISION_NOTE = "(I can't see images, so I could only read the text that came with your photo.)"
"""Put before the answer when an image reached an agent built with ``vision=False``."""


def describe_size(size: int) -> str:
    """``34 KB``, ``1.2 MB``: a size as a person says it."""
    if size < 1024:
        return f"{size} B"
    if size < 1024 * 1024:
        return f"{round(size / 1024)} KB"
    return f"{size / (1024 * 1024):.1f} MB"


def _name(part: ImagePart | AudioPart | DocumentPart) -> str:
    return f' "{part.file_name}"' if part.file_name else ""


def part_text(part: MessagePart, *, image_seen: bool = True) -> str:
    """One part as the text a model reads.

    ``image_seen`` says whether the image itself goes along (a vision model's
    current message); otherwise the line says that it cannot be seen.
    """
    if isinstance(part, TextPart):
        return part.text
    if isinstance(part, ImagePart):
        if image_seen:
            return f"[photo{_name(part)} attached]"
        return f"[the user sent a photo{_name(part)}, which you cannot see]"
    if isinstance(part, AudioPart):
        label = "voice note" if part.voice else f"audio file{_name(part)}"
        if part.transcript is None:
            return f"[{label}: it could not be transcribed]"
        return f"[{label}] {part.transcript}"
    if isinstance(part, DocumentPart):
        header = f"[document{_name(part)}, {part.mime_type}, {describe_size(part.size)}]"
        if part.text is None:
            return f"{header} (no text could be read from it)"
        cut = "\n[... the rest of the document was cut]" if part.truncated else ""
        return f"{header}\n{part.text}{cut}"
    if isinstance(part, LocationPart):
        where = ", ".join(x for x in (part.name, part.address) if x)
        suffix = f" ({where})" if where else ""
        return f"[location: {part.latitude:.6f}, {part.longitude:.6f}{suffix}]"
    assert isinstance(part, ContactPart)
    phones = ", ".join(part.phones)
    return f"[contact: {part.name}{': ' + phones if phones else ''}]"


def text_with_parts(message: Message, *, images_seen: bool = True) -> str:
    """The message's text followed by one line (or block) per part."""
    pieces = [message.content] if message.content else []
    pieces.extend(part_text(p, image_seen=images_seen) for p in message.parts)
    return "\n\n".join(pieces)


def without_images(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with every image replaced by a line saying it cannot be seen.

    For an agent without vision: its provider would refuse an image (and a
    session holding one would fail on every later turn).
    """
    result: list[Message] = []
    for message in messages:
        if not any(isinstance(p, ImagePart) for p in message.parts):
            result.append(message)
            continue
        parts: list[MessagePart] = [
            TextPart(text=part_text(p, image_seen=False)) if isinstance(p, ImagePart) else p
            for p in message.parts
        ]
        result.append(message.model_copy(update={"parts": parts}))
    return result
