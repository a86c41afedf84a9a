"""Chatflow: LLM agents on Telegram and WhatsApp with durable, exactly-once conversations.

Test helpers (``ScriptedModel``, a fake platform adapter) are in ``bot.testing``,
imported on its own so that ``import bot`` stays light.
"""

from bot.core.agent import Agent
from bot.core.approvals import PendingApproval
from bot.core.attachments import Attachment, ToolOutput
from bot.core.buttons import Button
from bot.core.compaction import Compaction
from bot.core.human_handoff import transfer_to_human
from bot.core.long_memory import forget, recall, remember
from bot.core.mcp.servers import MCPServer, MCPServerStdio, MCPServerStreamableHttp
from bot.core.mcp.tools import ToolFilterStatic, create_static_tool_filter
from bot.core.messages import (
    AudioPart,
    ContactPart,
    DocumentPart,
    ImagePart,
    LocationPart,
    Message,
    MessagePart,
    Role,
    TextPart,
    ToolCall,
)
from bot.core.models.routing import ModelSettings
from bot.core.runner import Runner, RunResult
from bot.core.scheduling import (
    cancel_scheduled_message,
    list_scheduled_messages,
    schedule_message,
    scheduling_tools,
)
from bot.core.session import SessionContext
from bot.core.stores.base import DEFAULT_DEDUP_TTL_HOURS, BaseSessionStore, SessionDeletedError
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.streaming import ReplyStream
from bot.core.tools import Decline, ToolContext, tool
from bot.core.usage import CallUsage
from bot.core.voice import Voice
from bot.errors import (
    AgentNotFoundError,
    ApprovalError,
    ChatflowError,
    CommitOutcomeUnknownError,
    ConfigurationError,
    DatabaseUnavailableError,
    EmptyAnswerError,
    MaxToolRoundsError,
    MCPServerError,
    MediaError,
    ModelError,
    PlatformError,
    SchemaVersionError,
    SessionLeaseLostError,
    StorageError,
    TapRefusedError,
    TurnError,
)
from bot.knowledge_tools import search_knowledge

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "Agent",
    "AgentNotFoundError",
    "ApprovalError",
    "Attachment",
    "AudioPart",
    "BaseSessionStore",
    "Button",
    "CallUsage",
    "ChatflowError",
    "CommitOutcomeUnknownError",
    "Compaction",
    "ConfigurationError",
    "ContactPart",
    "DatabaseUnavailableError",
    "Decline",
    "DocumentPart",
    "EmptyAnswerError",
    "ImagePart",
    "LocationPart",
    "MCPServer",
    "MCPServerError",
    "MCPServerStdio",
    "MCPServerStreamableHttp",
    "MaxToolRoundsError",
    "MediaError",
    "Message",
    "MessagePart",
    "ModelError",
    "ModelSettings",
    "PendingApproval",
    "PlatformError",
    "ReplyStream",
    "Role",
    "RunResult",
    "Runner",
    "SQLiteSessionStore",
    "SchemaVersionError",
    "SessionContext",
    "SessionDeletedError",
    "SessionLeaseLostError",
    "SessionStore",
    "StorageError",
    "TapRefusedError",
    "TextPart",
    "ToolCall",
    "ToolContext",
    "ToolFilterStatic",
    "ToolOutput",
    "TurnError",
    "Voice",
    "cancel_scheduled_message",
    "create_static_tool_filter",
    "forget",
    "list_scheduled_messages",
    "recall",
    "remember",
    "schedule_message",
    "scheduling_tools",
    "search_knowledge",
    "tool",
    "transfer_to_human",
]
