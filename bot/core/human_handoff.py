"""``transfer_to_human``: a built-in tool an agent may offer to hand its chat to a person.

Opt-in per agent: ``Agent(..., tools=[transfer_to_human])``. The tool itself
only answers the model (so the model tells the user, in its own words, that a
person will answer); the gateway sees the call among the turn's messages and
puts the conversation under human takeover in the turn's own transaction, so
the notice and the takeover commit together. Outside the gateway (``Runner``
alone) the call is just a tool call.
"""

from __future__ import annotations

from typing import Final

from bot.core.messages import Message, Role
from bot.core.tools import FunctionTool, tool

__all__ = ["TRANSFER_TO_HUMAN", "requested_human", "transfer_to_human"]

TRANSFER_TO_HUMAN: Final = "transfer_to_human"
"""The tool's name, as the model calls it."""


@tool(name=TRANSFER_TO_HUMAN)
def _transfer_to_human(reason: str) -> str:
    """Hand this conversation to a human operator. Call it when the user asks for a
    person, or when you cannot help and a person should.

    Args:
        reason: One short sentence for the operator: why a person is needed.
    """
    return (
        "A person now takes over this conversation. Tell the user in one short "
        "sentence that a person will answer here soon; do not try to solve it yourself."
    )


transfer_to_human: FunctionTool = _transfer_to_human
"""The tool to list in an agent's ``tools``."""


def requested_human(messages: list[Message]) -> str | None:
    """The reason of the first ``transfer_to_human`` call among ``messages``, or ``None``."""
    for message in messages:
        if message.role is not Role.MODEL:
            continue
        for call in message.tool_calls:
            if call.name == TRANSFER_TO_HUMAN:
                return str(call.arguments.get("reason") or "requested by the agent")
    return None
