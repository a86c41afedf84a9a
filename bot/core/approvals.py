"""Tool calls that wait for a person's yes (``@tool(needs_approval=...)``).

When the model calls a gated tool, the Runner does not run it: the turn ends
with a ``PendingApproval`` (``RunResult.pending_approval``) and its reply asks
the person. The pending call is *not* stored in the session history at that
point, so the history never holds a tool call without its result (every
provider refuses that). Once decided, ``Runner.resume_async`` appends the
model's tool call together with its result -- the tool's real output, or one of
the ``*_RESULT`` texts below -- and asks the model for the answer.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from bot.core.buttons import Button
from bot.core.messages import ToolCall
from bot.core.tools import ToolContext

if TYPE_CHECKING:
    from bot.core.agent import Agent

__all__ = [
    "APPROVAL_BUTTON_PREFIX",
    "DECLINED_RESULT",
    "EXPIRED_RESULT",
    "UNKNOWN_RESULT",
    "ApprovalDecision",
    "PendingApproval",
    "approval_button_value",
    "approval_buttons",
    "approval_prompt",
    "decision_result",
    "hold_gated",
    "new_approval_id",
    "parse_approval_button",
    "short_arguments",
]

ApprovalDecision = Literal["approved", "denied", "expired", "unknown"]
"""How a pending call ended: run it (``approved``), or tell the model it was
declined, timed out, or ran with an unknown outcome (a crash while it ran)."""

DECLINED_RESULT: Final = "The user declined: this tool call was not run."
EXPIRED_RESULT: Final = "No answer in time: the approval expired and this tool call was not run."
UNKNOWN_RESULT: Final = (
    "The outcome is unknown: the bot stopped while this tool ran. It is not run again; "
    "tell the user to check the result before asking for it again."
)
WAITING_RESULT: Final = (
    "Not run: another call of this answer is waiting for the user's approval. "
    "Call it again after that one is decided."
)

APPROVAL_BUTTON_PREFIX: Final = "chatflow-approval:"
"""Value prefix of the Approve / Deny buttons (``chatflow-approval:<id>:approve``)."""

_MAX_ARGUMENTS = 160
_MAX_VALUE = 40


def new_approval_id() -> str:
    """A short, opaque approval id (12 hex characters)."""
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class PendingApproval:
    """A tool call that waits for a decision."""

    approval_id: str
    """Short opaque id (``python -m bot approvals approve ID``)."""
    tool_name: str
    """The tool the model called."""
    call_id: str
    """The model's id of the call (its result pairs by it)."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """The arguments, as the model gave them."""
    agent: str = ""
    """The agent whose model called the tool."""

    def arguments_json(self) -> str:
        """The arguments as a JSON object."""
        return json.dumps(self.arguments, ensure_ascii=False, sort_keys=True)


def short_arguments(arguments: dict[str, Any]) -> str:
    """``order_id=1001, amount=25.0``: the arguments in short, for a person to judge."""
    parts = []
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        text = " ".join(str(text).split())
        if len(text) > _MAX_VALUE:
            text = text[: _MAX_VALUE - 1] + "…"
        parts.append(f"{key}={text}")
    joined = ", ".join(parts)
    return joined if len(joined) <= _MAX_ARGUMENTS else joined[: _MAX_ARGUMENTS - 1] + "…"


def approval_prompt(pending: PendingApproval) -> str:
    """The question the person sees: ``<agent> wants to run <tool> with <arguments>``."""
    who = pending.agent or "The assistant"
    args = short_arguments(pending.arguments)
    text = f"{who} wants to run {pending.tool_name}"
    return f"{text} with {args}" if args else text


def approval_button_value(approval_id: str, choice: Literal["approve", "deny"]) -> str:
    """The value carried by an Approve / Deny button."""
    return f"{APPROVAL_BUTTON_PREFIX}{approval_id}:{choice}"


def parse_approval_button(value: str) -> tuple[str, Literal["approve", "deny"]] | None:
    """``(approval id, choice)`` from a button value, ``None`` for anything else."""
    if not value.startswith(APPROVAL_BUTTON_PREFIX):
        return None
    approval_id, _, choice = value[len(APPROVAL_BUTTON_PREFIX) :].partition(":")
    if not approval_id or choice not in ("approve", "deny"):
        return None
    return approval_id, "approve" if choice == "approve" else "deny"


def approval_buttons(pending: PendingApproval) -> tuple[Button, Button]:
    """Approve / Deny, their values naming ``pending``."""
    return (
        Button("Approve", approval_button_value(pending.approval_id, "approve")),
        Button("Deny", approval_button_value(pending.approval_id, "deny")),
    )


def decision_result(decision: ApprovalDecision) -> str:
    """The tool result the model reads for a call that did not run."""
    return {"denied": DECLINED_RESULT, "expired": EXPIRED_RESULT}.get(decision, UNKNOWN_RESULT)


async def hold_gated(
    agent: Agent,
    calls: list[ToolCall],
    invalid: dict[str, str],
    context: Callable[[], ToolContext],
) -> tuple[list[ToolCall], PendingApproval | None]:
    """Take the first call of an answer that needs approval out of ``calls``.

    Returns the calls to run now and the pending one (``None``: none is gated).
    Further gated calls of the same answer stay, with ``WAITING_RESULT`` as their
    invalid reason (one question at a time): the model may call them again once
    this one is decided.
    """
    pending: PendingApproval | None = None
    kept: list[ToolCall] = []
    for call in calls:
        function_tool = None if call.id in invalid else agent.find_tool(call.name)
        if (
            function_tool is not None
            and function_tool.gated
            and await function_tool.requires_approval(context(), call.arguments)
        ):
            if pending is None:
                pending = PendingApproval(
                    approval_id=new_approval_id(),
                    tool_name=call.name,
                    call_id=call.id,
                    arguments=dict(call.arguments),
                    agent=agent.name,
                )
                continue
            invalid[call.id] = WAITING_RESULT
        kept.append(call)
    return kept, pending
