"""Buttons: choices a tool offers under the turn's reply, and what the model is told of them.

A tool returns ``ToolOutput(text, buttons=["Yes", Button("No", value="no")])``;
the Runner keeps the buttons of the last tool output that had any
(``RunResult.buttons``) and the gateway shows them under the final reply. A tap
comes back as a message whose text is the label (``MessageEvent.button`` holds
the ``Button``). Labels and values are data: never markup, never logged at INFO.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAX_BUTTONS",
    "MAX_LABEL_CHARS",
    "Button",
    "buttons_note",
    "normalise_buttons",
    "offer_buttons",
    "too_many_note",
]

MAX_BUTTONS: Final = 10
"""Most buttons one reply may carry (WhatsApp lists stop at 10 rows)."""
MAX_LABEL_CHARS: Final = 200
"""Longest label kept: platforms cut further (WhatsApp 20/24, Telegram ~64 on screen)."""


@dataclass(frozen=True, slots=True)
class Button:
    """One choice: ``label`` is what the person sees and taps, ``value`` what the model reads
    (the label when not given)."""

    label: str
    """What the person sees; also the text of the message a tap becomes."""
    value: str | None = None
    """What the tool means by it (``None``: the label)."""

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label.strip():
            raise ValueError("a button needs a non-empty label")
        if len(self.label) > MAX_LABEL_CHARS:
            raise ValueError(f"a button label is at most {MAX_LABEL_CHARS} characters")
        if self.value is not None and not isinstance(self.value, str):
            raise TypeError("a button's value must be a str")

    @property
    def effective_value(self) -> str:
        """``value``, or the label when none was given."""
        return self.label if self.value is None else self.value


def normalise_buttons(buttons: Iterable[str | Button]) -> tuple[Button, ...]:
    """``buttons`` as ``Button`` objects (a string is a label); raises for a bad one."""
    out: list[Button] = []
    for item in buttons:
        if isinstance(item, Button):
            out.append(item)
        elif isinstance(item, str):
            out.append(Button(item))
        else:
            raise TypeError("buttons are strings or Button objects")
    return tuple(out)


def buttons_note(buttons: tuple[Button, ...]) -> str:
    """The line the model reads for the buttons a tool offered."""
    # Labels are quoted as JSON-ish strings so a label never reads as an instruction.
    labels = ", ".join(repr(b.label) for b in buttons)
    return (
        f"[{len(buttons)} button(s) will be shown under your reply: {labels}. "
        "Write the question they answer; the person's tap comes back as a message "
        "with the button's label.]"
    )


def too_many_note(count: int) -> str:
    """The error the model reads for a tool output with more than ``MAX_BUTTONS`` buttons."""
    return (
        f"[error: {count} buttons were returned but at most {MAX_BUTTONS} can be shown; "
        "no buttons will be shown with your reply]"
    )


def offer_buttons(
    output: object, text: str, current: tuple[Button, ...]
) -> tuple[str, tuple[Button, ...]]:
    """The tool result text the model reads and the turn's buttons after one tool output.

    A ``ToolOutput`` with buttons replaces ``current`` (the last one wins) and
    the model is told they will be shown; more than ``MAX_BUTTONS`` keeps
    ``current`` and tells the model none of these will be shown.
    """
    buttons: tuple[Button, ...] = getattr(output, "buttons", ())
    if not buttons:
        return text, current
    if len(buttons) > MAX_BUTTONS:
        return _joined(text, too_many_note(len(buttons))), current
    return _joined(text, buttons_note(buttons)), buttons


def _joined(text: str, note: str) -> str:
    return f"{text}\n{note}" if text else note
