"""The names of Chatflow's own spans and attributes (docs/ARCHITECTURE.md, "Tracing").

The model, agent and tool spans follow the OpenTelemetry GenAI conventions
(``invoke_agent {agent}``, ``chat {model}``, ``execute_tool {tool}``); the rest,
the path of a message through the gateway, are named here.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "APPROVAL_PAUSE",
    "COMPACTION",
    "CONTINUATION",
    "CONVERSATION_ID",
    "DOCUMENT",
    "HANDOFF",
    "MCP_CALL",
    "OUTCOME",
    "PLATFORM",
    "QUEUE",
    "RECEIVE",
    "RESEND",
    "SCHEDULED",
    "SEND",
    "SESSION_ID",
    "TRANSCRIPTION",
    "TURN_RECOVERED",
    "TX1",
    "TX2",
]

RECEIVE: Final = "chatflow.receive"
"""Root of a message's trace: the platform handed it over (webhook or poll) until queued."""
TX1: Final = "chatflow.tx1"
"""The inbound journal's transaction (the message durably accepted)."""
QUEUE: Final = "chatflow.queue"
"""The wait in the conversation's lane, from queued to started."""
TX2: Final = "chatflow.tx2"
"""The turn's transaction: history, owed reply, inbox row closed."""
SEND: Final = "chatflow.send"
"""One owed reply sent to its platform; ``chatflow.send.outcome`` says how it went."""
RESEND: Final = "chatflow.resend"
"""An owed reply sent outside its turn (after a crash, a retry, by another process):
a new trace linked to the span that recorded it."""
SCHEDULED: Final = "chatflow.scheduled"
"""A scheduled job's turn: a new trace linked to the span that scheduled it."""
CONTINUATION: Final = "chatflow.approval_continuation"
"""The turn after a person decided an approval: a new trace linked to the span of the
turn that asked."""
TURN_RECOVERED: Final = "chatflow.recovered"
"""A message re-run from the journal (after a restart, or taken over): a new trace."""
HANDOFF: Final = "chatflow.handoff"
"""An agent handed the conversation to another."""
COMPACTION: Final = "chatflow.compaction"
"""Older turns summarised."""
TRANSCRIPTION: Final = "chatflow.transcription"
"""A voice note or audio file turned into text."""
DOCUMENT: Final = "chatflow.document"
"""A document read into text."""
MCP_CALL: Final = "chatflow.mcp_call"
"""A call to an MCP server's tool (inside its ``execute_tool`` span)."""
APPROVAL_PAUSE: Final = "chatflow.approval_pause"
"""A turn ended to wait for a person's approval of a tool call."""

PLATFORM: Final = "chatflow.platform"
OUTCOME: Final = "chatflow.send.outcome"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
SESSION_ID: Final = "session.id"
