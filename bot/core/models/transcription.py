"""Speech to text through the OpenAI-compatible ``/audio/transcriptions`` endpoint.

OpenAI (``whisper-1``, ``gpt-4o-mini-transcribe``), Groq and local servers
such as faster-whisper-server speak the same API, so one client covers them
all, at ``OPENAI_BASE_URL`` with ``TRANSCRIPTION_MODEL``. The audio goes as
received: Whisper-style APIs accept OGG/Opus, so there is no conversion step.
The transcript is never logged.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from bot.errors import ModelError

__all__ = ["DEFAULT_TRANSCRIPTION_MODEL", "OpenAITranscriber", "Transcriber"]

DEFAULT_TRANSCRIPTION_MODEL = "whisper-1"
"""``TRANSCRIPTION_MODEL`` when none is set."""


@runtime_checkable
class Transcriber(Protocol):
    """Turns recorded speech into text."""

    async def transcribe(self, data: bytes, *, file_name: str, mime_type: str) -> str:
        """The words spoken in ``data``; ``ModelError`` when the service fails."""
        ...


class OpenAITranscriber:
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
        self.api_key = api_key
        self.base_url = base_url
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self._client: object | None = None

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAITranscriber(base_url={self.base_url!r}, model={self.model!r})"

    async def transcribe(self, data: bytes, *, file_name: str, mime_type: str) -> str:
        """Send ``data`` as the multipart ``file`` field and return the text."""
        # Deferred, as in routing: the SDK is slow to import and only needed here.
        import openai

        client = self._client
        if not isinstance(client, openai.AsyncOpenAI):
            client = openai.AsyncOpenAI(
                api_key=self.api_key,
                base_url=self.base_url,
                max_retries=self.max_retries,
                timeout=self.timeout,
            )
            self._client = client
        try:
            async with asyncio.timeout(self.timeout):
                result = await client.audio.transcriptions.create(
                    model=self.model,
                    file=(file_name, data, mime_type),
                    response_format="json",
                )
        except TimeoutError as exc:
            raise ModelError("transcription timed out", retryable=True) from exc
        except openai.APIStatusError as exc:
            raise ModelError(
                f"transcription service answered HTTP {exc.status_code}",
                status_code=exc.status_code,
                retryable=exc.status_code >= 500 or exc.status_code == 429,
            ) from exc
        except openai.OpenAIError as exc:
            raise ModelError(f"transcription failed: {type(exc).__name__}") from exc
        return str(result.text).strip()

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        client, self._client = self._client, None
        close = getattr(client, "close", None)
        if close is not None:
            await close()
