"""Chat Completions client for OpenAI and every OpenAI-compatible server.

One ``openai.AsyncOpenAI`` per (base URL, key) covers OpenAI, Gemini's
OpenAI endpoint, Ollama, vLLM and llama.cpp. Retries are the SDK's own
(``max_retries``: connection errors, timeouts, 408/409/429 and 5xx, with
exponential backoff and jitter, or the server's ``Retry-After`` /
``retry-after-ms``), all inside one total deadline (``asyncio.timeout``), so a
slow provider never holds a turn longer than asked. A response hook adds what
the SDK cannot know: a 2xx body that is no completion is retried, and neither
``insufficient_quota`` nor a ``Retry-After`` past the deadline is waited for.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import httpx2
import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageCustomToolCall,
    ChatCompletionMessageFunctionToolCall,
)
from typing_extensions import override

from bot.core._schema import SchemaTransform, gemini_compatible_schema, plain_copy
from bot.core.media_store import MediaStore
from bot.core.messages import ImagePart, Message, Role, ToolCall
from bot.core.models.base import ModelResponse, OnText, ToolSpec, sanitize_history
from bot.core.models.openai_stream import (
    INVALID_JSON_ARGUMENTS,
    read_stream,
    tool_call_of,
    usage_of,
)
from bot.core.parts import NO_VISION_NOTE, part_text, without_images
from bot.errors import ModelError
from bot.tracing import spans

if TYPE_CHECKING:
    from openai._models import FinalRequestOptions

__all__ = [
    "INVALID_JSON_ARGUMENTS",
    "OpenAICompatibleModel",
    "SchemaTransform",
    "gemini_compatible_schema",
    "to_openai_messages",
]

logger = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_NON_RETRYABLE_CODES = frozenset({"insufficient_quota"})

Sleep = Callable[[float], Awaitable[Any]]
"""An ``asyncio.sleep`` look-alike."""

_deadline: ContextVar[float | None] = ContextVar("chatflow_model_deadline", default=None)
"""Loop time by which the ``complete()`` running in this context must be done."""


def _user_content(message: Message, images: Mapping[str, str]) -> str | list[dict[str, Any]]:
    """A user message's content: a string, or text plus ``image_url`` parts for its images."""
    if not message.parts:
        return message.content or ""
    lines = [message.content] if message.content else []
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, ImagePart):
            url = images.get(part.sha256)
            if url is None:
                lines.append("[a photo sent earlier; it is no longer attached]")
                continue
            blocks.append({"type": "image_url", "image_url": {"url": url}})
        lines.append(part_text(part))
    text = "\n\n".join(lines)
    if not blocks:
        return text
    # The caption first, then the image: the order OpenAI's vision guide uses.
    return [{"type": "text", "text": text}, *blocks]


