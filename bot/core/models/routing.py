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

The openai SDK takes most of a second to import, so ``OpenAICompatibleModel``
is imported only when a router builds its first client: ``import bot`` and an
offline or scripted run never pay for it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from bot.core._schema import gemini_compatible_schema
from bot.core.models.base import ChatModel
from bot.core.models.offline import OfflineModel
from bot.errors import ConfigurationError

if TYPE_CHECKING:
    from bot.core.models.openai_compat import OpenAICompatibleModel

__all__ = [
    "DEFAULT_OLLAMA_BASE_URL",
    "GEMINI_BASE_URL",
    "ModelRouter",
    "ModelSettings",
    "ModelSettingsSource",
    "Route",
    "default_model_name",
    "route_model",
]

logger = logging.getLogger(__name__)

GEMINI_BASE_URL = "https://generativelanguage.googleapis.com/v1beta/openai/"
"""Gemini's OpenAI-compatible endpoint."""
DEFAULT_OLLAMA_BASE_URL = "http://localhost:11434/v1"
"""Where Ollama serves its OpenAI-compatible API by default."""

_OPENAI_PREFIXES = ("gpt-", "o1", "o3", "o4", "chatgpt-")
_OFFLINE = "offline"
_DEFAULT_TIMEOUT = 60.0
_DEFAULT_MEDIA_DIR = "data/media"


