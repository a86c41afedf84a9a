"""Model clients: the ``ChatModel`` protocol, the OpenAI-compatible client, routing,
the offline demo model and the scripted test model."""

from bot.core.models.base import (
    ChatModel,
    ModelResponse,
    ToolSpec,
    Usage,
    current_agent_name,
    sanitize_history,
)
from bot.core.models.offline import OFFLINE_PREFIX, OfflineModel
from bot.core.models.openai_compat import (
    INVALID_JSON_ARGUMENTS,
    OpenAICompatibleModel,
    gemini_compatible_schema,
    to_openai_messages,
)
from bot.core.models.routing import (
    DEFAULT_OLLAMA_BASE_URL,
    GEMINI_BASE_URL,
    ModelRouter,
    ModelSettings,
    Route,
    default_model_name,
    resolve_model,
    route_model,
)
from bot.core.models.scripted import RecordedCall, ScriptedModel, ScriptExhaustedError

__all__ = [
    "DEFAULT_OLLAMA_BASE_URL",
    "GEMINI_BASE_URL",
    "INVALID_JSON_ARGUMENTS",
    "OFFLINE_PREFIX",
    "ChatModel",
    "ModelResponse",
    "ModelRouter",
    "ModelSettings",
    "OfflineModel",
    "OpenAICompatibleModel",
    "RecordedCall",
    "Route",
    "ScriptExhaustedError",
    "ScriptedModel",
    "ToolSpec",
    "Usage",
    "current_agent_name",
    "default_model_name",
    "gemini_compatible_schema",
    "resolve_model",
    "route_model",
    "sanitize_history",
    "to_openai_messages",
]
