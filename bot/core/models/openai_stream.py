"""Reading a streamed Chat Completion (``stream=True``): text handed out as it
arrives, tool-call deltas put back together, one ``ModelResponse`` at the end.

A tool call arrives in pieces keyed by ``index``: the id and name first, then
the JSON arguments a few characters at a time. Its arguments are parsed only
once the stream ends, by the same rule as a whole completion.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncStream
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from bot.core.messages import ToolCall
from bot.core.models.base import ModelResponse, OnText, Usage

__all__ = ["INVALID_JSON_ARGUMENTS", "read_stream", "tool_call_of", "usage_of"]

logger = logging.getLogger(__name__)

INVALID_JSON_ARGUMENTS = "arguments were not valid JSON"
"""Error text the runner returns for a tool call whose arguments did not parse."""


def tool_call_of(call_id: str, name: str, raw_arguments: str | None) -> tuple[ToolCall, str | None]:
    """The ``ToolCall`` for a function call, and why its arguments are unusable (or ``None``)."""
    arguments: Any
    try:
        arguments = json.loads(raw_arguments or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        logger.warning("Model sent tool call %s with invalid JSON arguments", call_id)
        return ToolCall(id=call_id, name=name), INVALID_JSON_ARGUMENTS
    return ToolCall(id=call_id, name=name, arguments=arguments), None


def usage_of(reported: CompletionUsage | None) -> Usage:
    """The ``Usage`` of a completion's (or the last chunk's) ``usage`` object.

    ``prompt_tokens_details.cached_tokens`` and
    ``completion_tokens_details.reasoning_tokens`` are read where the provider
    sends them; a missing count is 0, never estimated.
    """
    if reported is None:
        return Usage()
    prompt_details = reported.prompt_tokens_details
    completion_details = reported.completion_tokens_details
    return Usage(
        input_tokens=reported.prompt_tokens or 0,
        output_tokens=reported.completion_tokens or 0,
        total=reported.total_tokens or 0,
        cached_input_tokens=(prompt_details.cached_tokens or 0) if prompt_details else 0,
        reasoning_tokens=(completion_details.reasoning_tokens or 0) if completion_details else 0,
    )


@dataclass
class _PendingCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


async def read_stream(
    chunks: AsyncStream[ChatCompletionChunk],
    on_text: OnText,
    parse: Callable[[ChatCompletion], ModelResponse],
) -> ModelResponse:
    """Consume ``chunks``, calling ``on_text`` with each piece of text; the whole answer.

    A server that ignored ``stream=True`` and answered one JSON completion is
    read with ``parse``, its text handed out in one piece. Errors of the
    iteration (a dropped connection, an error event) propagate as the SDK
    raised them: the caller translates them.
    """
    if not chunks.response.headers.get("content-type", "").startswith("text/event-stream"):
        await chunks.response.aread()
        response = parse(ChatCompletion.model_validate_json(chunks.response.content))
        if response.content:
            on_text(response.content)
        return response
    text: list[str] = []
    refusal: list[str] = []
    calls: dict[int, _PendingCall] = {}
    usage = Usage()
    async for chunk in chunks:
        if chunk.usage is not None:
            usage = usage_of(chunk.usage)
        if not chunk.choices:
            continue  # the usage chunk of stream_options.include_usage
        delta = chunk.choices[0].delta
        if delta.content:
            text.append(delta.content)
            on_text(delta.content)
        if delta.refusal:
            refusal.append(delta.refusal)
        for piece in delta.tool_calls or ():
            pending = calls.setdefault(piece.index, _PendingCall())
            if piece.id:
                pending.call_id = piece.id
            if piece.function is not None:
                if piece.function.name:
                    pending.name += piece.function.name
                if piece.function.arguments:
                    pending.arguments.append(piece.function.arguments)
    tool_calls: list[ToolCall] = []
    invalid: dict[str, str] = {}
    for index in sorted(calls):
        pending = calls[index]
        call_id = pending.call_id or f"call_{uuid.uuid4().hex[:24]}"
        call, problem = tool_call_of(call_id, pending.name or "unknown", "".join(pending.arguments))
        tool_calls.append(call)
        if problem is not None:
            invalid[call_id] = problem
    content: str | None = "".join(text) if text else None
    if content is None and not tool_calls:
        content = "".join(refusal)
        if content:
            on_text(content)
    return ModelResponse(
        content=content, tool_calls=tool_calls, usage=usage, invalid_tool_calls=invalid
    )