def to_openai_messages(
    system: str, messages: Sequence[Message], images: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Translate a (sanitised) history into Chat Completions messages.

    The system prompt and the history's SYSTEM messages become one leading
    ``system`` message (some providers accept only one); MODEL -> ``assistant``
    with JSON-encoded tool-call arguments; TOOL -> ``tool`` with its call id.
    A USER message with parts gets their text lines, and an ``image_url`` part
    (a base64 data URL) for each image whose SHA-256 is in ``images``; other
    images read as a line saying they are no longer attached.
    """
    images = images or {}
    system_parts = [system] if system else []
    system_parts.extend(m.content for m in messages if m.role is Role.SYSTEM and m.content)
    result: list[dict[str, Any]] = []
    if system_parts:
        result.append({"role": "system", "content": "\n\n".join(system_parts)})
    for message in messages:
        if message.role is Role.SYSTEM:
            continue
        if message.role is Role.USER:
            result.append({"role": "user", "content": _user_content(message, images)})
        elif message.role is Role.MODEL:
            entry: dict[str, Any] = {"role": "assistant", "content": message.content}
            if message.tool_calls:
                entry["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": json.dumps(call.arguments, ensure_ascii=False),
                        },
                    }
                    for call in message.tool_calls
                ]
            elif entry["content"] is None:
                entry["content"] = ""
            result.append(entry)
        else:
            result.append(
                {
                    "role": "tool",
                    "tool_call_id": message.tool_call_id,
                    "content": message.content or "",
                }
            )
    return result


def _to_openai_tools(
    tools: Sequence[ToolSpec], transform: SchemaTransform | None
) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": (
                    transform(spec.parameters) if transform else plain_copy(spec.parameters)
                ),
            },
        }
        for spec in tools
    ]


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asked to wait: ``retry-after-ms``, else ``retry-after``
    (seconds or an HTTP date), the headers the SDK honours."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        with contextlib.suppress(KeyError, ValueError):
            return max(0.0, float(headers[name]) * scale)
    with contextlib.suppress(KeyError, TypeError, ValueError):
        when = email.utils.parsedate_to_datetime(headers["retry-after"])
        return max(0.0, when.timestamp() - time.time())
    return None


def _error_code(response: httpx2.Response) -> str:
    """``error.code`` of an OpenAI error body, or ``""``."""
    with contextlib.suppress(ValueError):
        body = json.loads(response.content)
        error = body.get("error") if isinstance(body, dict) else None
        code = error.get("code") if isinstance(error, dict) else None
        return code if isinstance(code, str) else ""
    return ""


class _UnusableAnswer(httpx2.DecodingError):
    """A 2xx body that is not a completion: raised in the response hook, so the
    SDK retries it as it retries a dropped connection."""


async def _screen(response: httpx2.Response) -> None:
    """Response hook for what the SDK's retry rules cannot know.

    A 2xx body must be JSON with choices (else ``_UnusableAnswer``, retried).
    An error that must not be retried gets ``x-should-retry: false``, which the
    SDK obeys: ``insufficient_quota``, or a ``Retry-After`` past the deadline.
    """
    streamed = response.headers.get("content-type", "").startswith("text/event-stream")
    if response.is_success and not streamed:  # a stream is read by read_stream, as it comes
        await response.aread()
        try:
            body = json.loads(response.content)
        except ValueError:
            raise _UnusableAnswer(
                "model provider sent malformed JSON", request=response.request
            ) from None
        if not isinstance(body, dict) or not body.get("choices"):
            raise _UnusableAnswer(
                "model provider sent a response without choices", request=response.request
            )
        return
    if not response.is_error:
        return
    await response.aread()
    attempt = int(response.request.headers.get("x-stainless-retry-count") or 0) + 1
    logger.warning("Model provider answered HTTP %d (attempt %d)", response.status_code, attempt)
    wait = _retry_after(response.headers)
    deadline = _deadline.get()
    if (
        wait is not None
        and deadline is not None
        and asyncio.get_running_loop().time() + wait >= deadline
    ):
        logger.warning("Model call not retried: a %.3g s wait passes the deadline", wait)
        response.headers["x-should-retry"] = "false"
    elif _error_code(response) in _NON_RETRYABLE_CODES:
        response.headers["x-should-retry"] = "false"


def _status_error(exc: openai.APIStatusError) -> ModelError:
    status = exc.status_code
    code = exc.code or ""
    retryable = (status in _RETRYABLE_STATUS or status >= 500) and code not in (
        _NON_RETRYABLE_CODES
    )
    detail = f" ({code})" if code else ""
    return ModelError(
        f"model provider answered HTTP {status}{detail}",
        retryable=retryable,
        retry_after=_retry_after(exc.response.headers),
        status_code=status,
    )


def _translate(exc: openai.OpenAIError) -> ModelError:
    """The ``ModelError`` for an SDK error, chosen by its type."""
    if isinstance(exc, openai.APIStatusError):
        return _status_error(exc)
    if isinstance(exc, openai.APITimeoutError):
        return ModelError("model request timed out", retryable=True)
    if isinstance(exc, openai.APIConnectionError):
        if isinstance(exc.__cause__, _UnusableAnswer):
            return ModelError(str(exc.__cause__), retryable=True)
        return ModelError("could not reach the model provider", retryable=True)
    if isinstance(exc, openai.APIResponseValidationError):
        return ModelError("model provider sent an invalid response", retryable=True)
    return ModelError(f"model client failed: {type(exc).__name__}")


class _SleepSeamClient(openai.AsyncOpenAI):
    """``AsyncOpenAI`` whose waits between retries go through an injected ``sleep``.

    A test seam only: how long to wait is still the SDK's own choice.
    """

    def __init__(self, *, sleep: Sleep, **options: Any) -> None:
        super().__init__(**options)
        self._retry_sleep = sleep

    @override  # mypy flags it if the SDK renames the hook
    async def _sleep_for_retry(
        self,
        *,
        retries_taken: int,
        max_retries: int,
        options: FinalRequestOptions,
        response: httpx2.Response | None,
    ) -> None:
        headers = None if response is None else response.headers
        await self._retry_sleep(
            self._calculate_retry_timeout(max_retries - retries_taken, options, headers)
        )


class OpenAICompatibleModel:
    """A ``ChatModel`` on the ``openai`` SDK's Chat Completions API."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        max_retries: int = 3,
        total_timeout: float = 60.0,
        request_timeout: float = 30.0,
        sleep: Sleep | None = None,
        schema_transform: SchemaTransform | None = None,
        media_store: MediaStore | None = None,
    ) -> None:
        """Set up a client; no connection is opened until the first call.

        ``max_retries`` counts the SDK's retries after the first attempt.
        ``total_timeout`` bounds one ``complete()`` call, waits included (a
        ``Retry-After`` longer than the time left ends the call at once);
        ``request_timeout`` bounds each HTTP attempt. ``sleep`` replaces the
        SDK's wait between retries (a test seam). ``schema_transform`` adapts
        tool schemas to a provider's dialect (e.g. ``gemini_compatible_schema``).
        ``media_store`` holds the bytes of images: those of the latest user
        message are sent inline (earlier ones only as a line, so a long chat
        does not resend every photo).
        """
        if max_retries < 0:
            raise ValueError("max_retries must be >= 0")
        if total_timeout <= 0 or request_timeout <= 0:
            raise ValueError("timeouts must be positive")
        self.api_key = api_key
        self.base_url = base_url
        self.max_retries = max_retries
        self.total_timeout = total_timeout
        self.request_timeout = request_timeout
        self._sleep = sleep
        self.schema_transform = schema_transform
        self.media_store = media_store
        self._blind_models: set[str] = set()  # models that refused images
        self._client: openai.AsyncOpenAI | None = None
        self.provider_name = "openai"
        """``gen_ai.provider.name`` of this client's spans (the router sets its route's)."""

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAICompatibleModel(base_url={self.base_url!r})"

    def _get_client(self) -> openai.AsyncOpenAI:
        if self._client is None:
            options: dict[str, Any] = {
                "api_key": self.api_key,
                "base_url": self.base_url,
                "max_retries": self.max_retries,
                "timeout": self.request_timeout,
                "http_client": openai.DefaultAsyncHttpxClient(event_hooks={"response": [_screen]}),
            }
            self._client = (
                openai.AsyncOpenAI(**options)
                if self._sleep is None
                else _SleepSeamClient(sleep=self._sleep, **options)
            )
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        """Send one Chat Completions request and parse it, SDK retries included,
        all within ``total_timeout``.

        A model that refuses a request with images (HTTP 400) is asked again
        without them, the answer says plainly that images cannot be seen, and
        later requests to that model carry no images (learned, per client).
        """
        return await self._answer(model, system, messages, tools, None)

    async def stream(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText,
    ) -> ModelResponse:
        """``complete`` with ``stream=True``: the text goes to ``on_text`` as it arrives,
        tool calls are assembled from their deltas. The same deadline bounds the
        whole stream; a stream that breaks off raises ``ModelError`` (retryable)."""
        return await self._answer(model, system, messages, tools, on_text)

    async def _answer(
        self,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText | None,
    ) -> ModelResponse:
        history = sanitize_history(messages)
        images = await self._current_images(history)
        deadline = asyncio.get_running_loop().time() + self.total_timeout
        if images and model not in self._blind_models:
            try:
                return await self._create(model, system, history, images, tools, deadline, on_text)
            except ModelError as exc:
                if exc.status_code != 400:
                    raise
            logger.warning("Model %s refused images (HTTP 400); sending it none from now on", model)
            self._blind_models.add(model)
        if model not in self._blind_models:
            return await self._create(model, system, history, images, tools, deadline, on_text)
        history = without_images(history)
        response = await self._create(model, system, history, {}, tools, deadline, on_text)
        if images and response.content:
            response.content = f"{NO_VISION_NOTE}\n\n{response.content}"
        return response

    async def _create(
        self,
        model: str,
        system: str,
        history: Sequence[Message],
        images: Mapping[str, str],
        tools: Sequence[ToolSpec],
        deadline: float,
        on_text: OnText | None = None,
    ) -> ModelResponse:
        # The tools before the messages: the body's bytes then grow only at the end from
        # one turn to the next (a stable prefix, what providers' prompt caches match).
        request: dict[str, Any] = {"model": model}
        if tools:
            request["tools"] = _to_openai_tools(tools, self.schema_transform)
        request["messages"] = to_openai_messages(system, history, images)
        if on_text is not None:
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
        token = _deadline.set(deadline)
        try:
            async with asyncio.timeout_at(deadline):
                # The SDK's own POST (auth, retries, errors, typed answer and stream), not
                # ``chat.completions.create``: that one walks the request's every message
                # through its TypedDict transform, over half of a call's CPU for a body
                # built here as plain JSON already (nothing in it to alias or encode).
                result: object = await self._get_client().post(
                    "/chat/completions",
                    body=request,
                    cast_to=ChatCompletion,
                    options=self._request_options(),
                    stream=on_text is not None,
                    stream_cls=openai.AsyncStream[ChatCompletionChunk],
                )
                if isinstance(result, openai.AsyncStream):
                    assert on_text is not None
                    return await read_stream(result, on_text, self._parse)
        except TimeoutError as exc:
            raise ModelError(
                f"model call gave up after {self.total_timeout:g} s", retryable=True
            ) from exc
        except openai.OpenAIError as exc:
            raise _translate(exc) from exc
        except ValueError as exc:  # a streamed event that is not JSON
            raise ModelError("model provider sent a malformed stream", retryable=True) from exc
        finally:
            _deadline.reset(token)
        if not isinstance(result, ChatCompletion) or not result.choices:
            raise ModelError("model provider sent a response without choices", retryable=True)
        return self._parse(result)

    @staticmethod
    def _request_options() -> Any:
        """The SDK's request options: bearer auth, and ``traceparent`` while tracing."""
        options: dict[str, Any] = {"security": {"bearer_auth": True}}
        headers = spans.provider_headers()
        if headers:
            options["headers"] = headers
        return options

    async def _current_images(self, history: Sequence[Message]) -> dict[str, str]:
        """Data URLs of the images in the latest USER message, by SHA-256."""
        latest = next((m for m in reversed(history) if m.role is Role.USER), None)
        if latest is None or self.media_store is None:
            return {}
        urls: dict[str, str] = {}
        for part in latest.parts:
            if isinstance(part, ImagePart) and part.sha256 not in urls:
                data = await self.media_store.read(part.sha256)
                if data is not None:
                    encoded = base64.b64encode(data).decode("ascii")
                    urls[part.sha256] = f"data:{part.mime_type};base64,{encoded}"
        return urls

    @staticmethod
    def _parse(completion: ChatCompletion) -> ModelResponse:
        message = completion.choices[0].message
        calls: list[ToolCall] = []
        invalid: dict[str, str] = {}
        for raw in message.tool_calls or []:
            call_id = raw.id or f"call_{uuid.uuid4().hex[:24]}"
            if not isinstance(raw, ChatCompletionMessageFunctionToolCall):
                name = (
                    raw.custom.name if isinstance(raw, ChatCompletionMessageCustomToolCall) else ""
                )
                calls.append(ToolCall(id=call_id, name=name or "unknown"))
                invalid[call_id] = f"tool call type {raw.type!r} is not supported"
                continue
            call, problem = tool_call_of(call_id, raw.function.name, raw.function.arguments)
            calls.append(call)
            if problem is not None:
                invalid[call_id] = problem
        usage = usage_of(completion.usage)
        content = message.content
        if content is None and not calls:
            content = message.refusal or ""
        return ModelResponse(
            content=content,
            tool_calls=calls,
            usage=usage,
            invalid_tool_calls=invalid,
            finish_reason=completion.choices[0].finish_reason,
        )
