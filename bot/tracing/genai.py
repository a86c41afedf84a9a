"""The GenAI semantic conventions' attributes of the agent, model and tool spans.

Names, counts and hashes only; content (the user's message, the answer, a
tool's arguments and result) only through ``spans.content``, i.e. only when
the operator opted in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from bot.tracing import names, spans

__all__ = [
    "ModelAnswer",
    "agent_attributes",
    "agent_span",
    "chat_attributes",
    "model_answered",
    "tool_arguments",
    "tool_attributes",
]


def agent_attributes(agent: str, conversation_key: str) -> dict[str, spans.AttributeValue]:
    """``invoke_agent {agent}``: the agent, and the conversation as a hash."""
    conversation = spans.conversation_id(conversation_key)
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": agent,
        names.CONVERSATION_ID: conversation,
        names.SESSION_ID: conversation,  # Langfuse groups a chat's traces by it
    }


def agent_span(
    agent: str, metadata: Mapping[str, Any] | None, session_id: str
) -> AbstractContextManager[spans.SpanHandle]:
    """The ``invoke_agent {agent}`` span of a turn; its conversation is the session key
    in ``metadata`` (the gateway's), else the session id."""
    if not spans.enabled():
        return spans.NO_SPAN  # no hash, no attributes
    key = str((metadata or {}).get("session_key") or session_id)
    return spans.span(f"invoke_agent {agent}", agent_attributes(agent, key))


def chat_attributes(model: str, provider: str, agent: str) -> dict[str, spans.AttributeValue]:
    """``chat {model}``: the model asked, its provider, the agent asking."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": model,
        "gen_ai.provider.name": provider,
        "gen_ai.agent.name": agent,
    }


def tool_attributes(tool: str, call_id: str) -> dict[str, spans.AttributeValue]:
    """``execute_tool {tool}``: the tool and the model's id of the call."""
    return {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.call.id": call_id,
    }


class _Usage(Protocol):
    @property
    def input_tokens(self) -> int: ...

    @property
    def output_tokens(self) -> int: ...


class ModelAnswer(Protocol):
    """What ``model_answered`` reads of a model's response (``ModelResponse``)."""

    @property
    def usage(self) -> _Usage: ...

    @property
    def finish_reason(self) -> str | None: ...

    @property
    def tool_calls(self) -> Sequence[object]: ...

    @property
    def content(self) -> str | None: ...


def model_answered(traced: spans.SpanHandle, response: ModelAnswer) -> None:
    """A ``chat`` span's answer: token usage and why the model stopped."""
    traced.set("gen_ai.usage.input_tokens", response.usage.input_tokens)
    traced.set("gen_ai.usage.output_tokens", response.usage.output_tokens)
    reason = response.finish_reason or ("tool_calls" if response.tool_calls else "stop")
    traced.set("gen_ai.response.finish_reasons", (reason,))
    spans.content(traced, "gen_ai.output.messages", response.content)


def tool_arguments(traced: spans.SpanHandle, arguments: Mapping[str, Any]) -> None:
    """A tool call's arguments as JSON, only when the operator opted in to content."""
    if spans.capturing_content():
        spans.content(
            traced,
            "gen_ai.tool.call.arguments",
            json.dumps(arguments, ensure_ascii=False, default=str),
        )
