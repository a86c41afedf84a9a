"""Voice replies: when an answer is also spoken, and how its text is cut for speech.

``VOICE_REPLIES`` sets the mode for every agent; ``Agent(..., voice=Voice(...))``
overrides it (and the voice or TTS model) for one agent. ``off`` never speaks;
``auto`` answers a voice note with a voice note; ``always`` also speaks every
reply in a private chat. Speech APIs take at most ``MAX_SPEECH_CHARS`` of input,
so a longer answer is spoken in parts (``speech_chunks``), one voice note each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "DEFAULT_TTS_MODEL",
    "DEFAULT_TTS_VOICE",
    "MAX_SPEECH_CHARS",
    "Voice",
    "VoiceMode",
    "resolve_voice",
    "speech_chunks",
    "wants_voice",
]

VoiceMode = Literal["off", "auto", "always"]
"""``off``: text only; ``auto``: a voice note is answered by voice; ``always``: every
reply in a private chat too."""

DEFAULT_TTS_MODEL = "gpt-4o-mini-tts"
"""``TTS_MODEL`` when none is set."""
DEFAULT_TTS_VOICE = "alloy"
"""``TTS_VOICE`` when none is set."""
MAX_SPEECH_CHARS = 4096
"""Longest input of one ``/audio/speech`` request (OpenAI's limit)."""

_MODES: frozenset[str] = frozenset(get_args(VoiceMode))


@dataclass(frozen=True, slots=True)
class Voice:
    """How one agent's replies are spoken; a field left ``None`` takes the setting
    (``VOICE_REPLIES``, ``TTS_VOICE``, ``TTS_MODEL``)."""

    mode: VoiceMode | None = None
    """``off``, ``auto`` or ``always``; ``None``: ``VOICE_REPLIES``."""
    voice: str | None = None
    """The speaker (``alloy``, ``nova``...); ``None``: ``TTS_VOICE``."""
    model: str | None = None
    """The speech model; ``None``: ``TTS_MODEL``."""

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in _MODES:
            raise ValueError(f"Voice mode must be off, auto or always, not {self.mode!r}")
        for name in ("voice", "model"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"Voice {name} must be a non-empty string")


def resolve_voice(agent_voice: Voice | None, default: Voice) -> Voice:
    """``agent_voice`` with every unset field taken from ``default`` (the settings)."""
    if agent_voice is None:
        return default
    return Voice(
        mode=agent_voice.mode or default.mode,
        voice=agent_voice.voice or default.voice,
        model=agent_voice.model or default.model,
    )


def wants_voice(mode: VoiceMode | None, *, inbound_voice: bool, private: bool) -> bool:
    """Whether a reply is spoken: ``auto`` when the message was a voice note, ``always``
    also for every reply in a private chat (``off`` and ``None``: never)."""
    if mode == "auto":
        return inbound_voice
    if mode == "always":
        return inbound_voice or private
    return False


def speech_chunks(text: str, limit: int = MAX_SPEECH_CHARS) -> list[str]:
    """``text`` in pieces of at most ``limit`` characters, cut at a paragraph, a
    sentence or a word where one is near, so each voice note ends naturally."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    rest = text.strip()
    chunks: list[str] = []
    while len(rest) > limit:
        window = rest[:limit]
        cut = _best_cut(window)
        chunks.append(window[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        chunks.append(rest)
    return chunks


def _best_cut(window: str) -> int:
    """Where to end a piece of ``window`` (full): the last paragraph, sentence end or
    space in its second half, else the hard limit."""
    half = len(window) // 2
    for separators in (("\n\n",), (". ", "! ", "? ", "\n"), (" ",)):
        best = max(window.rfind(s) for s in separators)
        if best >= half:
            return best + 1
    return len(window)
