"""Speech to text through the OpenAI-compatible ``/audio/transcriptions`` endpoint.

OpenAI (``whisper-1``, ``gpt-4o-mini-transcribe``), Groq and local servers
such as faster-whisper-server speak the same API, so one client covers them
all, at ``OPENAI_BASE_URL`` with ``TRANSCRIPTION_MODEL``. The audio goes as
received: Whisper-style APIs accept OGG/Opus, so there is no conversion step.
The transcript is never logged.

Where the service reports token usage (``gpt-4o-transcribe`` and
``gpt-4o-mini-transcribe`` do; ``whisper-1`` reports seconds of audio or
nothing), ``MeteredTranscriber.transcribe_metered`` hands it back with the
text, so the turn can record it; nothing is estimated when it is not given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from bot.core.models.base import Usage
from bot.core.models.openai_audio import OpenAIAudioClient

if TYPE_CHECKING:
    import openai

__all__ = [
    "DEFAULT_TRANSCRIPTION_MODEL",
    "MeteredTranscriber",
    "OpenAITranscriber",
    "Transcriber",
    "Transcript",
]

DEFAULT_TRANSCRIPTION_MODEL = "whisper-1"
"""``TRANSCRIPTION_MODEL`` when none is set."""


@runtime_checkable
class Transcriber(Protocol):
    """Turns recorded speech into text."""

    async def transcribe(self, data: bytes, *, file_name: str, mime_type: str) -> str:
        """The words spoken in ``data``; ``ModelError`` when the service fails."""
        ...


@dataclass(frozen=True, slots=True)
class Transcript:
    """A transcription's text and the tokens the service reported for it."""

    text: str
    """The words spoken."""
    usage: Usage | None = None
    """Token usage as reported; ``None`` when the service gave none (or gave seconds)."""


@runtime_checkable
class MeteredTranscriber(Transcriber, Protocol):
    """A ``Transcriber`` that also hands back the usage the service reported."""

    async def transcribe_metered(
        self, data: bytes, *, file_name: str, mime_type: str
    ) -> Transcript:
        """Like ``transcribe``, with the usage; ``ModelError`` when the service fails."""
        ...


def _tokens_of(reported: Any) -> Usage | None:
    """Token usage of a transcription response (``{"type": "tokens", ...}``); ``None``
    for a duration (``whisper-1``) or no usage at all."""
    if reported is None or getattr(reported, "type", None) != "tokens":
        return None
    return Usage(
        input_tokens=int(getattr(reported, "input_tokens", 0) or 0),
        output_tokens=int(getattr(reported, "output_tokens", 0) or 0),
        total=int(getattr(reported, "total_tokens", 0) or 0),
    )


class OpenAITranscriber(OpenAIAudioClient):
    """A ``Transcriber`` on the openai SDK's ``audio.transcriptions``."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        model: str = DEFAULT_TRANSCRIPTION_MODEL,
        timeout: float = 60.0,
        max_retries: int = 2,
    ) -> None:
        super().__init__(api_key, base_url, timeout=timeout, max_retries=max_retries)
        self.model = model

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAITranscriber(base_url={self.base_url!r}, model={self.model!r})"

    async def transcribe(self, data: bytes, *, file_name: str, mime_type: str) -> str:
        """Send ``data`` as the multipart ``file`` field and return the text."""
        transcript = await self.transcribe_metered(data, file_name=file_name, mime_type=mime_type)
        return transcript.text

    async def transcribe_metered(
        self, data: bytes, *, file_name: str, mime_type: str
    ) -> Transcript:
        """Send ``data`` as the multipart ``file`` field; the text and the reported usage."""

        async def transcribe(client: openai.AsyncOpenAI) -> Transcript:
            result = await client.audio.transcriptions.create(
                model=self.model, file=(file_name, data, mime_type), response_format="json"
            )
            return Transcript(str(result.text).strip(), _tokens_of(getattr(result, "usage", None)))

        return await self._request("transcription", transcribe)
