"""A real OpenAI-compatible HTTP server on 127.0.0.1 for tests.

It serves ``POST /v1/chat/completions`` with uvicorn in the test's own event
loop, answers from a script (text, tool calls, HTTP errors, malformed bodies,
answers held until an ``asyncio.Event`` is set) and records every request.
Like OpenAI it refuses (HTTP 400) a conversation with an orphan: a ``tool``
message that does not answer a tool call of the assistant message right
before it, or an assistant tool call left without its ``tool`` result.

    async with FakeOpenAIServer() as server:
        server.add(server.reply("hello"))
        model = OpenAICompatibleModel(server.api_key, server.base_url)
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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


def _error_body(
    message: str, *, err_type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


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
        self._script: deque[FakeResponse] = deque()
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
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
    ) -> dict[str, Any]:
        """A ``chat.completion`` body."""
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
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    @classmethod
    def reply(
        cls, text: str, *, prompt_tokens: int = 10, completion_tokens: int = 5
    ) -> FakeResponse:
        """A plain text answer."""
        return FakeResponse(
            body=cls.completion(
                text, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
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
        if response.raw:
            return Response(
                str(response.body),
                status_code=response.status,
                headers=response.headers,
                media_type="application/json",
            )
        return JSONResponse(response.body, status_code=response.status, headers=response.headers)

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
            return self.error(500, "fake server: no scripted answer left")
        return self._script.popleft()

    async def start(self) -> None:
        """Bind a free port on 127.0.0.1 and start serving."""
        app = Starlette(routes=[Route("/v1/chat/completions", self._handle, methods=["POST"])])
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.setblocking(False)
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="off",
            ws="none",
            http="h11",
            timeout_graceful_shutdown=1,
            access_log=False,
        )
        server = uvicorn.Server(config)
        # Drive uvicorn's start-up and shutdown steps directly instead of
        # Server.serve(): no signal handlers, and no 0.1 s polling loop, so a
        # test pays milliseconds, not tenths of a second, per server.
        config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        self._server = server

    async def stop(self) -> None:
        """Release held answers, finish requests in flight, close the port."""
        for event in self._holds:
            event.set()
        server, self._server = self._server, None
        if server is not None:
            for listener in server.servers:
                listener.close()
            for connection in list(server.server_state.connections):
                connection.shutdown()
            if server.server_state.tasks:
                await asyncio.gather(*server.server_state.tasks, return_exceptions=True)
            for listener in server.servers:
                await listener.wait_closed()
            await server.lifespan.shutdown()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

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
