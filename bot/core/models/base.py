"""The model interface every provider client implements, and the history checks before a call."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from bot.core.messages import Message, Role, ToolCall

__all__ = [
    "ChatModel",
    "ModelResponse",
    "OnText",
    "StreamingChatModel",
    "ToolSpec",
    "Usage",
    "complete_streaming",
    "current_agent_name",
    "sanitize_history",
]

current_agent_name: ContextVar[str | None] = ContextVar("chatflow_current_agent", default=None)
"""Name of the agent a model call is made for (set by the Runner around each call).

Provider clients ignore it; the offline demo model uses it to introduce itself.
"""


@dataclass(frozen=True)
class Usage:
    """Token counts of one model call, or a sum of several (``a + b``)."""

    input_tokens: int = 0
    """Prompt tokens."""
    output_tokens: int = 0
    """Completion tokens (reasoning included, when the provider counts it there)."""
    total: int = 0
    """Total tokens; computed as input + output when not given."""
    cached_input_tokens: int = 0
    """Of ``input_tokens``, those the provider served from its prompt cache (0 when
    it reports none)."""
    reasoning_tokens: int = 0
    """Of ``output_tokens``, the reasoning tokens (0 when the provider reports none)."""

    def __post_init__(self) -> None:
        if self.total == 0 and (self.input_tokens or self.output_tokens):
            object.__setattr__(self, "total", self.input_tokens + self.output_tokens)

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            total=self.total + other.total,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )


@dataclass(frozen=True)
class ToolSpec:
    """A tool as offered to the model: name, description and JSON schema of its arguments."""

    name: str
    """Name the model calls it by."""
    description: str
    """What it does."""
    parameters: Mapping[str, Any]
    """JSON schema of the arguments object."""
    handoff_target: str | None = None
    """For a handoff tool, the name of the agent it transfers to; ``None`` otherwise."""


@dataclass
class ModelResponse:
    """What a model answered: text, tool calls, or both."""

    content: str | None = None
    """Text of the answer (``None`` when it only calls tools)."""
    tool_calls: list[ToolCall] = field(default_factory=list)
    """Tools the model asked to run, in order."""
    usage: Usage = field(default_factory=Usage)
    """Tokens spent on this call."""
    finish_reason: str | None = None
    """Why the model stopped (``stop``, ``tool_calls``, ``length``...), if it said."""
    invalid_tool_calls: dict[str, str] = field(default_factory=dict)
    """Tool call id -> why its arguments could not be used (e.g. not valid JSON).

    Such a call is kept in the history, and the runner answers it with this
    error instead of running the tool, so the model can try again."""


@runtime_checkable
class ChatModel(Protocol):
    """A chat model client: one request, one answer. Retries are the client's business."""

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        """Answer the conversation ``messages`` under the system prompt ``system``.

        Raises ``ModelError`` when the provider fails.
        """
        ...


OnText = Callable[[str], None]
"""Called with each piece of an answer's text as it arrives (plain, no await:
cheap enough to run once per token)."""


@runtime_checkable
class StreamingChatModel(ChatModel, Protocol):
    """A ``ChatModel`` that can also hand out its answer's text while it is written."""

    async def stream(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText,
    ) -> ModelResponse:
        """Like ``complete``, calling ``on_text`` with each piece of the text as it arrives.

        The response is the whole answer, as ``complete`` gives it (tool calls
        included); its ``content`` is the pieces joined. Raises ``ModelError``,
        also after some pieces were handed out.
        """
        ...


async def complete_streaming(
    chat_model: ChatModel,
    *,
    model: str,
    system: str,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
    on_text: OnText,
) -> ModelResponse:
    """``chat_model.stream(...)``, or for a model that cannot stream, ``complete``
    with its whole text handed to ``on_text`` as one piece."""
    if isinstance(chat_model, StreamingChatModel):
        return await chat_model.stream(
            model=model, system=system, messages=messages, tools=tools, on_text=on_text
        )
    response = await chat_model.complete(model=model, system=system, messages=messages, tools=tools)
    if response.content:
        on_text(response.content)
    return response


def sanitize_history(messages: Sequence[Message]) -> list[Message]:
    """Return the history a provider accepts: no orphans, user first, no user runs.

    - A TOOL message is kept only inside the run of TOOL messages that follows
      the MODEL message whose tool call it answers (first answer wins).
    - A MODEL tool call with no answer in that run is removed; a MODEL message
      left with neither text nor tool calls is dropped.
    - Non-system messages before the first USER message are dropped.
    - Consecutive USER messages are merged, and a text-only MODEL message
      followed by another MODEL message is merged into it (roles alternate).
    SYSTEM messages are kept where they are.
    """
    kept: list[Message] = []
    index = 0
    total = len(messages)
    while index < total:
        message = messages[index]
        if message.role is Role.TOOL:
            index += 1  # not directly after a MODEL message with calls: an orphan
            continue
        if message.role is not Role.MODEL or not message.tool_calls:
            kept.append(message)
            index += 1
            continue
        run_end = index + 1
        while run_end < total and messages[run_end].role is Role.TOOL:
            run_end += 1
        call_ids = {call.id for call in message.tool_calls}
        answers: dict[str, Message] = {}
        for answer in messages[index + 1 : run_end]:
            if answer.tool_call_id in call_ids and answer.tool_call_id not in answers:
                answers[answer.tool_call_id] = answer
        calls = [call for call in message.tool_calls if call.id in answers]
        if calls:
            if len(calls) != len(message.tool_calls):
                message = message.model_copy(update={"tool_calls": calls})
            kept.append(message)
            kept.extend(answers[call.id] for call in calls)
        elif message.content:
            kept.append(message.model_copy(update={"tool_calls": []}))
        index = run_end

    result: list[Message] = []
    seen_user = False
    for message in kept:
        if message.role is Role.SYSTEM:
            result.append(message)
            continue
        if not seen_user:
            if message.role is not Role.USER:
                continue
            seen_user = True
        previous = _last_non_system(result)
        if previous is not None and previous.role is Role.USER and message.role is Role.USER:
            result[result.index(previous)] = previous.model_copy(
                update={
                    "content": _join(previous.content, message.content),
                    "parts": [*previous.parts, *message.parts],
                }
            )
            continue
        if (
            previous is not None
            and previous.role is Role.MODEL
            and message.role is Role.MODEL
            and not previous.tool_calls
            and result[-1] is previous
        ):
            result[-1] = message.model_copy(
                update={"content": _join(previous.content, message.content)}
            )
            continue
        result.append(message)
    return result


def _last_non_system(messages: list[Message]) -> Message | None:
    for message in reversed(messages):
        if message.role is not Role.SYSTEM:
            return message
    return None


def _join(first: str | None, second: str | None) -> str | None:
    parts = [part for part in (first, second) if part]
    return "\n\n".join(parts) if parts else None
