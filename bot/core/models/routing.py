"""Model names to clients.

==========================  =============================================
``offline``                 the built-in demo model (no network)
``openai/<name>``           OpenAI-compatible server: ``OPENAI_BASE_URL``
                            (default OpenAI) with ``OPENAI_API_KEY``
``gpt-*``, ``o1*``, ``o3*``,  same, name passed as is
``o4*``, ``chatgpt-*``
``gemini-*``                Gemini's OpenAI endpoint with ``GEMINI_API_KEY``
``ollama/<name>``           ``OLLAMA_BASE_URL`` (default localhost:11434/v1)
==========================  =============================================

Anything else, or a missing key, is a ``ConfigurationError`` naming the
setting, raised when the Runner is built, before any message is handled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from bot.core.models.base import ChatModel
from bot.core.models.offline import OfflineModel
from bot.core.models.openai_compat import OpenAICompatibleModel, gemini_compatible_schema
from bot.errors import ConfigurationError

__all__ = [
    "DEFAULT_OLLAMA_BASE_URL",
    "GEMINI_BASE_URL",
    "ModelRouter",
    "ModelSettings",
    "Route",
    "default_model_name",
    "resolve_model",
    "route_model",
]

logger = logging.getLogger(__name__)

GEMINI_BASE_URL = "https://generativelanguage.googleapis.com/v1beta/openai/"
"""Gemini's OpenAI-compatible endpoint."""
DEFAULT_OLLAMA_BASE_URL = "http://localhost:11434/v1"
"""Where Ollama serves its OpenAI-compatible API by default."""

_OPENAI_PREFIXES = ("gpt-", "o1", "o3", "o4", "chatgpt-")
_OFFLINE = "offline"


def _secret(value: Any) -> str | None:
    """Plain text of a setting that may be a pydantic ``SecretStr``."""
    if value is None:
        return None
    getter = getattr(value, "get_secret_value", None)
    text = getter() if callable(getter) else value
    return str(text) if text else None


@dataclass(frozen=True)
class ModelSettings:
    """The settings model routing reads (a subset of ``bot.config.Settings``)."""

    openai_api_key: str | None = None
    """``OPENAI_API_KEY``."""
    openai_base_url: str | None = None
    """``OPENAI_BASE_URL``; ``None`` is OpenAI itself."""
    gemini_api_key: str | None = None
    """``GEMINI_API_KEY``."""
    ollama_base_url: str | None = None
    """``OLLAMA_BASE_URL``; ``None`` is ``DEFAULT_OLLAMA_BASE_URL``."""
    default_model: str | None = None
    """``DEFAULT_MODEL``: the model of agents that name none."""
    model_timeout_seconds: float = 60.0
    """Total time one model call may take, retries included."""

    def __repr__(self) -> str:  # keys never reach a log line
        return (
            f"ModelSettings(default_model={self.default_model!r}, "
            f"openai_base_url={self.openai_base_url!r}, "
            f"ollama_base_url={self.ollama_base_url!r}, "
            f"openai_api_key={'set' if self.openai_api_key else None}, "
            f"gemini_api_key={'set' if self.gemini_api_key else None})"
        )

    @classmethod
    def from_settings(cls, settings: object) -> ModelSettings:
        """Read the fields from any settings-like object (``SecretStr`` values unwrapped)."""
        if isinstance(settings, ModelSettings):
            return settings
        timeout = getattr(settings, "model_timeout_seconds", None)
        return cls(
            openai_api_key=_secret(getattr(settings, "openai_api_key", None)),
            openai_base_url=getattr(settings, "openai_base_url", None) or None,
            gemini_api_key=_secret(getattr(settings, "gemini_api_key", None)),
            ollama_base_url=getattr(settings, "ollama_base_url", None) or None,
            default_model=getattr(settings, "default_model", None) or None,
            model_timeout_seconds=float(timeout) if timeout else 60.0,
        )


def default_model_name(settings: ModelSettings) -> str:
    """``DEFAULT_MODEL``, else a model for whichever key is set, else ``"offline"``."""
    if settings.default_model:
        return settings.default_model
    if settings.openai_api_key:
        return "gpt-4o-mini"
    if settings.gemini_api_key:
        return "gemini-2.5-flash"
    return _OFFLINE


