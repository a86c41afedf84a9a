"""Tool calls that wait for a person's yes (``@tool(needs_approval=...)``).

When the model calls a gated tool, the Runner does not run it: the turn ends
with a ``PendingApproval`` (``RunResult.pending_approval``) and its reply asks
the person. The question is written for a customer: the tool's own
(``needs_approval="May I refund order {order_id}?"`` or a function's answer), or
``default_question``, built from the tool's description and its arguments'
values. When the question does not show every argument whole, a third button,
Details, sends the whole call to the person (``DETAILS``): nobody approves what
they cannot see. A check may also decline a call before anything is asked
(``Decline``): the model reads the reason.

The pending call is *not* stored in the session history at that point, so the
history never holds a tool call without its result (every provider refuses
that). Once decided, ``Runner.resume_async`` appends the
model's tool call together with its result -- the tool's real output, or one of
the ``*_RESULT`` texts below -- and asks the model for the answer.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

from bot.core.buttons import Button
from bot.core.messages import ToolCall
from bot.core.tools import Decline, FunctionTool, ToolContext

if TYPE_CHECKING:
    from bot.core.agent import Agent

__all__ = [
    "APPROVAL_BUTTON_PREFIX",
    "DECLINED_RESULT",
    "DETAILS",
    "EXPIRED_RESULT",
    "UNKNOWN_RESULT",
    "ApprovalDecision",
    "PendingApproval",
    "approval_button_value",
    "approval_buttons",
    "approval_prompt",
    "decision_result",
    "default_question",
    "details_text",
    "hold_gated",
    "new_approval_id",
    "parse_approval_button",
    "short_arguments",
]

ApprovalDecision = Literal["approved", "denied", "expired", "unknown", "ran"]
"""How a pending call ended: run it (``approved``), or tell the model it was
declined, timed out, or ran with an unknown outcome (a crash while it ran);
``ran``: it ran before and its result is kept (``PendingApproval.result``), so
the model is asked again without running it."""

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
DETAILS: Final = "Details"
"""Label of the button that sends the whole call, when the question does not show it."""

ApprovalChoice = Literal["approve", "deny", "details"]
_CHOICES: Final[tuple[ApprovalChoice, ...]] = ("approve", "deny", "details")

_MAX_ARGUMENTS = 160
_MAX_VALUE = 40
_QUESTION_VALUE = 200
"""Longest argument value the default question shows (longer: cut, and Details added)."""
_QUESTION_ARGUMENTS = 800
"""Longest list of arguments the default question shows."""
_PARENTHESIS = re.compile(r"\s*\([^()]*\)\s*$")


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
    shows_all: bool = True
    """Whether the question shows every argument whole (else a Details button is added)."""
    question: str = ""
    """The question the person is asked (``approval_prompt``); empty: the default one."""
    result: str | None = None
    """What the tool returned once an approved call ran (kept with the approval)."""

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


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _label(key: str) -> str:
    words = key.replace("_", " ").strip()
    return words[:1].upper() + words[1:]


def _action(description: str, tool_name: str) -> str:
    """``open a refund request for a paid invoice``: the first sentence of the tool's
    description (or its name in words), as the rest of "May I ...?"."""
    first = re.split(r"(?<=[.!?])\s|\n", description.strip(), maxsplit=1)[0].rstrip(".!? ")
    first = _PARENTHESIS.sub("", first) or tool_name.replace("_", " ").replace("-", " ")
    if first[:1].isupper() and not first[1:2].isupper():  # "Refund" -> "refund"; "PDF" stays
        first = first[:1].lower() + first[1:]
    return first


def default_question(
    description: str, tool_name: str, arguments: dict[str, Any]
) -> tuple[str, bool]:
    """``("May I refund an order?\nOrder id: 1001\nAmount: 25", True)``: the question to a
    customer for a call, and whether it shows every argument whole."""
    lines = [f"May I {_action(description, tool_name)}?"]
    shows_all = True
    used = 0
    for key, value in arguments.items():
        text = " ".join(_value_text(value).split())
        if len(text) > _QUESTION_VALUE:
            text = text[: _QUESTION_VALUE - 1] + "…"
        line = f"{_label(key)}: {text}"
        if used + len(line) > _QUESTION_ARGUMENTS:
            lines.append("…")
            return "\n".join(lines), False
        used += len(line)
        shows_all = shows_all and text == _value_text(value)
        lines.append(line)
    return "\n".join(lines), shows_all


def shows_every_argument(question: str, arguments: dict[str, Any]) -> bool:
    """Whether ``question`` holds every argument's value whole (a tool's own question)."""
    return all(_value_text(v) in question for v in arguments.values())


def approval_prompt(pending: PendingApproval) -> str:
    """The question the person sees: the tool's own, or the default one."""
    if pending.question:
        return pending.question
    return default_question("", pending.tool_name, pending.arguments)[0]


def details_text(tool_name: str, arguments: dict[str, Any]) -> str:
    """The whole call, for the person deciding (the Details button's message)."""
    lines = [f"Everything that runs if you approve ({tool_name}):"]
    for key, value in arguments.items():
        lines.append(f"{_label(key)}: {_value_text(value)}")
    return "\n".join(lines)


def approval_button_value(approval_id: str, choice: ApprovalChoice) -> str:
    """The value carried by an Approve / Deny / Details button."""
    return f"{APPROVAL_BUTTON_PREFIX}{approval_id}:{choice}"


def parse_approval_button(value: str) -> tuple[str, ApprovalChoice] | None:
    """``(approval id, choice)`` from a button value, ``None`` for anything else."""
    if not value.startswith(APPROVAL_BUTTON_PREFIX):
        return None
    approval_id, _, choice = value[len(APPROVAL_BUTTON_PREFIX) :].partition(":")
    if not approval_id:
        return None
    for known in _CHOICES:
        if choice == known:
            return approval_id, known
    return None


def approval_buttons(pending: PendingApproval) -> tuple[Button, ...]:
    """Approve / Deny, their values naming ``pending``; and Details when the question
    does not show the whole call."""
    buttons = (
        Button("Approve", approval_button_value(pending.approval_id, "approve")),
        Button("Deny", approval_button_value(pending.approval_id, "deny")),
    )
    if pending.shows_all:
        return buttons
    return (*buttons, Button(DETAILS, approval_button_value(pending.approval_id, "details")))


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
        asked = (
            await function_tool.approval(context(), call.arguments)
            if function_tool is not None and function_tool.gated
            else None
        )
        if isinstance(asked, Decline):
            # Nothing to ask about: the model reads why (run as an invalid call, not run).
            invalid[call.id] = f"Not done: {asked.reason}"
        elif asked is not None and function_tool is not None:
            if pending is None:
                pending = _pending(agent.name, function_tool, call, asked)
                continue
            invalid[call.id] = WAITING_RESULT
        kept.append(call)
    return kept, pending


def _pending(
    agent: str, function_tool: FunctionTool, call: ToolCall, asked: str
) -> PendingApproval:
    arguments = dict(call.arguments)
    if asked:
        question, shows_all = asked, shows_every_argument(asked, arguments)
    else:
        question, shows_all = default_question(
            function_tool.description, function_tool.name, arguments
        )
    return PendingApproval(
        approval_id=new_approval_id(),
        tool_name=call.name,
        call_id=call.id,
        arguments=arguments,
        agent=agent,
        shows_all=shows_all,
        question=question,
    )
