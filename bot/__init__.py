"""Chatflow: LLM agents on Telegram and WhatsApp with durable, exactly-once conversations.

Test helpers (``ScriptedModel``, a fake platform adapter) are in ``bot.testing``,
imported on its own so that ``import bot`` stays light.
"""

from bot.core.agent import Agent
from bot.core.memory import (
    DEFAULT_DEDUP_TTL_HOURS,
    BaseSessionStore,
    SessionContext,
    SessionDeletedError,
    SessionStore,
)
from bot.core.messages import Message, Role, ToolCall
from bot.core.models.routing import ModelSettings
from bot.core.runner import Runner, RunResult
from bot.core.sqlite_store import SQLiteSessionStore
from bot.core.tools import ToolContext, tool
from bot.errors import (
    AgentNotFoundError,
    ChatflowError,
    ConfigurationError,
    EmptyAnswerError,
    MaxToolRoundsError,
    ModelError,
    PlatformError,
    SchemaVersionError,
    StorageError,
    TurnError,
)

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "Agent",
    "AgentNotFoundError",
    "BaseSessionStore",
    "ChatflowError",
    "ConfigurationError",
    "EmptyAnswerError",
    "MaxToolRoundsError",
    "Message",
    "ModelError",
    "ModelSettings",
    "PlatformError",
    "Role",
    "RunResult",
    "Runner",
    "SQLiteSessionStore",
    "SchemaVersionError",
    "SessionContext",
    "SessionDeletedError",
    "SessionStore",
    "StorageError",
    "ToolCall",
    "ToolContext",
    "TurnError",
    "tool",
]
