"""Chatflow: LLM agents on Telegram and WhatsApp with durable, exactly-once conversations."""

from bot.core.agent import Agent
from bot.core.memory import (
    DEFAULT_DEDUP_TTL_HOURS,
    BaseSessionStore,
    SessionContext,
    SessionDeletedError,
    SessionStore,
)
from bot.core.messages import Message, Role, ToolCall
from bot.core.runner import Runner, RunResult
from bot.core.sqlite_store import SQLiteSessionStore
from bot.core.tools import ToolContext, tool
from bot.errors import ChatflowError

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "Agent",
    "BaseSessionStore",
    "ChatflowError",
    "Message",
    "Role",
    "RunResult",
    "Runner",
    "SQLiteSessionStore",
    "SessionContext",
    "SessionDeletedError",
    "SessionStore",
    "ToolCall",
    "ToolContext",
    "tool",
]
