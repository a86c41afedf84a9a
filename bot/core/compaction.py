"""``Compaction``: when and how a long conversation is summarised (the settings and the prompt).

A session whose history passes ``trigger_tokens`` (estimated, see
``estimate_tokens``) is compacted after a turn: the model is asked for a
summary of the older turns, and the history becomes that summary (one SYSTEM
message at the head, named ``SUMMARY_NAME``) followed by the last
``keep_recent_turns`` turns, whole. The engine that does it is
``bot.core.compactor``; this module holds what it is configured with and
what it sends, and imports nothing of the agents or stores.

Token estimate
    Exact tokenizers are not used: tiktoken downloads its encodings on first
    use (a bot may run without internet, tests must), and the one PyPI
    package shipping them offline was an alpha with a 40 MB platform wheel.
    The estimate is the request's UTF-8 bytes divided by ``BYTES_PER_TOKEN``
    (4, close for English with OpenAI's encodings, high for code, low for
    Chinese or Japanese), and the engine calibrates it per session with the
    prompt tokens the provider reported for that session's last call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from bot.core.messages import Message, Role
from bot.core.models.base import ChatModel, ToolSpec
from bot.core.parts import part_text

__all__ = [
    "BYTES_PER_TOKEN",
    "DEFAULT_KEEP_RECENT_TURNS",
    "SUMMARY_INSTRUCTIONS",
    "SUMMARY_NAME",
    "Compaction",
    "estimate_tokens",
    "is_summary",
    "summary_message",
    "summary_request",
]

DEFAULT_KEEP_RECENT_TURNS: Final = 6
"""Turns kept verbatim after the summary when nothing else is said."""

BYTES_PER_TOKEN: Final = 4
"""The uncalibrated estimate: this many UTF-8 bytes of a request make one token."""

SUMMARY_NAME: Final = "conversation_summary"
"""``Message.name`` of the SYSTEM message holding a session's summary."""

_SUMMARY_HEADER: Final = "Summary of the earlier conversation (older messages were compacted):"

# Per message, what the provider adds around its content (role, separators): ~4 tokens.
_MESSAGE_OVERHEAD_BYTES: Final = 16

SUMMARY_INSTRUCTIONS: Final = (
    "You compact a customer conversation so that it can continue without its older "
    "messages. Write a summary of the transcript you are given, for the assistant who "
    "will carry on the conversation, not for the user.\n"
    "Keep every fact the conversation may need later, exactly as written: names of "
    "people and companies, ids, order numbers, reference and ticket numbers, account "
    "and phone numbers, addresses, amounts and prices with their currency, dates and "
    "times, product names and quantities. Keep the decisions taken and promises made, "
    "what tools returned that still matters, and the open questions and next steps.\n"
    "If the transcript starts with an earlier summary, merge it into yours: drop nothing "
    "from it that is still true, and prefer the newer fact where the two disagree.\n"
    "Write in the language the user writes in. Use short lines, one fact per line, in the "
    "order they happened. Do not invent anything, do not greet, do not answer the user."
)
"""The system prompt of a compaction request (what the summary must keep)."""


@dataclass(frozen=True)
class Compaction:
    """When an agent's conversations are summarised, and by which model.

    ``trigger_tokens``: compact once the estimated request passes this many
    tokens. ``keep_recent_turns``: turns kept whole after the summary (at
    least 1). ``model``: a ``ChatModel``, a model name routed like an agent's,
    or ``None`` for ``COMPACTION_MODEL``, else the agent's own model.
    """

    trigger_tokens: int
    keep_recent_turns: int = DEFAULT_KEEP_RECENT_TURNS
    model: ChatModel | str | None = None

    def __post_init__(self) -> None:
        for name, least in (("trigger_tokens", 1), ("keep_recent_turns", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"Compaction {name} must be an int, not {value!r}")
            if value < least:
                raise ValueError(f"Compaction {name} must be at least {least}, got {value}")
        model = self.model
        if isinstance(model, str):
            if not model.strip():
                raise ValueError("Compaction model must not be empty")
        elif model is not None and not callable(getattr(model, "complete", None)):
            raise TypeError(f"Compaction model must be a ChatModel or a model name, not {model!r}")


def is_summary(message: Message) -> bool:
    """Whether ``message`` is a compaction summary (a SYSTEM message named ``SUMMARY_NAME``)."""
    return message.role is Role.SYSTEM and message.name == SUMMARY_NAME


def summary_message(text: str) -> Message:
    """The SYSTEM message that holds ``text`` at the head of a compacted history."""
    return Message(role=Role.SYSTEM, name=SUMMARY_NAME, content=f"{_SUMMARY_HEADER}\n{text}")


def _summary_text(message: Message) -> str:
    content = message.content or ""
    header = f"{_SUMMARY_HEADER}\n"
    return content[len(header) :] if content.startswith(header) else content


def _transcript_line(message: Message) -> str:
    """One message of the transcript sent for summarising, as plain text."""
    texts = [message.content] if message.content else []
    texts.extend(part_text(part, image_seen=False) for part in message.parts)
    body = "\n".join(texts)
    if message.role is Role.USER:
        return f"User: {body}"
    if message.role is Role.TOOL:
        return f"Tool {message.name or ''} result: {body}"
    calls = "; ".join(
        f"{call.name}({json.dumps(call.arguments, ensure_ascii=False, sort_keys=True)})"
        for call in message.tool_calls
    )
    speaker = f"Assistant ({message.agent})" if message.agent else "Assistant"
    if calls:
        body = f"{body}\n[called {calls}]" if body else f"[called {calls}]"
    return f"{speaker}: {body}"


def summary_request(previous: Message | None, older: Sequence[Message]) -> list[Message]:
    """The messages of a compaction request: the earlier summary, then the older turns."""
    lines: list[str] = []
    if previous is not None:
        lines.append("Earlier summary:\n" + _summary_text(previous))
        lines.append("")
    lines.append("Transcript:")
    lines.extend(_transcript_line(message) for message in older if message.role is not Role.SYSTEM)
    return [Message(role=Role.USER, content="\n".join(lines))]


def _message_bytes(message: Message) -> int:
    size = _MESSAGE_OVERHEAD_BYTES + len((message.content or "").encode())
    for call in message.tool_calls:
        size += len(call.name) + len(json.dumps(call.arguments, ensure_ascii=False).encode())
    for part in message.parts:
        size += len(part_text(part).encode())
    return size


def estimate_tokens(system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]) -> int:
    """The estimated prompt tokens of a request: its UTF-8 bytes / ``BYTES_PER_TOKEN``."""
    size = len(system.encode()) + sum(_message_bytes(message) for message in messages)
    for spec in tools:
        size += len(spec.name) + len(spec.description.encode())
        size += len(json.dumps(spec.parameters, ensure_ascii=False).encode())
    return -(-size // BYTES_PER_TOKEN)
