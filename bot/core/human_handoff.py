"""``transfer_to_human``: a built-in tool an agent may offer to hand its chat to a person.

Opt-in per agent: ``Agent(..., tools=[transfer_to_human])``. The tool itself
only answers the model (so the model tells the user, in its own words, that a
person will answer); the gateway sees the call among the turn's messages and
puts the conversation under human takeover in the turn's own transaction, so
the notice and the takeover commit together. Outside the gateway (``Runner``
alone) the call is just a tool call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.tools import FunctionTool, tool

__all__ = ["TRANSFER_TO_HUMAN", "requested_human", "transfer_to_human"]

TRANSFER_TO_HUMAN: Final = "transfer_to_human"
"""The tool's name, as the model calls it."""


_ACCEPTED: Final = (
    "A person now takes over this conversation. Tell the user in one short "
    "sentence that a person will answer here soon; do not try to solve it yourself."
)


@tool(name=TRANSFER_TO_HUMAN)
def _transfer_to_human(reason: str) -> str:
    """Hand this conversation to a human operator. Call it when the user asks for a
    person, or when you cannot help and a person should.

    Args:
        reason: One short sentence for the operator: why a person is needed.
    """
    return _ACCEPTED


transfer_to_human: FunctionTool = _transfer_to_human
"""The tool to list in an agent's ``tools``."""


def requested_human(
    messages: Sequence[Message], agent_named: Callable[[str], Agent | None]
) -> str | None:
    """The reason of the first call among ``messages`` that ran the built-in tool, or ``None``.

    A call only counts when the agent that made it offers this very tool and the
    tool answered it: a model naming ``transfer_to_human`` on an agent that never
    opted in (hallucinated, or prompt-injected) takes nothing over, and neither
    does an operator's own tool of that name, nor a call refused for bad arguments.
    ``agent_named`` resolves an agent by name (``Runner.get_agent``).
    """
    calls: dict[str, str] = {}
    for message in messages:
        if message.role is Role.MODEL and message.agent is not None:
            agent = agent_named(message.agent)
            if agent is None or agent.find_tool(TRANSFER_TO_HUMAN) is not transfer_to_human:
                continue
            for call in message.tool_calls:
                if call.name == TRANSFER_TO_HUMAN:
                    calls[call.id] = str(call.arguments.get("reason") or "requested by the agent")
        elif (
            message.role is Role.TOOL
            and message.tool_call_id in calls
            and message.content == _ACCEPTED
        ):
            return calls[message.tool_call_id]
    return None
