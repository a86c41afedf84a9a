"""Chat Completions client for OpenAI and every OpenAI-compatible server.

One ``openai.AsyncOpenAI`` per (base URL, key) covers OpenAI, Gemini's
OpenAI endpoint, Ollama, vLLM and llama.cpp. The SDK's own retries are
off: this module retries 429, 5xx, connection errors and timeouts itself,
with exponential backoff and jitter, honouring ``Retry-After``, inside one
total deadline, so a slow provider never holds a turn longer than asked.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import openai
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessageCustomToolCall,
    ChatCompletionMessageFunctionToolCall,
)

from bot.core.messages import Message, Role, ToolCall
from bot.core.models.base import ModelResponse, ToolSpec, Usage, sanitize_history
from bot.errors import ModelError

__all__ = [
    "INVALID_JSON_ARGUMENTS",
    "OpenAICompatibleModel",
    "SchemaTransform",
    "gemini_compatible_schema",
    "to_openai_messages",
]

logger = logging.getLogger(__name__)

INVALID_JSON_ARGUMENTS = "arguments were not valid JSON"
"""Error text the runner returns for a tool call whose arguments did not parse."""

_RETRYABLE_STATUS = frozenset({408, 409, 429})
_NON_RETRYABLE_CODES = frozenset({"insufficient_quota"})

Sleep = Callable[[float], Awaitable[Any]]


def _plain(value: Any) -> Any:
    """Deep copy into plain dicts and lists (schemas may hold read-only mappings)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def to_openai_messages(system: str, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Translate a (sanitised) history into Chat Completions messages.

    The system prompt and the history's SYSTEM messages become one leading
    ``system`` message (some providers accept only one); MODEL -> ``assistant``
    with JSON-encoded tool-call arguments; TOOL -> ``tool`` with its call id.
    """
    system_parts = [system] if system else []
    system_parts.extend(m.content for m in messages if m.role is Role.SYSTEM and m.content)
    result: list[dict[str, Any]] = []
    if system_parts:
        result.append({"role": "system", "content": "\n\n".join(system_parts)})
    for message in messages:
        if message.role is Role.SYSTEM:
            continue
        if message.role is Role.USER:
            result.append({"role": "user", "content": message.content or ""})
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


SchemaTransform = Callable[[Mapping[str, Any]], dict[str, Any]]
"""Rewrites a tool's parameter schema for a provider's JSON-schema dialect."""

_GEMINI_DROPPED_KEYS = frozenset({"additionalProperties", "$schema"})


def gemini_compatible_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tool schema Gemini accepts: no ``additionalProperties``/``$schema``, ``const`` as enum.

    Gemini (also through its OpenAI endpoint) answers 400 "Unknown name
    additionalProperties" to schemas that are fine for OpenAI.
    """

    def clean(node: Any, *, name_map: bool = False) -> Any:
        if isinstance(node, Mapping):
            if name_map:
                return {str(k): clean(v) for k, v in node.items()}
            result: dict[str, Any] = {}
            for key, value in node.items():
                if key in _GEMINI_DROPPED_KEYS:
                    continue
                if key == "const":
                    result["enum"] = [value]
                    continue
                result[str(key)] = clean(value, name_map=key in ("properties", "$defs"))
            return result
        if isinstance(node, list | tuple):
            return [clean(item) for item in node]
        return node

    cleaned: dict[str, Any] = clean(schema)
    return cleaned


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
                    transform(spec.parameters) if transform else _plain(spec.parameters)
                ),
            },
        }
        for spec in tools
    ]


