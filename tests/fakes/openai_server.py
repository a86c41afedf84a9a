"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests.

It serves ``POST /v1/chat/completions`` with uvicorn in the test's own event
loop, answers from a script (text, tool calls, HTTP errors, malformed bodies,
answers held until an ``asyncio.Event`` is set) and records every request.
Like OpenAI it refuses (HTTP 400) a conversation with an orphan: a ``tool``
message that does not answer a tool call of the assistant message right
before it, or an assistant tool call left without its ``tool`` result, and a
user content part that is not ``text`` or an ``image_url`` with a real
base64 data URL (``RecordedRequest.images`` decodes them).

A request with ``"stream": true`` gets its scripted completion as server-sent
events (``chat.completion.chunk``): the text in pieces of ``chunk_chars``
characters, each tool call as a first delta (id, name) and then its arguments
in pieces, a usage chunk and ``[DONE]``, ``chunk_delay`` seconds apart (else
the server's ``stream_delay``); ``break_after`` ends the stream after that many
pieces with an error event instead. ``RecordedRequest.chunk_times`` says when
each piece left.

``POST /v1/audio/transcriptions`` takes OpenAI's multipart form (``file`` and
``model`` fields, as the SDK sends them) and answers ``{"text": ...}`` from
``transcripts`` (the audio bytes' answers, in order) or ``transcript_for``.
``POST /v1/audio/speech`` answers real OGG/Opus bytes (``speech``, in
``tests.fakes.openai_speech``).

    async with FakeOpenAIServer() as server:
        server.add(server.reply("hello"))
        model = OpenAICompatibleModel(server.api_key, server.base_url)
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import itertools
import json
import random
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.fakes.openai_speech import SpeechEndpoint
from tests.fakes.serving import LocalServer

__all__ = [
    "FakeOpenAIServer",
    "FakeResponse",
    "RecordedRequest",
    "RequestHook",
    "Responder",
    "validate_chat_request",
]

_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ids = itertools.count(1)


@dataclass
class RecordedRequest:
    """One request the server received, and what it answered."""

    path: str
    """Request path, e.g. ``/v1/chat/completions``."""
    headers: dict[str, str]
    """Request headers (lower-case names)."""
    body: Any
    """Decoded JSON body (``None`` if it was not JSON)."""
    status: int = 0
    """HTTP status the server answered."""
    received_at: float = field(default_factory=time.monotonic)
    """``time.monotonic()`` when the request arrived."""
    chunk_times: list[float] = field(default_factory=list)
    """``time.monotonic()`` of each streamed piece sent (streamed requests only)."""

    @property
    def streamed(self) -> bool:
        """Whether the client asked for a stream (``"stream": true``)."""
        return isinstance(self.body, dict) and self.body.get("stream") is True

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The ``messages`` of a chat request."""
        if isinstance(self.body, dict):
            return list(self.body.get("messages") or [])
        return []

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools offered in the request."""
        if not isinstance(self.body, dict):
            return []
        return [t.get("function", {}).get("name") for t in self.body.get("tools") or []]

    @property
    def roles(self) -> list[str]:
        """Roles of the messages, in order."""
        return [m.get("role", "?") for m in self.messages]

    @property
    def images(self) -> list[tuple[str, bytes]]:
        """``(mime type, bytes)`` of every ``image_url`` data URL in the request."""
        found: list[tuple[str, bytes]] = []
        for message in self.messages:
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for part in content:
                if isinstance(part, dict) and part.get("type") == "image_url":
                    decoded = _decode_data_url(str(part["image_url"]["url"]))
                    if decoded is not None:
                        found.append(decoded)
        return found


@dataclass
class FakeResponse:
    """One scripted answer."""

    status: int = 200
    """HTTP status."""
    body: Any = None
    """JSON body (dict), or raw text when ``raw`` is true."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers (e.g. ``Retry-After``)."""
    raw: bool = False
    """Send ``body`` as is (for malformed JSON) instead of encoding it."""
    hold: asyncio.Event | None = None
    """If set, the answer waits until this event is set."""
    delay: float = 0.0
    """Seconds to wait before answering (a slow model)."""
    chunk_chars: int = 6
    """Streamed answers: characters of text (or arguments) per chunk."""
    chunk_delay: float | None = None
    """Streamed answers: seconds between chunks (``None``: the server's ``stream_delay``)."""
    break_after: int | None = None
    """Streamed answers: after this many chunks send an error event and stop."""


def _error_body(
    message: str, *, err_type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


_DATA_URL_RE = re.compile(r"data:(image/[a-z0-9.+-]+);base64,([A-Za-z0-9+/=]+)")


def _decode_data_url(url: str) -> tuple[str, bytes] | None:
    found = _DATA_URL_RE.fullmatch(url)
    if found is None:
        return None
    try:
        return found.group(1), base64.b64decode(found.group(2), validate=True)
    except (binascii.Error, ValueError):
        return None


def _content_parts_problem(index: int, role: str, content: list[Any]) -> str | None:
    """OpenAI's checks on a list ``content``: text parts, and image parts for users only."""
    if not content:
        return f"messages.[{index}].content: an array must not be empty"
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"messages.[{index}].content.[{number}]"
        if kind == "text":
            if not isinstance(part.get("text"), str):
                return f"{where}.text must be a string"
        elif kind == "image_url" and role == "user":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else None
            if not isinstance(url, str):
                return f"{where}.image_url.url is required"
            if url.startswith("data:"):
                decoded = _decode_data_url(url)
                if decoded is None or not decoded[1]:
                    return f"{where}: invalid image data URL"
            elif not url.startswith(("http://", "https://")):
                return f"{where}: image_url must be a URL or a base64 data URL"
        else:
            return f"{where}: invalid content part type {kind!r} for role {role!r}"
    return None


def validate_chat_request(body: Any) -> str | None:
    """OpenAI's own checks on a chat request; the error message, or ``None`` if valid."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "you must provide a model parameter"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    pending: dict[str, int] = {}
    answered_block: set[str] = set()
    in_tool_block = False
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            return f"messages.[{index}].role: invalid role {role!r}"
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not in_tool_block or call_id not in pending or call_id in answered_block:
                return (
                    f"Invalid parameter: messages with role 'tool' must be a response to a "
                    f"preceeding message with 'tool_calls'. (messages.[{index}].role)"
                )
            answered_block.add(call_id)
            if not isinstance(message.get("content"), str):
                return f"messages.[{index}].content must be a string"
            continue
        if in_tool_block and set(pending) - answered_block:
            missing = ", ".join(sorted(set(pending) - answered_block))
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages "
                "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                f"response messages: {missing}"
            )
        pending = {}
        answered_block = set()
        in_tool_block = False
        if role == "assistant" and message.get("tool_calls"):
            for call in message["tool_calls"]:
                function = call.get("function") or {}
                if call.get("type") != "function" or not call.get("id"):
                    return f"messages.[{index}].tool_calls: each call needs an id and type function"
                if not isinstance(function.get("arguments"), str):
                    return f"messages.[{index}].tool_calls: arguments must be a JSON string"
                pending[call["id"]] = index
            in_tool_block = True
        elif role == "assistant" and message.get("content") is None:
            return f"messages.[{index}]: assistant message needs content or tool_calls"
        elif role in ("user", "system", "developer") and not isinstance(
            message.get("content"), str | list
        ):
            return f"messages.[{index}].content must be a string"
        if isinstance(message.get("content"), list):
            problem = _content_parts_problem(index, role, message["content"])
            if problem is not None:
                return problem
    if in_tool_block and set(pending) - answered_block:
        missing = ", ".join(sorted(set(pending) - answered_block))
        return (
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {missing}"
        )
    for index, spec in enumerate(body.get("tools") or []):
        function = spec.get("function") if isinstance(spec, dict) else None
        if not isinstance(function, dict) or spec.get("type") != "function":
            return f"tools.[{index}]: expected a function tool"
        if not _TOOL_NAME_RE.match(str(function.get("name", ""))):
            return f"tools.[{index}].function.name: invalid name {function.get('name')!r}"
        parameters = function.get("parameters", {})
        if not isinstance(parameters, dict) or parameters.get("type") != "object":
            return f"tools.[{index}].function.parameters must be an object schema"
    return None


Responder = Callable[[RecordedRequest], FakeResponse]
"""Answers a (valid, authorised) request when the script is empty."""
RequestHook = Callable[[RecordedRequest], None]
"""Called as each request arrives, before it is answered."""


class FakeOpenAIServer:
    """An OpenAI-compatible server with scripted answers, on a free port of 127.0.0.1."""

    def __init__(
        self,
        *,
        api_key: str = "sk-test",
        validate: bool = True,
        responder: Responder | None = None,
        on_request: RequestHook | None = None,
    ) -> None:
        self.api_key = api_key
        """The key clients must send as ``Authorization: Bearer <key>``."""
        self.validate = validate
        """Refuse invalid conversations with 400, as OpenAI does."""
        self.responder = responder
        """Answers requests once the script is empty (``None``: a 500 says it is empty)."""
        self.on_request = on_request
        """Called with each request as it arrives, before the answer (e.g. to kill a client)."""
        self.requests: list[RecordedRequest] = []
        """Every request received, in order."""
        self.validation_errors: list[str] = []
        """Every 400 this server gave for an invalid conversation."""
        self.transcripts: deque[str] = deque()
        """Answers of ``/v1/audio/transcriptions``, in order (then ``transcript_for``)."""
        self.transcript_for: Callable[[bytes], str] | None = None
        """Answers a transcription from the audio bytes once ``transcripts`` is empty."""
        self.transcription_files: list[tuple[str, str, bytes]] = []
        """``(model, file name, bytes)`` of every transcription request accepted."""
        self.transcription_faults: deque[FakeResponse] = deque()
        """Answers served before any transcript (e.g. a 500), in order."""
        self.transcription_hook: Callable[[RecordedRequest], None] | None = None
        """Called with each transcription request as it arrives (e.g. to kill a client)."""
        self.transcription_usage: dict[str, Any] | None = None
        """The ``usage`` of every transcription answer (``gpt-4o-transcribe`` reports
        ``{"type": "tokens", ...}``, ``whisper-1`` ``{"type": "duration", ...}``); ``None``:
        no usage at all."""
        self.speech = SpeechEndpoint(api_key)
        """``/v1/audio/speech`` (``tests.fakes.openai_speech``): its calls and switches."""
        self.stream_delay = 0.0
        """Seconds between streamed chunks when the answer does not say."""
        self.slow: tuple[float, float] | None = None
        """A slow model: with nothing scripted (and no ``responder``), every request is
        answered ``slow_answer`` after a uniform random ``(low, high)`` seconds (a
        stream: its first chunk at 30 % of that, the rest spread over the remainder)."""
        self.slow_answer = "Your order #1001 ships tomorrow; I will let you know when it leaves."
        """What the slow model says."""
        self._slow_random = random.Random(1)
        self._script: deque[FakeResponse] = deque()
        self._local: LocalServer | None = None
        self._holds: list[asyncio.Event] = []
        self.port = 0

    # -- script ------------------------------------------------------------------

    def add(self, *responses: FakeResponse) -> None:
        """Append answers to the script (served in order)."""
        self._script.extend(responses)

    @property
    def remaining(self) -> int:
        """Scripted answers not served yet."""
        return len(self._script)

    @staticmethod
    def completion(
        content: str | None,
        tool_calls: Sequence[Mapping[str, Any]] = (),
        *,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        model: str = "gpt-test",
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> dict[str, Any]:
        """A ``chat.completion`` body (with OpenAI's ``prompt_tokens_details`` and
        ``completion_tokens_details`` when ``cached_tokens``/``reasoning_tokens`` are given)."""
        usage: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens, "audio_tokens": 0}
        if reasoning_tokens is not None:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            }
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = list(tool_calls)
        return {
            "id": f"chatcmpl-{next(_ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if tool_calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": usage,
        }

    @classmethod
    def reply(
        cls,
        text: str,
        *,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        cached_tokens: int | None = None,
        reasoning_tokens: int | None = None,
    ) -> FakeResponse:
        """A plain text answer."""
        return FakeResponse(
            body=cls.completion(
                text,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                cached_tokens=cached_tokens,
                reasoning_tokens=reasoning_tokens,
            )
        )

    @staticmethod
    def tool_call(
        name: str, arguments: Mapping[str, Any] | str | None = None, *, call_id: str | None = None
    ) -> dict[str, Any]:
        """One tool call entry; ``arguments`` as a dict, or a raw (maybe invalid) string."""
        raw = arguments if isinstance(arguments, str) else json.dumps(dict(arguments or {}))
        return {
            "id": call_id or f"call_{next(_ids)}",
            "type": "function",
            "function": {"name": name, "arguments": raw},
        }

    @classmethod
    def tool_calls(cls, *calls: Mapping[str, Any], content: str | None = None) -> FakeResponse:
        """An answer calling tools (entries made by ``tool_call``)."""
        return FakeResponse(body=cls.completion(content, calls))

    @classmethod
    def call(cls, name: str, **arguments: Any) -> FakeResponse:
        """An answer calling one tool."""
        return cls.tool_calls(cls.tool_call(name, arguments))

    @staticmethod
    def error(
        status: int,
        message: str = "scripted error",
        *,
        headers: Mapping[str, str] | None = None,
        code: str | None = None,
    ) -> FakeResponse:
        """An HTTP error with OpenAI's error body."""
        err_type = "invalid_request_error" if status < 500 else "server_error"
        if status == 429:
            err_type = "rate_limit_exceeded"
        return FakeResponse(
            status=status,
            body=_error_body(message, err_type=err_type, code=code),
            headers=dict(headers or {}),
        )

    @classmethod
    def rate_limited(
        cls, retry_after: float | str | None = None, *, code: str | None = None
    ) -> FakeResponse:
        """A 429, with ``Retry-After`` when given."""
        headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
        return cls.error(429, "Rate limit reached", headers=headers, code=code)

    @staticmethod
    def malformed(
        body: str = '{"id": "chatcmpl-x", "choices": [', status: int = 200
    ) -> FakeResponse:
        """A body that claims to be JSON but is not."""
        return FakeResponse(status=status, body=body, raw=True)

    def held(self, response: FakeResponse, event: asyncio.Event | None = None) -> FakeResponse:
        """``response``, sent only once ``event`` is set (a new event if none given).

        Events of held answers are set when the server stops, so nothing hangs.
        """
        response.hold = event or asyncio.Event()
        self._holds.append(response.hold)
        return response

    # -- server ------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>/v1``: give it to the client as ``base_url``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The requests to ``/v1/chat/completions``."""
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        record = RecordedRequest(
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
        )
        self.requests.append(record)
        if self.on_request is not None:
            self.on_request(record)
        response = self._answer(record)
        record.status = response.status
        if response.hold is not None:
            await response.hold.wait()
        if response.delay > 0:
            await asyncio.sleep(response.delay)
        if record.streamed and response.status == 200 and not response.raw:
            return StreamingResponse(self._chunks(record, response), media_type="text/event-stream")
        if response.raw:
            return Response(
                str(response.body),
                status_code=response.status,
                headers=response.headers,
                media_type="application/json",
            )
        return JSONResponse(response.body, status_code=response.status, headers=response.headers)

    async def _chunks(self, record: RecordedRequest, response: FakeResponse) -> AsyncIterator[str]:
        """The completion ``response.body`` as ``chat.completion.chunk`` events."""
        body: dict[str, Any] = response.body
        message = body["choices"][0]["message"]
        size = max(1, response.chunk_chars)
        delay = self.stream_delay if response.chunk_delay is None else response.chunk_delay
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        text = message.get("content") or ""
        deltas += [{"content": text[i : i + size]} for i in range(0, len(text), size)]
        for index, call in enumerate(message.get("tool_calls") or []):
            function = call["function"]
            head = {"index": index, "id": call["id"], "type": "function"}
            deltas.append({"tool_calls": [{**head, "function": {"name": function["name"]}}]})
            raw = function["arguments"]
            deltas += [
                {"tool_calls": [{"index": index, "function": {"arguments": raw[i : i + size]}}]}
                for i in range(0, len(raw), size)
            ]

        def event(choices: list[dict[str, Any]], usage: Any = None) -> str:
            chunk = {
                "id": body["id"],
                "object": "chat.completion.chunk",
                "created": body["created"],
                "model": body["model"],
                "choices": choices,
                "usage": usage,
            }
            return f"data: {json.dumps(chunk)}\n\n"

        for number, delta in enumerate(deltas):
            if response.break_after is not None and number >= response.break_after:
                error = _error_body("stream interrupted", err_type="server_error")
                yield f"data: {json.dumps(error)}\n\n"
                return
            if number and delay > 0:
                await asyncio.sleep(delay)
            record.chunk_times.append(time.monotonic())
            yield event([{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}])
        finish = body["choices"][0]["finish_reason"]
        yield event([{"index": 0, "delta": {}, "finish_reason": finish, "logprobs": None}])
        yield event([], body.get("usage"))
        yield "data: [DONE]\n\n"

    async def _transcribe(self, request: Request) -> Response:
        record = RecordedRequest(
            path=request.url.path,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=None,
        )
        self.requests.append(record)
        if self.transcription_hook is not None:
            self.transcription_hook(record)
        if record.headers.get("authorization") != f"Bearer {self.api_key}":
            record.status = 401
            return JSONResponse(
                _error_body("Incorrect API key", err_type="invalid_request_error"), status_code=401
            )
        async with request.form() as form:
            upload = form.get("file")
            model = form.get("model")
            if isinstance(upload, str) or upload is None or not isinstance(model, str):
                record.status = 400
                return JSONResponse(
                    _error_body("file and model are required", err_type="invalid_request_error"),
                    status_code=400,
                )
            data = await upload.read()
            name = upload.filename or ""
        if self.transcription_faults:
            fault = self.transcription_faults.popleft()
            record.status = fault.status
            return JSONResponse(fault.body, status_code=fault.status)
        self.transcription_files.append((model, name, data))
        if self.transcripts:
            text = self.transcripts.popleft()
        elif self.transcript_for is not None:
            text = self.transcript_for(data)
        else:
            text = ""
        record.status = 200
        usage = {} if self.transcription_usage is None else {"usage": self.transcription_usage}
        return JSONResponse({"text": text, **usage})

    @property
    def transcription_requests(self) -> list[RecordedRequest]:
        """The requests to ``/v1/audio/transcriptions``."""
        return [r for r in self.requests if r.path == "/v1/audio/transcriptions"]

    def _answer(self, record: RecordedRequest) -> FakeResponse:
        if record.headers.get("authorization") != f"Bearer {self.api_key}":
            return FakeResponse(
                status=401,
                body=_error_body(
                    "Incorrect API key provided",
                    err_type="invalid_request_error",
                    code="invalid_api_key",
                ),
            )
        if self.validate:
            problem = validate_chat_request(record.body)
            if problem is not None:
                self.validation_errors.append(problem)
                return FakeResponse(
                    status=400, body=_error_body(problem, err_type="invalid_request_error")
                )
        if not self._script:
            if self.responder is not None:
                return self.responder(record)
            if self.slow is not None:
                return self._slow_reply(record)
            return self.error(500, "fake server: no scripted answer left")
        return self._script.popleft()

    def _slow_reply(self, record: RecordedRequest) -> FakeResponse:
        assert self.slow is not None
        seconds = self._slow_random.uniform(*self.slow)
        answer = self.reply(self.slow_answer, prompt_tokens=400, completion_tokens=60)
        if not record.streamed:
            return dataclasses.replace(answer, delay=seconds)
        chunks = max(1, len(self.slow_answer) // 20)
        return dataclasses.replace(
            answer, delay=0.3 * seconds, chunk_chars=20, chunk_delay=0.7 * seconds / chunks
        )

    async def start(self) -> None:
        """Bind a free port on 127.0.0.1 and start serving."""
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._handle, methods=["POST"]),
                Route("/v1/audio/transcriptions", self._transcribe, methods=["POST"]),
                Route("/v1/audio/speech", self.speech.handle, methods=["POST"]),
            ]
        )
        self._local = LocalServer(app)
        self.port = await self._local.start()

    async def stop(self) -> None:
        """Release held answers, finish requests in flight, close the port."""
        for event in self._holds:
            event.set()
        if self._local is not None:
            await self._local.stop()

    async def __aenter__(self) -> FakeOpenAIServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
