"""Settings: read from the environment and ``.env``, validated once at start-up.

A wrong value stops start-up with one line that names the setting
(``load_settings`` turns pydantic's report into a ``ConfigurationError``).
Secrets are ``SecretStr``: they print as ``**********``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bot.core.compaction import DEFAULT_KEEP_RECENT_TURNS, Compaction
from bot.core.prices import load_prices
from bot.core.session import default_prune_to
from bot.core.sql import redact_dsn
from bot.errors import ConfigurationError
from bot.setting_typos import setting_typos, typo_hints

__all__ = ["Settings", "load_settings"]

logger = logging.getLogger(__name__)

CONSOLE_TOKEN_MIN_LENGTH = 24
"""Shortest ``CONSOLE_TOKEN`` accepted: the console is reachable over HTTP."""

DEFAULT_FORWARDED_ALLOW_IPS = "127.0.0.1,::1"
"""Proxies trusted by default (uvicorn's own default): this host only."""

_TELEGRAM_TOKEN = re.compile(r"[0-9]{1,20}:[A-Za-z0-9_-]{1,200}")
"""``<bot id>:<secret>``, as @BotFather issues it (the secret is 35 characters today)."""

CommaList = Annotated[frozenset[str], NoDecode]
"""A comma-separated environment value (``"1,2, 3"``) read as a set of strings."""


class Settings(BaseSettings):
    """Everything an operator can set. Names are the environment variable names."""

    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        case_sensitive=False,
        frozen=True,
        # `TELEGRAM_BOT_TOKEN=` (as .env.example leaves it) means "not set", not "".
        env_ignore_empty=True,
        # The docstrings below become the fields' descriptions: the README's table of
        # settings is generated from them (scripts/settings_table.py).
        use_attribute_docstrings=True,
    )

    data_dir: Path = Path("./data")
    """Runtime files: the SQLite database and the installation secret."""
    database_url: str | None = None
    """``sqlite:///path/to.db`` or ``postgresql://user:password@host:5432/db`` (several
    processes); defaults to ``sqlite:///<DATA_DIR>/chatflow.db``."""
    instance_lease_seconds: float = Field(default=15.0, ge=1, le=3600)
    """PostgreSQL: how long a process counts as alive without renewing its lease; the work
    of a process that died is taken over this long after (renewed every third of it)."""
    database_connect_timeout_seconds: float = Field(default=5.0, gt=0, le=300)
    """PostgreSQL: seconds one host may take to accept a connection; the next host of a
    multi-host ``DATABASE_URL`` is tried after it."""
    database_statement_timeout_seconds: float = Field(default=30.0, gt=0)
    """PostgreSQL: seconds one statement may run before it is cancelled (never a COMMIT)."""
    database_acquire_timeout_seconds: float = Field(default=10.0, gt=0)
    """PostgreSQL: seconds to wait for a free pooled connection."""
    database_tcp_user_timeout_seconds: float = Field(default=15.0, gt=0, le=3600)
    """PostgreSQL: seconds a silent server (or network) may keep data unacknowledged
    before the connection is dropped; keepalive probes find an idle one as fast."""
    database_idle_in_transaction_timeout_seconds: float = Field(default=30.0, gt=0)
    """PostgreSQL: seconds the server lets a transaction sit idle (a frozen process's)
    before it ends that connection and frees its locks."""

    default_model: str | None = None
    """Model for agents that name none; ``offline`` when no API key is set."""
    openai_api_key: SecretStr | None = None
    """Key for OpenAI or any OpenAI-compatible server."""
    openai_base_url: str | None = None
    """Base URL of an OpenAI-compatible server (vLLM, llama.cpp, a proxy)."""
    gemini_api_key: SecretStr | None = None
    """Key for Gemini's OpenAI-compatible endpoint."""
    ollama_base_url: str = "http://localhost:11434/v1"
    """Ollama's OpenAI-compatible endpoint, for ``ollama/<name>`` models."""
    model_timeout_seconds: float = Field(default=60.0, gt=0)
    """Total time one model call may take, retries included."""
    transcription_model: str = "whisper-1"
    """Speech-to-text model at ``OPENAI_BASE_URL`` (``/audio/transcriptions``) for voice
    notes; needs ``OPENAI_API_KEY``, else voice notes are answered without a transcript."""
    max_media_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    """Largest photo, voice note or file downloaded (bytes); larger ones are refused."""
    document_timeout_seconds: float = Field(default=20.0, gt=0, le=120)
    """Longest reading one PDF may take (a child process, killed then); the user is told
    the file could not be read and the turn goes on without it."""
    attachments_dir: Path | None = None
    """The only folder a tool's ``Attachment(path=...)`` may read (symlinks resolved);
    unset: ``DATA_DIR/outbox``. Never ``DATA_DIR`` itself (the database, the secret)."""
    max_knowledge_file_bytes: int = Field(default=20 * 1024 * 1024, gt=0)
    """Largest file ``knowledge add`` takes (bytes); a larger one is named, skipped, and the
    command exits 1 once the rest is added."""
    embedding_model: str | None = Field(default=None, min_length=1)
    """Embedding model for the knowledge base's hybrid search (``/embeddings`` at
    ``EMBEDDING_BASE_URL``); unset: full-text search only, no model and no network."""
    embedding_base_url: str | None = None
    """OpenAI-compatible server for ``EMBEDDING_MODEL`` (Ollama, vLLM, OpenAI); unset:
    ``OPENAI_BASE_URL``, else OpenAI. The key is ``OPENAI_API_KEY``."""
    voice_replies: Literal["off", "auto", "always"] = "off"
    """Spoken replies: ``off``; ``auto`` answers a voice note with a voice note (text
    otherwise); ``always`` also speaks every reply in a private chat. Speech comes from
    ``/audio/speech`` at ``OPENAI_BASE_URL`` (billed by that provider); an agent's
    ``voice=Voice(...)`` overrides it."""
    tts_model: str = Field(default="gpt-4o-mini-tts", min_length=1)
    """Text-to-speech model at ``OPENAI_BASE_URL`` for voice replies."""
    tts_voice: str = Field(default="alloy", min_length=1)
    """Voice of the spoken replies, as the provider names them (``alloy``, ``nova``)."""
    voice_with_text: bool = True
    """Send a voice reply's text too (as the voice note's caption on Telegram when it
    fits, else as a message after it); ``false``: the voice note alone (the text is
    still kept in the history)."""

    telegram_bot_token: SecretStr | None = None
    """Token from @BotFather; enables Telegram."""
    telegram_api_base_url: str = "https://api.telegram.org/bot"
    """Bot API server (PTB ``base_url``); the token is appended."""
    telegram_webhook_url: str | None = None
    """Public HTTPS URL of ``/webhooks/telegram``; unset means long polling."""
    telegram_webhook_secret: SecretStr | None = None
    """Secret Telegram echoes in ``X-Telegram-Bot-Api-Secret-Token``."""
    telegram_allow_channels: bool = False
    """Answer channel posts too."""
    telegram_file_base_url: str | None = None
    """Where the Bot API serves files (PTB ``base_file_url``); unset: derived from
    ``TELEGRAM_API_BASE_URL`` (``.../bot`` -> ``.../file/bot``)."""

    whatsapp_phone_id: str | None = None
    """Phone number id of the WhatsApp Cloud number; enables WhatsApp."""
    whatsapp_token: SecretStr | None = None
    """Permanent (system user) access token."""
    whatsapp_verify_token: SecretStr | None = None
    """Token Meta sends in the webhook verification handshake."""
    whatsapp_app_secret: SecretStr | None = None
    """App secret used to check ``X-Hub-Signature-256``."""
    whatsapp_api_base_url: str = "https://graph.facebook.com"
    """Graph API server; the client adds ``/v<version>/<phone_id>/messages``."""
    whatsapp_insecure_dev: bool = False
    """Accept unsigned webhooks (local development only)."""
    whatsapp_messages_per_second: int = Field(default=80, gt=0)
    """The number's throughput (Meta: 80 by default, up to 1,000 on higher tiers);
    replies and typing are paced to it."""
    whatsapp_media_hosts: CommaList = frozenset()
    """More places the token may fetch user media from, beyond Meta's media hosts over
    https and ``WHATSAPP_API_BASE_URL``'s own origin: ``cdn.example.com`` or
    ``*.example.com`` (https), or an origin such as ``http://127.0.0.1:8081``."""
    whatsapp_template_name: str | None = None
    """Approved template sent instead of free-form text once a person's 24-hour window
    is closed, the text as its body parameter ``{{1}}``; unset: such replies are
    abandoned."""
    whatsapp_template_language: str = Field(
        default="en_US", pattern=r"^[a-z]{2,3}(_[A-Za-z]{2,4})?$"
    )
    """Language code of ``WHATSAPP_TEMPLATE_NAME`` as approved by Meta (``en_US``, ``pt_BR``)."""

    http_host: str = "127.0.0.1"
    """Address of the webhook, health and metrics server."""
    http_port: int = Field(default=8080, ge=0, le=65535)
    """Port of that server (0 picks a free one)."""
    console_token: SecretStr | None = None
    """Enables the operator console at ``/console`` on that server (sign in with it, or
    send ``Authorization: Bearer <token>``); at least 24 characters. Unset: no console."""
    forwarded_allow_ips: str = DEFAULT_FORWARDED_ALLOW_IPS
    """Comma-separated addresses or networks (``10.0.0.0/8``) of reverse proxies whose
    ``X-Forwarded-For``/``X-Forwarded-Proto`` are believed (the client's address and
    ``https``), as uvicorn's variable of that name; ``*`` trusts any peer."""

    group_sessions_per_user: bool = True
    """In groups (outside topics), one conversation per member instead of one per group."""
    group_answer_all_chats: CommaList = frozenset()
    """Raw chat ids of groups where the bot answers every message, not only mentions."""
    allowed_users: CommaList = frozenset()
    """If set, only these raw sender ids are answered."""
    allowed_chats: CommaList = frozenset()
    """If set, only these raw chat ids are answered."""
    access_mode: Literal["open", "allowlist", "pairing"] = "open"
    """Who is served: everyone, the allow lists, or the lists plus senders the operator
    approved by pairing code. Unset with an allow list set: ``allowlist``."""
    pairing_code_ttl_seconds: int = Field(default=86400, ge=60)
    """How long a pairing code stays valid."""
    rate_limit_messages: int | None = Field(default=None, gt=0)
    """Messages one sender may send per window; more start no turn. Unset: no limit."""
    rate_limit_window_seconds: float = Field(default=60.0, gt=0)
    """Length of a sender's rate-limit window, from its first message."""
    # -- token accounting and budgets (bot.core.usage, bot.gateway.accounting) --
    max_tokens_per_sender_per_day: int | None = Field(default=None, gt=0)
    """Prompt plus completion tokens one sender may cost per UTC day; past it the sender
    is told once and no model is called for them until the day ends. Unset: no budget."""
    model_prices: Path | None = None
    """JSON (or ``.toml``) file of USD per million tokens per model, for the money column of
    ``python -m bot usage`` and the console; unset: tokens only (prices are never guessed).
    Shape: ``{"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}``."""

    auto_continue_freshness_seconds: int = Field(default=3600, ge=0)
    """At start-up, re-run unanswered messages younger than this; expire older ones."""
    max_turns: int = Field(default=40, gt=0)
    """Turns of history kept per conversation."""
    prune_to_turns: int | None = Field(default=None, gt=0)
    """Past ``MAX_TURNS``, a conversation drops back to this many turns at once, so the
    model provider's prompt cache keeps matching in between. Unset: 30 with the default
    ``MAX_TURNS`` (3/4 of it); a ``MAX_TURNS`` set alone is kept exactly (one turn at a time)."""
    # -- compaction (bot.core.compaction): the default of agents without compaction= --
    compaction_trigger_tokens: int | None = Field(default=None, gt=0)
    """Summarise a conversation's older turns once its request to the model is estimated
    past this many tokens (kept: the summary and the recent turns). Unset: no automatic
    compaction (pruning only; ``/compact`` still works)."""
    compaction_keep_recent_turns: int = Field(default=DEFAULT_KEEP_RECENT_TURNS, gt=0)
    """Turns kept whole after the summary; less than ``MAX_TURNS``."""
    compaction_model: str | None = Field(default=None, min_length=1)
    """Model that writes the summaries (a cheaper one, say), routed like ``DEFAULT_MODEL``;
    unset: each agent's own model."""
    max_concurrent_turns: int = Field(default=256, gt=0)
    """Turns that may run at once across sessions (most of a turn waits on the model;
    sending the reply no longer counts)."""
    database_connections: int = Field(default=32, gt=0)
    """PostgreSQL: the connections one process opens (at least 2). A turn borrows one
    only for its short transactions, never while the model thinks."""
    database_pooler: Literal["none", "transaction"] = "none"
    """PostgreSQL: ``transaction`` when ``DATABASE_URL`` points at PgBouncer (or another
    pooler) in transaction mode: no prepared-statement cache, no startup settings but
    ``application_name``. ``doctor`` says whether the server looks like a pooler."""
    max_queued_messages: int = Field(default=1000, gt=0)
    """Accepted messages waiting for a worker before the bot answers "busy"."""
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    """How long a shutdown waits for turns in flight."""
    max_scheduled_per_chat: int = Field(default=20, gt=0)
    """Messages agents may have scheduled in one chat at once, all its members together
    (``schedule_message``)."""
    min_repeat_seconds: float = Field(default=300.0, ge=60)
    """The least time between two runs of a repeating scheduled message; a schedule that
    repeats more often is refused."""
    schedule_timezone: str = "UTC"
    """IANA time zone (``Europe/Berlin``) of repeating schedules when the model names
    none; repeats keep their local time across daylight-saving changes."""
    max_memories_per_person: int = Field(default=200, gt=0)
    """Facts one person may have the bot remember (``remember``), both kinds together."""
    max_memory_chars: int = Field(default=500, gt=0)
    """Longest fact ``remember`` keeps, in characters; a longer one is refused."""
    memory_prompt_chars: int = Field(default=2000, ge=0)
    """Characters of remembered facts shown to the model after its instructions each turn
    (agents with the memory tools, or ``Agent(memory=True)``); 0: none."""
    schedule_max_lateness_seconds: float = Field(default=86_400.0, gt=0)
    """A scheduled message found later than this (the bot was down) is dropped, not sent."""
    button_ttl_seconds: float = Field(default=86_400.0, gt=0)
    """A tap on a keyboard older than this gets "This choice has expired." and starts no
    turn (buttons a tool returned with ``ToolOutput(buttons=...)``)."""
    approval_ttl_seconds: float = Field(default=3600.0, gt=0)
    """A tool call waiting for approval (``@tool(needs_approval=True)``) and not answered
    within this many seconds expires: the model hears "no answer in time"."""
    stream_replies: bool = True
    """Show answers while they are written: drafts in Telegram private chats, tokens
    in the console (groups and WhatsApp show typing). The final reply is sent once,
    through the ledger, either way."""

    agents_module: str | None = None
    """Importable module exposing ``starting_agent``; unset: the project's ``agents/``
    folder (the working directory's), else the example agents."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Root log level."""
    log_format: Literal["auto", "text", "json"] = "auto"
    """``auto``: text on a terminal, JSON lines otherwise."""

    @field_validator(
        "group_answer_all_chats",
        "allowed_users",
        "allowed_chats",
        "whatsapp_media_hosts",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str):
            return frozenset(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("model_prices")
    @classmethod
    def _check_model_prices(cls, value: Path | None) -> Path | None:
        if value is not None:
            load_prices(value)  # a malformed file stops start-up here, in one line
        return value

    @field_validator("access_mode", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("telegram_bot_token")
    @classmethod
    def _check_telegram_token(cls, value: SecretStr | None) -> SecretStr | None:
        # Checked here, not by Telegram: a Bot API that cannot be reached would
        # otherwise retry a malformed token for ever.
        if value is not None and not _TELEGRAM_TOKEN.fullmatch(value.get_secret_value()):
            raise ValueError(
                "not a bot token: it looks like 123456789:AAH... (digits, a colon, then "
                "letters, digits, - and _), as @BotFather gives it"
            )
        return value

    @field_validator("console_token")
    @classmethod
    def _check_console_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < CONSOLE_TOKEN_MIN_LENGTH:
            raise ValueError(
                f"must be at least {CONSOLE_TOKEN_MIN_LENGTH} characters "
                "(python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _check_forwarded_allow_ips(cls, value: str) -> str:
        entries = [part.strip() for part in value.split(",") if part.strip()]
        if not entries:
            raise ValueError("name at least one proxy address (127.0.0.1 trusts this host only)")
        if "*" in entries:
            return "*"  # uvicorn trusts everyone only for a lone "*"
        for entry in entries:
            try:
                # uvicorn would take a typo for a literal host name that never matches.
                ipaddress.ip_network(entry)
            except ValueError as exc:
                raise ValueError(f"{exc} (write 10.0.0.5, 10.0.0.0/8 or *)") from None
        return ",".join(entries)

    @field_validator("schedule_timezone")
    @classmethod
    def _check_schedule_timezone(cls, value: str) -> str:
        from bot.core.scheduling import load_timezone

        load_timezone(value)  # an unknown zone stops start-up here, in one line
        return value.strip()

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(
            ("sqlite:///", "postgresql://", "postgres://")
        ):
            raise ValueError(
                "use sqlite:///<path> or postgresql://<user>:<password>@<host>:<port>/<database>"
            )
        return value

    def _check_whatsapp_set(self) -> None:
        """WhatsApp needs four values: any one set means the operator wants it, so every
        missing one is named at once (not one per restart, and never silently off)."""
        given = {
            "WHATSAPP_PHONE_ID": bool(self.whatsapp_phone_id),
            "WHATSAPP_TOKEN": self.whatsapp_token is not None,
            "WHATSAPP_VERIFY_TOKEN": self.whatsapp_verify_token is not None,
            "WHATSAPP_APP_SECRET": self.whatsapp_app_secret is not None,
        }
        if not any(given.values()):
            return
        missing = [name for name, present in given.items() if not present]
        if self.whatsapp_insecure_dev and "WHATSAPP_APP_SECRET" in missing:
            missing.remove("WHATSAPP_APP_SECRET")  # local development: signatures unchecked
        if missing:
            raise ValueError(
                f"WhatsApp is half set up: {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} missing (WhatsApp needs "
                "WHATSAPP_PHONE_ID, WHATSAPP_TOKEN, WHATSAPP_VERIFY_TOKEN and "
                "WHATSAPP_APP_SECRET; see .env.example)"
            )

    @model_validator(mode="after")
    def _check_pairs(self) -> Settings:
        self._check_whatsapp_set()
        if self.telegram_webhook_url and not self.telegram_webhook_secret:
            raise ValueError("TELEGRAM_WEBHOOK_SECRET is required when TELEGRAM_WEBHOOK_URL is set")
        listed = bool(self.allowed_users or self.allowed_chats)
        if "access_mode" in self.model_fields_set:
            if self.access_mode == "open" and listed:
                raise ValueError(
                    "ACCESS_MODE=open would ignore ALLOWED_USERS/ALLOWED_CHATS: "
                    "use allowlist or pairing, or unset the lists"
                )
            if self.access_mode == "allowlist" and not listed:
                raise ValueError("ACCESS_MODE=allowlist needs ALLOWED_USERS or ALLOWED_CHATS")
        return self

    @model_validator(mode="after")
    def _check_compaction(self) -> Settings:
        chosen = "compaction_keep_recent_turns" in self.model_fields_set
        if (chosen or self.compaction_trigger_tokens is not None) and (
            self.compaction_keep_recent_turns >= self.max_turns
        ):
            raise ValueError("COMPACTION_KEEP_RECENT_TURNS must be less than MAX_TURNS")
        return self

    @property
    def compaction(self) -> Compaction | None:
        """The ``Compaction`` of agents that set none; ``None`` without a trigger."""
        if self.compaction_trigger_tokens is None:
            return None
        return Compaction(
            trigger_tokens=self.compaction_trigger_tokens,
            keep_recent_turns=self.compaction_keep_recent_turns,
            model=self.compaction_model,
        )

    @model_validator(mode="after")
    def _check_prune_to_turns(self) -> Settings:
        if self.prune_to_turns is not None and self.prune_to_turns > self.max_turns:
            raise ValueError("PRUNE_TO_TURNS must not exceed MAX_TURNS")
        return self

    @model_validator(mode="after")
    def _check_attachments_dir(self) -> Settings:
        if self.attachments_dir is None:
            return self
        folder = self.attachments_dir.resolve()
        if self.data_dir.resolve().is_relative_to(folder):
            raise ValueError(
                "ATTACHMENTS_DIR must not be DATA_DIR or a folder holding it: tools could "
                "send the database and the installation secret (use DATA_DIR/outbox)"
            )
        if self.database_dialect == "sqlite" and self.database_path.resolve().is_relative_to(
            folder
        ):
            raise ValueError("ATTACHMENTS_DIR must not hold the SQLite database")
        return self

    @property
    def effective_prune_to_turns(self) -> int:
        """``PRUNE_TO_TURNS``; unset, 3/4 of the default window, or a ``MAX_TURNS`` set alone."""
        if self.prune_to_turns is not None:
            return self.prune_to_turns
        if "max_turns" in self.model_fields_set:
            # An operator who sized the window chose exactly that window.
            return self.max_turns
        return default_prune_to(self.max_turns)

    @property
    def outbox_dir(self) -> Path:
        """The folder tools attach files from: ``ATTACHMENTS_DIR`` or ``DATA_DIR/outbox``."""
        return (
            self.attachments_dir if self.attachments_dir is not None else self.data_dir / "outbox"
        )

    @property
    def effective_access_mode(self) -> Literal["open", "allowlist", "pairing"]:
        """``ACCESS_MODE``, or ``allowlist`` when it is unset and an allow list is set."""
        if "access_mode" not in self.model_fields_set and (
            self.allowed_users or self.allowed_chats
        ):
            return "allowlist"
        return self.access_mode

    @property
    def database_dialect(self) -> Literal["sqlite", "postgres"]:
        """Which database ``DATABASE_URL`` names."""
        if self.database_url and not self.database_url.startswith("sqlite:///"):
            return "postgres"
        return "sqlite"

    @property
    def database_path(self) -> Path:
        """Filesystem path of the SQLite database (``ValueError`` on PostgreSQL)."""
        if self.database_dialect != "sqlite":
            raise ValueError("DATABASE_URL names a PostgreSQL database, not a file")
        if self.database_url:
            return Path(self.database_url.removeprefix("sqlite:///"))
        return self.data_dir / "chatflow.db"

    @property
    def database_label(self) -> str:
        """The database for banners and logs: the file path, or the URL without its password."""
        if self.database_dialect == "sqlite":
            return str(self.database_path)
        assert self.database_url is not None
        return redact_dsn(self.database_url)

    @property
    def telegram_enabled(self) -> bool:
        """Whether a Telegram token is configured."""
        return self.telegram_bot_token is not None

    @property
    def whatsapp_enabled(self) -> bool:
        """Whether WhatsApp Cloud credentials are configured."""
        return bool(self.whatsapp_phone_id)


def _describe(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = [str(part) for part in err.get("loc", ()) if part != "__root__"]
    message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if loc:
        return f"{loc[0].upper()}: {message}"
    return message


def load_settings(**overrides: Any) -> Settings:
    """Read settings; raise ``ConfigurationError`` naming the first wrong one."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err.get("loc", ())
        setting = str(loc[0]).upper() if loc else None
        # A misspelt name is often why a setting is missing: name it in the same line.
        message = typo_hints(_describe(exc), setting_typos(Settings.model_fields))
        raise ConfigurationError(message, setting=setting) from exc
