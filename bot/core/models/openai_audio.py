"""The OpenAI-compatible audio endpoints' shared client: one lazily made SDK client,
one deadline, and the SDK's errors translated into ``ModelError`` where they enter.

Speech to text (``transcription``) and text to speech (``speech``) differ only in
the request they make; the key is never shown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from bot.errors import ModelError

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIAudioClient"]

T = TypeVar("T")


class OpenAIAudioClient:
    """Base of the clients of ``/audio/*`` at ``OPENAI_BASE_URL``."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
    ) -> None:
        self.api_key = api_key
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self._client: object | None = None

    def __repr__(self) -> str:  # never shows the key
        return f"{type(self).__name__}(base_url={self.base_url!r})"

    async def _request(self, what: str, request: Callable[[openai.AsyncOpenAI], Awaitable[T]]) -> T:
        """Run ``request`` with the client, within ``timeout``; ``what`` names the call
        in the error (``"speech synthesis"``, ``"transcription"``)."""
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
                return await request(client)
        except TimeoutError as exc:
            raise ModelError(f"{what} timed out", retryable=True) from exc
        except openai.APIStatusError as exc:
            raise ModelError(
                f"{what} service answered HTTP {exc.status_code}",
                status_code=exc.status_code,
                retryable=exc.status_code >= 500 or exc.status_code == 429,
            ) from exc
        except openai.OpenAIError as exc:
            raise ModelError(f"{what} failed: {type(exc).__name__}") from exc

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        client, self._client = self._client, None
        close = getattr(client, "close", None)
        if close is not None:
            await close()