@runtime_checkable
class ModelSettingsSource(Protocol):
    """Any settings object with the model fields; ``bot.config.Settings`` is one.

    A Protocol rather than an import: the core must not depend on the
    application's settings module (nor pull pydantic-settings into ``import bot``).
    """

    @property
    def openai_api_key(self) -> object:
        """``OPENAI_API_KEY`` (``str``, ``SecretStr`` or ``None``)."""
        ...

    @property
    def openai_base_url(self) -> str | None:
        """``OPENAI_BASE_URL``."""
        ...

    @property
    def gemini_api_key(self) -> object:
        """``GEMINI_API_KEY`` (``str``, ``SecretStr`` or ``None``)."""
        ...

    @property
    def ollama_base_url(self) -> str | None:
        """``OLLAMA_BASE_URL``."""
        ...

    @property
    def default_model(self) -> str | None:
        """``DEFAULT_MODEL``."""
        ...

    @property
    def model_timeout_seconds(self) -> float:
        """``MODEL_TIMEOUT_SECONDS``."""
        ...


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
    media_dir: str | None = field(default=None, compare=False)
    """Where the media store keeps images (``DATA_DIR/media``); ``None`` is ``data/media``."""
    max_media_bytes: int = field(default=0, compare=False)
    """``MAX_MEDIA_BYTES``: the largest file a tool may attach; 0 is the store's default."""
    attachments_dir: str | None = field(default=None, compare=False)
    """``ATTACHMENTS_DIR``, the only folder ``Attachment(path=...)`` reads; ``None`` is
    ``DATA_DIR/outbox`` (next to ``media_dir``)."""

    def __repr__(self) -> str:  # keys never reach a log line
        return (
            f"ModelSettings(default_model={self.default_model!r}, "
            f"openai_base_url={self.openai_base_url!r}, "
            f"ollama_base_url={self.ollama_base_url!r}, "
            f"openai_api_key={'set' if self.openai_api_key else None}, "
            f"gemini_api_key={'set' if self.gemini_api_key else None})"
        )

    @classmethod
    def from_settings(cls, settings: ModelSettingsSource) -> ModelSettings:
        """Read the fields from a settings object (``SecretStr`` values unwrapped).

        ``TypeError`` for anything that is not a ``ModelSettingsSource`` (a dict is
        one such mistake: it would otherwise be read as "nothing set").
        """
        if isinstance(settings, ModelSettings):
            return settings
        if not isinstance(settings, ModelSettingsSource):
            raise TypeError(
                "model settings must be a ModelSettings or a settings object such as "
                f"bot.config.Settings, not {type(settings).__name__}"
            )
        timeout = settings.model_timeout_seconds
        return cls(
            openai_api_key=_secret(settings.openai_api_key),
            openai_base_url=settings.openai_base_url or None,
            gemini_api_key=_secret(settings.gemini_api_key),
            ollama_base_url=settings.ollama_base_url or None,
            default_model=settings.default_model or None,
            model_timeout_seconds=float(timeout) if timeout else _DEFAULT_TIMEOUT,
            media_dir=_media_dir(getattr(settings, "data_dir", None)),
            max_media_bytes=int(getattr(settings, "max_media_bytes", 0) or 0),
            attachments_dir=_optional_path(getattr(settings, "attachments_dir", None)),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ModelSettings:
        """Read ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``GEMINI_API_KEY``,
        ``OLLAMA_BASE_URL``, ``DEFAULT_MODEL`` and ``MODEL_TIMEOUT_SECONDS``.

        ``environ`` defaults to ``os.environ``; empty values count as unset. Only
        the environment is read, not ``.env`` (the bot's ``Settings`` reads that).
        A timeout that is not a positive number is a ``ConfigurationError``.
        """
        env = os.environ if environ is None else environ

        def get(name: str) -> str | None:
            value = env.get(name, "").strip()
            return value or None

        timeout = _DEFAULT_TIMEOUT
        raw_timeout = get("MODEL_TIMEOUT_SECONDS")
        if raw_timeout is not None:
            try:
                timeout = float(raw_timeout)
            except ValueError:
                timeout = math.nan
            if not timeout > 0 or math.isinf(timeout):
                raise ConfigurationError(
                    f"MODEL_TIMEOUT_SECONDS: {raw_timeout!r} is not a positive number of seconds",
                    setting="MODEL_TIMEOUT_SECONDS",
                )
        return cls(
            openai_api_key=get("OPENAI_API_KEY"),
            openai_base_url=get("OPENAI_BASE_URL"),
            gemini_api_key=get("GEMINI_API_KEY"),
            ollama_base_url=get("OLLAMA_BASE_URL"),
            default_model=get("DEFAULT_MODEL"),
            model_timeout_seconds=timeout,
            media_dir=_media_dir(get("DATA_DIR")),
            max_media_bytes=_positive_int(get("MAX_MEDIA_BYTES"), "MAX_MEDIA_BYTES"),
            attachments_dir=get("ATTACHMENTS_DIR"),
        )


def _positive_int(raw: str | None, name: str) -> int:
    """``raw`` as a positive integer (0 when unset); anything else names ``name``."""
    if raw is None:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigurationError(f"{name}: {raw!r} is not a positive whole number", setting=name)
    return value


def _media_dir(data_dir: object) -> str | None:
    return None if data_dir is None else str(Path(str(data_dir)) / "media")


def _optional_path(value: object) -> str | None:
    return None if value is None else str(value)


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
            # Deferred: the SDK import is the slowest part of start-up (module docstring).
            from bot.core.media_store import MediaStore
            from bot.core.models.openai_compat import OpenAICompatibleModel

            media = MediaStore(Path(self.settings.media_dir or _DEFAULT_MEDIA_DIR))
            options: dict[str, Any] = {
                "total_timeout": self.settings.model_timeout_seconds,
                "media_store": media,
            }
            if route.provider == "gemini":
                options["schema_transform"] = gemini_compatible_schema
            options.update(self._client_options)
            client = OpenAICompatibleModel(route.api_key or "", route.base_url, **options)
            client.provider_name = route.provider  # gen_ai.provider.name on its spans
            self._clients[key] = client
        return client, route.model_name

    async def aclose(self) -> None:
        """Close every client this router made."""
        clients = list(self._clients.values())
        self._clients.clear()
        for client in clients:
            await client.aclose()