@dataclass(frozen=True)
class Route:
    """Where a model name goes."""

    provider: str
    """``"offline"``, ``"openai"``, ``"gemini"`` or ``"ollama"``."""
    model_name: str
    """Name sent to the provider (prefix such as ``ollama/`` removed)."""
    base_url: str | None = None
    """Endpoint; ``None`` is the SDK default (OpenAI)."""
    api_key: str | None = None
    """Key for that endpoint."""

    def __repr__(self) -> str:
        return f"Route({self.provider!r}, {self.model_name!r}, base_url={self.base_url!r})"


def route_model(name: str, settings: ModelSettings) -> Route:
    """Decide where ``name`` goes; ``ConfigurationError`` naming the setting if nowhere."""
    name = name.strip()
    lowered = name.lower()
    if not name:
        raise ConfigurationError("empty model name", setting="DEFAULT_MODEL")
    if lowered == _OFFLINE:
        return Route(_OFFLINE, _OFFLINE)
    if lowered.startswith("ollama/"):
        model = name.split("/", 1)[1]
        if not model:
            raise ConfigurationError(
                f"model {name!r}: write ollama/<model>, e.g. ollama/llama3.2",
                setting="DEFAULT_MODEL",
            )
        base = settings.ollama_base_url or DEFAULT_OLLAMA_BASE_URL
        return Route("ollama", model, base, "ollama")
    if lowered.startswith("gemini-") or lowered.startswith("gemini/"):
        model = name.split("/", 1)[1] if lowered.startswith("gemini/") else name
        if not settings.gemini_api_key:
            raise ConfigurationError(
                f"model {name!r} needs GEMINI_API_KEY", setting="GEMINI_API_KEY"
            )
        return Route("gemini", model, GEMINI_BASE_URL, settings.gemini_api_key)
    if lowered.startswith("openai/") or lowered.startswith(_OPENAI_PREFIXES):
        model = name.split("/", 1)[1] if lowered.startswith("openai/") else name
        if not model:
            raise ConfigurationError(
                f"model {name!r}: write openai/<model>", setting="DEFAULT_MODEL"
            )
        if not settings.openai_api_key:
            raise ConfigurationError(
                f"model {name!r} needs OPENAI_API_KEY", setting="OPENAI_API_KEY"
            )
        return Route("openai", model, settings.openai_base_url, settings.openai_api_key)
    raise ConfigurationError(
        f"model {name!r} matches no provider: use 'offline', 'gpt-*', 'openai/<model>', "
        "'gemini-*' or 'ollama/<model>'",
        setting="DEFAULT_MODEL",
    )


class ModelRouter:
    """Resolves model names to clients, one client per (base URL, key)."""

    def __init__(self, settings: ModelSettings | None = None, **client_options: Any) -> None:
        """``client_options`` go to every ``OpenAICompatibleModel`` (e.g. ``max_retries``)."""
        self.settings = settings or ModelSettings()
        self._client_options = client_options
        self._clients: dict[tuple[str | None, str | None], OpenAICompatibleModel] = {}
        self._offline = OfflineModel()

    def resolve(self, name: str) -> tuple[ChatModel, str]:
        """The client and the provider-side model name for ``name``."""
        route = route_model(name, self.settings)
        if route.provider == _OFFLINE:
            return self._offline, route.model_name
        key = (route.base_url, route.api_key)
        client = self._clients.get(key)
        if client is None:
            options: dict[str, Any] = {"total_timeout": self.settings.model_timeout_seconds}
            if route.provider == "gemini":
                options["schema_transform"] = gemini_compatible_schema
            options.update(self._client_options)
            client = OpenAICompatibleModel(route.api_key or "", route.base_url, **options)
            self._clients[key] = client
        return client, route.model_name

    async def aclose(self) -> None:
        """Close every client this router made."""
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.aclose()


def resolve_model(name: str, settings: object | None = None) -> tuple[ChatModel, str]:
    """Resolve one model name with a fresh client (a ``ModelRouter`` shares clients)."""
    model_settings = ModelSettings.from_settings(settings) if settings is not None else None
    return ModelRouter(model_settings).resolve(name)
