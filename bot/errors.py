"""The Chatflow error family.

Every error the bot raises on purpose is a ``ChatflowError``. The subclasses
say whose fault it is: the operator's configuration, the model provider, a
messaging platform, or storage. Library errors are translated where they
enter the code (``raise ... from exc``) so callers only handle this family.
"""

from __future__ import annotations

__all__ = [
    "AgentNotFoundError",
    "ApprovalError",
    "ChatflowError",
    "CommitOutcomeUnknownError",
    "ConfigurationError",
    "DatabaseUnavailableError",
    "EmptyAnswerError",
    "MCPServerError",
    "MaxToolRoundsError",
    "MediaError",
    "ModelError",
    "PlatformError",
    "SchemaVersionError",
    "SessionLeaseLostError",
    "StorageError",
    "TapRefusedError",
    "TurnError",
]


class ChatflowError(Exception):
    """Base class of every error Chatflow raises on purpose."""

    retryable: bool = False
    """True when trying the same operation again later may succeed."""

    retry_after: float | None = None
    """Seconds the remote side asked us to wait before retrying, if it said."""

    ambiguous: bool = False
    """True when the operation may have taken effect although it failed
    (a send whose response timed out may still have reached the user)."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool | None = None,
        retry_after: float | None = None,
        ambiguous: bool | None = None,
    ) -> None:
        super().__init__(message)
        if retryable is not None:
            self.retryable = retryable
        if retry_after is not None:
            self.retry_after = retry_after
        if ambiguous is not None:
            self.ambiguous = ambiguous


class ConfigurationError(ChatflowError):
    """A setting or an agent definition is wrong: the operator must fix it."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        """Name of the offending setting, when one is to blame."""


class AgentNotFoundError(ConfigurationError):
    """A handoff or a saved session names an agent that does not exist."""


class ModelError(ChatflowError):
    """The model provider failed: network, HTTP status, or a malformed answer."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, retry_after=retry_after)
        self.status_code = status_code
        """HTTP status returned by the provider, if there was one."""


class EmptyAnswerError(ModelError):
    """The model's final answer was blank (no text, no tool calls).

    No platform can send an empty message, so the turn rolls back rather than
    commit a reply nobody would see; the gateway apologises instead.
    """


class TurnError(ChatflowError):
    """A turn could not complete for a reason of the agent loop itself."""


class MaxToolRoundsError(TurnError):
    """The model kept calling tools past ``max_tool_rounds``."""


class PlatformError(ChatflowError):
    """A messaging platform refused or failed a request."""

    def __init__(
        self,
        message: str,
        *,
        platform: str,
        retryable: bool = False,
        retry_after: float | None = None,
        ambiguous: bool = False,
        code: int | str | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable, retry_after=retry_after, ambiguous=ambiguous)
        self.platform = platform
        """Adapter name, e.g. ``"telegram"``."""
        self.code = code
        """The platform's own error code, when it gave one."""


class MCPServerError(ChatflowError):
    """An MCP server (the operator's tool server) could not be started or reached.

    At start-up it stops the bot unless the server is optional; during a turn
    the model gets an error tool result instead, so it never fails a turn.
    """

    def __init__(self, message: str, *, server: str, retryable: bool = True) -> None:
        super().__init__(message, retryable=retryable)
        self.server = server
        """The server's name."""


class MediaError(ChatflowError):
    """A user's attachment cannot be used: too big, of a type we do not read,
    unreadable (an encrypted or broken PDF, a 0-byte file), or its download failed.

    The message is one line fit to show the user; it names no file.
    """


class StorageError(ChatflowError):
    """The database failed or holds something we cannot read."""


class DatabaseUnavailableError(StorageError):
    """The database could not be reached (refused, silent, timed out, restarting, read-only
    after a failover): the same work may succeed once it is back (``retryable``)."""

    retryable = True


class CommitOutcomeUnknownError(DatabaseUnavailableError):
    """The connection died after COMMIT was sent: the transaction may or may not have
    committed. Read its keys back once connected; never guess (``ambiguous``)."""

    ambiguous = True


class SessionLeaseLostError(DatabaseUnavailableError):
    """A turn's save found its session lease taken over (its process froze, or lost the
    database, past the lease): nothing was written, and the work may be run again by
    whoever holds the session now (``retryable``)."""


class SchemaVersionError(StorageError):
    """The database was written by a newer Chatflow schema than this code knows."""


class TapRefusedError(ChatflowError):
    """A button tap that must start no turn: unknown, forged, from another chat, expired
    or already used. The message is the short notice the person is shown."""


class ApprovalError(ChatflowError):
    """An approval cannot be resumed: unknown, or in a state no decision leads to."""
