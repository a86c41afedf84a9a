"""Model clients: the ``ChatModel`` protocol, the OpenAI-compatible client, routing,
the offline demo model and the scripted test model.

The names of ``openai_compat`` are loaded on first use (module ``__getattr__``):
importing the openai SDK takes most of a second, and ``import bot`` must not.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from bot.core._schema import gemini_compatible_schema
from bot.core.models.base import (
    ChatModel,
    ModelResponse,
    OnText,
    StreamingChatModel,
    ToolSpec,
    Usage,
    complete_streaming,
    current_agent_name,
    sanitize_history,
)
from bot.core.models.offline import OFFLINE_PREFIX, OfflineModel
from bot.core.models.routing import (
    DEFAULT_OLLAMA_BASE_URL,
    GEMINI_BASE_URL,
    ModelRouter,
    ModelSettings,
    ModelSettingsSource,
    Route,
    default_model_name,
    route_model,
)
from bot.core.models.scripted import (
    PartialAnswer,
    RecordedCall,
    ScriptedModel,
    ScriptExhaustedError,
)

if TYPE_CHECKING:
    from bot.core.models.openai_compat import (
        INVALID_JSON_ARGUMENTS,
        OpenAICompatibleModel,
        to_openai_messages,
    )

_LAZY = {
    "INVALID_JSON_ARGUMENTS": "bot.core.models.openai_compat",
    "OpenAICompatibleModel": "bot.core.models.openai_compat",
    "to_openai_messages": "bot.core.models.openai_compat",
}

__all__ = [
    "DEFAULT_OLLAMA_BASE_URL",
    "GEMINI_BASE_URL",
    "INVALID_JSON_ARGUMENTS",
    "OFFLINE_PREFIX",
    "ChatModel",
    "ModelResponse",
    "ModelRouter",
    "ModelSettings",
    "ModelSettingsSource",
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
]


def __getattr__(name: str) -> Any:
    """Import the heavy names on first access."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this hook
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
