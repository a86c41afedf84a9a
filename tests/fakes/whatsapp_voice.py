"""Voice notes for ``FakeWhatsAppServer``: the ``audio`` message with ``"voice": true``.

Meta plays an ``audio`` message as a voice note when it says ``"voice": true``
and names an uploaded OGG file with the Opus codec; ``audio_problem`` refuses
any other shape with the (#100) message Meta gives, so the bot's payload is
checked as the Cloud API checks it.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["audio_problem", "is_voice_note"]


class _Upload(Protocol):
    @property
    def data(self) -> bytes: ...

    @property
    def mime_type(self) -> str: ...


def audio_problem(body: dict[str, Any], upload: _Upload | None) -> str | None:
    """Why Meta would refuse ``body`` (an ``audio`` message), or ``None``."""
    audio = body.get("audio")
    if not isinstance(audio, dict) or not audio.get("id"):
        return "(#100) The parameter audio['id'] is required."
    if upload is None:
        return "(#100) Invalid parameter: the media id is not an uploaded media"
    voice = audio.get("voice", False)
    if not isinstance(voice, bool):
        return "(#100) Invalid parameter audio['voice']"
    if voice and (
        not upload.mime_type.startswith("audio/ogg")
        or not upload.data.startswith(b"OggS")
        or b"OpusHead" not in upload.data[:512]
    ):
        return "(#100) Invalid parameter: a voice message must be OGG with the OPUS codec"
    return None


def is_voice_note(body: dict[str, Any]) -> bool:
    """Whether an accepted message is a voice note."""
    audio = body.get("audio")
    return body.get("type") == "audio" and isinstance(audio, dict) and audio.get("voice") is True
