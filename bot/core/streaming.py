"""Where a turn's answer goes while it is being written: the ``ReplyStream`` port.

The Runner hands a turn's text to a ``ReplyStream`` as the model writes it (a
Telegram draft, the terminal). What it shows is a preview only: the answer is
delivered once, after the turn committed, by whoever runs the turn (the
gateway's ledger), never by the stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from bot.core.messages import Message
from bot.core.models.base import ChatModel, ModelResponse, ToolSpec, complete_streaming

__all__ = ["ReplyStream", "ask_model"]


class ReplyStream(Protocol):
    """Receives an answer while it is written. Both methods are plain calls made on the
    event loop, once per model call and once per piece of text: they must not block."""

    def begin(self, agent: str) -> None:
        """A model call of ``agent`` starts: any text handed out before belonged to an
        earlier round (one that called tools), not to the answer, and is void."""
        ...

    def delta(self, text: str) -> None:
        """The next piece of the answer's text."""
        ...


async def ask_model(
    chat_model: ChatModel,
    stream: ReplyStream | None,
    agent: str,
    *,
    model: str,
    system: str,
    messages: Sequence[Message],
    tools: Sequence[ToolSpec],
) -> ModelResponse:
    """One model call of ``agent``'s: streamed into ``stream`` (a model that cannot
    stream gives its text as one piece), or a plain ``complete`` without one."""
    if stream is None:
        return await chat_model.complete(model=model, system=system, messages=messages, tools=tools)
    stream.begin(agent)
    return await complete_streaming(
        chat_model,
        model=model,
        system=system,
        messages=messages,
        tools=tools,
        on_text=stream.delta,
    )
