"""A scripted ``ChatModel`` for tests: canned answers in order, every request recorded.

>>> model = ScriptedModel([ScriptedModel.call("lookup_order", order_id="1234"),
...                        ScriptedModel.reply("It ships tomorrow.")])

A step may also be an exception (raised instead of answering), a
``PartialAnswer`` (some text streamed, then an exception: a model failing
mid-answer) or a callable taking the ``RecordedCall`` and returning a
``ModelResponse`` (or an awaitable of one), e.g. to hold a turn inside the
model call until an ``asyncio.Event`` is set.

``stream`` plays the same steps, handing out the text word by word.
"""

from __future__ import annotations

import inspect
import itertools
import re
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.core.messages import Message, ToolCall
from bot.core.models.base import ModelResponse, OnText, ToolSpec, Usage, current_agent_name

__all__ = ["PartialAnswer", "RecordedCall", "ScriptExhaustedError", "ScriptedModel", "Step"]

_PIECE_RE = re.compile(r"\s*\S+\s*|\s+")


@dataclass(frozen=True)
class RecordedCall:
    """One request a ``ScriptedModel`` received."""

    model: str
    """Model name the caller asked for."""
    system: str
    """System prompt."""
    messages: tuple[Message, ...]
    """History as sent (a snapshot)."""
    tools: tuple[ToolSpec, ...]
    """Tools offered."""
    agent: str | None = None
    """Agent the runner made the call for (``current_agent_name``)."""

    @property
    def tool_names(self) -> list[str]:
        """Names of the tools offered, in order."""
        return [spec.name for spec in self.tools]


@dataclass(frozen=True)
class PartialAnswer:
    """A step that streams ``text`` and then raises ``error`` (``complete`` just raises)."""

    text: str
    """What is handed out before the failure."""
    error: BaseException
    """Raised after the text."""


Step = (
    ModelResponse
    | BaseException
    | PartialAnswer
    | Callable[[RecordedCall], ModelResponse | Awaitable[ModelResponse]]
)
"""One scripted answer."""


_CALL_IDS = itertools.count(1)


class ScriptExhaustedError(AssertionError):
    """The model was called more often than the script has steps."""


@dataclass
class ScriptedModel:
    """Returns its steps in order and records what it was sent."""

    steps: Iterable[Step] = ()
    """The script; more can be appended with ``add``."""
    requests: list[RecordedCall] = field(default_factory=list)
    """Every request received, in order."""

    def __post_init__(self) -> None:
        self._queue: deque[Step] = deque(self.steps)

    def add(self, *steps: Step) -> None:
        """Append steps to the script."""
        self._queue.extend(steps)

    @property
    def remaining(self) -> int:
        """Steps not used yet."""
        return len(self._queue)

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        """Record the request and play the next step."""
        return await self._play(model, system, messages, tools, None)

    async def stream(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText,
    ) -> ModelResponse:
        """Like ``complete``, handing the answer's text to ``on_text`` word by word."""
        response = await self._play(model, system, messages, tools, on_text)
        for piece in _PIECE_RE.findall(response.content or ""):
            on_text(piece)
        return response

    async def _play(
        self,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText | None,
    ) -> ModelResponse:
        record = RecordedCall(
            model=model,
            system=system,
            messages=tuple(messages),
            tools=tuple(tools),
            agent=current_agent_name.get(),
        )
        self.requests.append(record)
        if not self._queue:
            raise ScriptExhaustedError(
                f"ScriptedModel called {len(self.requests)} times but had "
                f"{len(self.requests) - 1} steps"
            )
        step = self._queue.popleft()
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, PartialAnswer):
            if on_text is not None:
                for piece in _PIECE_RE.findall(step.text):
                    on_text(piece)
            raise step.error
        if isinstance(step, ModelResponse):
            return step
        produced = step(record)
        if inspect.isawaitable(produced):
            produced = await produced
        return produced

    @staticmethod
    def reply(text: str, *, usage: Usage | None = None) -> ModelResponse:
        """A plain text answer."""
        return ModelResponse(content=text, usage=usage or Usage(input_tokens=1, output_tokens=1))

    @staticmethod
    def tool_call(name: str, /, **arguments: Any) -> ToolCall:
        """A ``ToolCall`` with a fresh unique id, for ``calls``."""
        return ToolCall(id=f"call_s{next(_CALL_IDS)}", name=name, arguments=arguments)

    @staticmethod
    def call(tool_name: str, /, **arguments: Any) -> ModelResponse:
        """An answer that calls one tool with ``arguments``."""
        return ScriptedModel.calls(ScriptedModel.tool_call(tool_name, **arguments))

    @staticmethod
    def calls(
        *tool_calls: ToolCall | tuple[str, Mapping[str, Any]],
        content: str | None = None,
        invalid: Mapping[str, str] | None = None,
    ) -> ModelResponse:
        """An answer with several tool calls (``ToolCall`` or ``(name, arguments)``)."""
        built = [
            item
            if isinstance(item, ToolCall)
            else ScriptedModel.tool_call(item[0], **dict(item[1]))
            for item in tool_calls
        ]
        return ModelResponse(
            content=content,
            tool_calls=built,
            usage=Usage(input_tokens=1, output_tokens=1),
            invalid_tool_calls=dict(invalid or {}),
        )
