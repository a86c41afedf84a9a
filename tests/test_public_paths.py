"""Every public import path (DESIGN §1 and §3, and the package faces) keeps its ``__all__``.

The modules behind a path may move (a module becoming a package keeps its path
as the package); what operators and other people's tests import from it may not
change without this test changing with it.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

PUBLIC_PATHS: dict[str, set[str]] = {
    "bot.core.memory": {
        "AgentResolver",
        "BaseSessionStore",
        "DEFAULT_DEDUP_TTL_HOURS",
        "DEFAULT_MAX_TURNS",
        "KeyedLocks",
        "LogSafePredicate",
        "NO_SQL_MESSAGE",
        "NotTransactionalError",
        "PURGE_BATCH_SIZE",
        "PURGE_INTERVAL",
        "SaveHook",
        "SessionCheckpoint",
        "SessionContext",
        "SessionDeletedError",
        "SessionStore",
        "Transaction",
        "TransactionalStore",
        "dump_metadata",
        "log_session_id",
        "require_transactional",
        "seq_runs",
        "set_log_safe_session_ids",
        "validate_session_id",
    },
    "bot.core.sqlite_store": {"BUSY_TIMEOUT_MS", "SCHEMA_VERSION", "SQLiteSessionStore"},
    "bot.gateway.ledger": {
        "DeliveryLedger",
        "MAX_ATTEMPTS",
        "Obligation",
        "ObligationState",
        "Owner",
        "OwnerLiveness",
        "RECOVERED_MARKER",
        "RETENTION",
        "RETRY_BACKOFF",
        "STALE_AFTER",
        "STATES",
        "compute_obligation_id",
        "is_owner_alive",
    },
    "bot.gateway.access": {
        "AccessControl",
        "Admission",
        "Gate",
        "NOT_ADMITTED_ERROR",
        "PAIRING_ERROR",
        "Pairing",
        "RATE_LIMITED_ERROR",
        "RateLimits",
        "pairing_reply",
        "rate_limit_notice",
    },
    "bot.platforms.telegram": {
        "GENERAL_TOPIC_ID",
        "TelegramAdapter",
        "WEBHOOK_PATH",
        "map_update",
        "translate_error",
    },
    "bot.platforms.whatsapp": {
        "DEFAULT_API_VERSION",
        "MAX_BODY_BYTES",
        "RETRYABLE_CODES",
        "StatusFailedHandler",
        "WEBHOOK_PATH",
        "WhatsAppAdapter",
        "is_group_chat_id",
    },
    "bot.platforms.base": {
        "EventHandler",
        "PlatformAdapter",
        "PlatformError",
        "SendResult",
        "StatusFailedHandler",
    },
    "bot.platforms.console": {
        "CONSOLE_CHAT_ID",
        "CONSOLE_DRAFT_INTERVAL",
        "CONSOLE_SENDER_ID",
        "ConsoleAdapter",
        "LineInput",
        "NOT_ADMITTED_NOTICE",
        "PROMPT",
        "TextOutput",
    },
    "platforms.base": {
        "EventHandler",
        "PlatformAdapter",
        "PlatformError",
        "SendResult",
        "StatusFailedHandler",
    },
    "platforms.telegram": {
        "GENERAL_TOPIC_ID",
        "TelegramAdapter",
        "WEBHOOK_PATH",
        "map_update",
        "translate_error",
    },
    "platforms.whatsapp": {
        "DEFAULT_API_VERSION",
        "MAX_BODY_BYTES",
        "RETRYABLE_CODES",
        "StatusFailedHandler",
        "WEBHOOK_PATH",
        "WhatsAppAdapter",
        "is_group_chat_id",
    },
    "platforms.console": {
        "CONSOLE_CHAT_ID",
        "CONSOLE_DRAFT_INTERVAL",
        "CONSOLE_SENDER_ID",
        "ConsoleAdapter",
        "LineInput",
        "NOT_ADMITTED_NOTICE",
        "PROMPT",
        "TextOutput",
    },
    "bot.gateway.events": {
        "ChatType",
        "MediaAttachment",
        "MessageEvent",
        "SessionSource",
        "encodable",
        "event_from_dict",
        "event_to_dict",
    },
    "bot.gateway.keys": {
        "KEY_PREFIX",
        "SECRET_FILE_NAME",
        "build_session_key",
        "hash_chat_id",
        "hash_id",
        "hash_sender_id",
        "is_gateway_session_id",
        "is_path_unsafe",
        "is_session_key_unsafe",
        "load_or_create_secret",
        "load_or_create_shared_secret",
        "log_ref",
        "session_id_for",
    },
    "bot.gateway.inbox": {
        "Inbox",
        "InboxClaimLostError",
        "InboxEntry",
        "InboxState",
        "MAX_RECOVERIES",
        "RETENTION",
        "event_from_dict",
        "event_to_dict",
    },
    "bot.gateway.gateway": {"Gateway", "Replies"},
    "bot.core.messages": {
        "AudioPart",
        "ContactPart",
        "DocumentPart",
        "ImagePart",
        "LocationPart",
        "MediaPart",
        "Message",
        "MessagePart",
        "Role",
        "TextPart",
        "ToolCall",
    },
    "bot.core.agent": {
        "Agent",
        "FunctionTool",
        "HANDOFF_PREFIX",
        "HandoffTool",
        "ToolContext",
        "check_tool_names",
        "handoff_tool_name",
        "servers_of",
        "snake_case",
        "tool",
    },
    "bot.core.runner": {"OnCommit", "RunResult", "Runner"},
    "bot.core.models": {
        "ChatModel",
        "DEFAULT_OLLAMA_BASE_URL",
        "GEMINI_BASE_URL",
        "INVALID_JSON_ARGUMENTS",
        "ModelResponse",
        "ModelRouter",
        "ModelSettings",
        "ModelSettingsSource",
        "OFFLINE_PREFIX",
        "OfflineModel",
        "OnText",
        "OpenAICompatibleModel",
        "PartialAnswer",
        "RecordedCall",
        "Route",
        "ScriptExhaustedError",
        "ScriptedModel",
        "StreamingChatModel",
        "ToolSpec",
        "Usage",
        "complete_streaming",
        "current_agent_name",
        "default_model_name",
        "gemini_compatible_schema",
        "route_model",
        "sanitize_history",
        "to_openai_messages",
    },
}


@pytest.mark.parametrize("path", sorted(PUBLIC_PATHS))
def test_a_public_path_keeps_its_names(path: str) -> None:
    module = importlib.import_module(path)
    assert set(module.__all__) == PUBLIC_PATHS[path]
    for name in module.__all__:
        assert hasattr(module, name), f"{path}.{name}"


def test_the_stores_face_loads_asyncpg_only_when_asked() -> None:
    code = (
        "import sys, bot.core.stores as s; assert 'asyncpg' not in sys.modules; "
        "s.PostgresSessionStore; assert 'asyncpg' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
