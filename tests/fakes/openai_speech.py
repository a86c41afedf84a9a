"""``POST /v1/audio/speech`` for ``FakeOpenAIServer``: real OGG/Opus bytes back.

OpenAI's JSON body (``model``, ``voice``, ``input``, ``response_format``) is
checked as the real endpoint checks it: a missing field or an ``input`` over
4,096 characters is a 400. ``response_format: "opus"`` answers a valid
OGG/Opus stream (``tests.fakes.media_files.ogg_opus_bytes``, longer for a
longer input) with ``Content-Type: audio/ogg``; ``failures`` answers 500s
first; ``hook`` sees each request as it arrives; ``hold_next`` keeps a request
unanswered (to kill the client while it waits for speech).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tests.fakes.media_files import ogg_opus_bytes

__all__ = ["SpeechCall", "SpeechEndpoint"]

MAX_INPUT = 4096


@dataclass(frozen=True)
class SpeechCall:
    """One accepted ``/v1/audio/speech`` request and the audio it got."""

    model: str
    voice: str
    input: str
    response_format: str
    audio: bytes = field(repr=False)


def _error(message: str, status: int) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": None}}
    return JSONResponse(body, status_code=status)


class SpeechEndpoint:
    """The fake's speech endpoint and what it saw (``FakeOpenAIServer.speech``)."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.calls: list[SpeechCall] = []
        """Every request answered with audio, in order."""
        self.requests = 0
        """Every request received (refused ones included)."""
        self.failures = 0
        """Answer this many next requests with a 500 (the service is down)."""
        self.hook: Callable[[dict[str, Any]], None] | None = None
        """Called with each request's body as it arrives."""
        self.not_ogg = False
        """Answer MP3-looking bytes instead of OGG/Opus (a misconfigured server)."""
        self.hold_next = 0
        """Hold this many next requests (``arrived`` is set) until ``release`` is set,
        then answer 500 unrecorded: a client killed meanwhile never got audio."""
        self.arrived = asyncio.Event()
        """Set when a held request arrives."""
        self.release = asyncio.Event()
        """Lets held requests answer (set it before the server stops)."""

    async def handle(self, request: Request) -> Response:
        """Answer one ``/v1/audio/speech`` request."""
        self.requests += 1
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            body = None
        if self.hook is not None:
            self.hook(body if isinstance(body, dict) else {})
        if request.headers.get("authorization") != f"Bearer {self.api_key}":
            return _error("Incorrect API key provided", 401)
        if not isinstance(body, dict):
            return _error("the body must be a JSON object", 400)
        for name in ("model", "voice", "input"):
            if not isinstance(body.get(name), str) or not body[name]:
                return _error(f"{name} is required", 400)
        if len(body["input"]) > MAX_INPUT:
            return _error(f"input is longer than {MAX_INPUT} characters", 400)
        if self.hold_next > 0:
            self.hold_next -= 1
            self.arrived.set()
            await self.release.wait()
            return JSONResponse({"error": {"message": "held"}}, status_code=500)
        if self.failures > 0:
            self.failures -= 1
            return JSONResponse(
                {"error": {"message": "The server had an error", "type": "server_error"}},
                status_code=500,
            )
        response_format = str(body.get("response_format", "mp3"))
        if response_format != "opus" or self.not_ogg:
            audio = b"ID3\x04\x00" + b"\x00" * 64  # what an mp3 answer starts with
            media_type = "audio/mpeg"
        else:
            audio = ogg_opus_bytes(frames=max(5, min(len(body["input"]) // 3, 400)))
            media_type = "audio/ogg"
        self.calls.append(
            SpeechCall(body["model"], body["voice"], body["input"], response_format, audio)
        )
        return Response(audio, media_type=media_type)