def _parse_retry_after(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _status_error(exc: openai.APIStatusError) -> ModelError:
    status = exc.status_code
    code = exc.code or ""
    retryable = (status in _RETRYABLE_STATUS or status >= 500) and code not in (
        _NON_RETRYABLE_CODES
    )
    retry_after = _parse_retry_after(exc.response.headers)
    detail = f" ({code})" if code else ""
    return ModelError(
        f"model provider answered HTTP {status}{detail}",
        retryable=retryable,
        retry_after=retry_after,
        status_code=status,
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
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        schema_transform: SchemaTransform | None = None,
    ) -> None:
        """Set up a client; no connection is opened until the first call.

        ``max_retries`` counts retries after the first attempt. ``total_timeout``
        bounds one ``complete()`` call, waits included; ``request_timeout``
        bounds each HTTP attempt. ``sleep`` is the backoff wait (inject a fake
        in tests). A ``Retry-After`` longer than the time left ends the call.
        ``schema_transform`` adapts tool schemas to a provider's dialect (e.g.
        ``gemini_compatible_schema``).
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
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.schema_transform = schema_transform
        self._client: openai.AsyncOpenAI | None = None

    def __repr__(self) -> str:  # never shows the key
        return f"OpenAICompatibleModel(base_url={self.base_url!r})"

    def _get_client(self) -> openai.AsyncOpenAI:
        if self._client is None:
            self._client = openai.AsyncOpenAI(
                api_key=self.api_key,
                base_url=self.base_url,
                max_retries=0,
                timeout=self.request_timeout,
            )
        return self._client

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def backoff_delay(self, attempt: int) -> float:
        """Wait before retry number ``attempt`` (0-based): full jitter on 2^attempt."""
        ceiling = min(self.backoff_max, self.backoff_base * (2**attempt))
        return self._rng.uniform(ceiling / 2, ceiling)

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        """Send one Chat Completions request (retrying as configured) and parse it."""
        payload_messages = to_openai_messages(system, sanitize_history(messages))
        payload_tools = _to_openai_tools(tools, self.schema_transform)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.total_timeout
        attempt = 0
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise ModelError(
                    f"model call gave up after {self.total_timeout:g} s", retryable=True
                )
            try:
                completion = await self._request(
                    model, payload_messages, payload_tools, min(self.request_timeout, remaining)
                )
                return self._parse(completion)
            except ModelError as error:
                failure = error
            if not failure.retryable or attempt >= self.max_retries:
                raise failure
            delay = (
                failure.retry_after
                if failure.retry_after is not None
                else self.backoff_delay(attempt)
            )
            if loop.time() + delay >= deadline:
                logger.warning(
                    "Model call to %s not retried: a %.1f s wait passes the deadline",
                    model,
                    delay,
                )
                raise failure
            logger.warning(
                "Model call to %s failed (%s); retry %d/%d in %.2f s",
                model,
                failure.status_code or type(failure.__cause__).__name__,
                attempt + 1,
                self.max_retries,
                delay,
            )
            await self._sleep(delay)
            attempt += 1

    async def _request(
        self,
        model: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        timeout: float,  # noqa: ASYNC109 - the SDK's per-request timeout, not ours
    ) -> ChatCompletion:
        client = self._get_client()
        kwargs: dict[str, Any] = {"model": model, "messages": messages, "timeout": timeout}
        if tools:
            kwargs["tools"] = tools
        try:
            result: object = await client.chat.completions.create(**kwargs)
        except openai.APIStatusError as exc:
            raise _status_error(exc) from exc
        except openai.APITimeoutError as exc:
            raise ModelError("model request timed out", retryable=True) from exc
        except openai.APIConnectionError as exc:
            raise ModelError("could not reach the model provider", retryable=True) from exc
        except openai.APIResponseValidationError as exc:
            raise ModelError("model provider sent an invalid response", retryable=True) from exc
        except ValueError as exc:  # a body that claims to be JSON but is not
            raise ModelError("model provider sent malformed JSON", retryable=True) from exc
        except openai.OpenAIError as exc:
            raise ModelError(f"model client failed: {type(exc).__name__}") from exc
        if not isinstance(result, ChatCompletion) or not result.choices:
            raise ModelError("model provider sent a response without choices", retryable=True)
        return result

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
            arguments: Any
            try:
                arguments = json.loads(raw.function.arguments or "{}")
            except ValueError:
                arguments = None
            if not isinstance(arguments, dict):
                logger.warning("Model sent tool call %s with invalid JSON arguments", call_id)
                calls.append(ToolCall(id=call_id, name=raw.function.name))
                invalid[call_id] = INVALID_JSON_ARGUMENTS
                continue
            calls.append(ToolCall(id=call_id, name=raw.function.name, arguments=arguments))
        usage = Usage()
        if completion.usage is not None:
            usage = Usage(
                input_tokens=completion.usage.prompt_tokens or 0,
                output_tokens=completion.usage.completion_tokens or 0,
                total=completion.usage.total_tokens or 0,
            )
        content = message.content
        if content is None and not calls:
            content = message.refusal or ""
        return ModelResponse(
            content=content, tool_calls=calls, usage=usage, invalid_tool_calls=invalid
        )
