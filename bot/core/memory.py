"""Sessions and their stores, under the seeds' import path (``chatflow_agent.core.memory``).

A façade: the code lives in modules of one concept each --

- ``bot.core.session``: ``SessionContext``, its change tracking and checkpoints;
- ``bot.core.store``: the store contract ``BaseSessionStore`` and the SQL
  capability ``TransactionalStore``;
- ``bot.core.memory_store``: the in-memory ``SessionStore``;
- ``bot.core.ids``: session-id validation and the id form fit for logs;
- ``bot.core.sql``: the ``Transaction`` protocol and the SQL both databases run
  (``bot.core.sql_store`` and ``bot.core.session_schema``: what the SQL stores share);
- ``bot.core._locks``: ``KeyedLocks``.

Every name importable from here before the split still is (DESIGN §3.0).
"""

from __future__ import annotations

from bot.core._locks import KeyedLocks
from bot.core.ids import (
    LogSafePredicate,
    log_session_id,
    set_log_safe_session_ids,
    validate_session_id,
)
from bot.core.memory_store import SessionStore
from bot.core.session import DEFAULT_MAX_TURNS, SessionCheckpoint, SessionContext, seq_runs
from bot.core.sql import Transaction
from bot.core.store import (
    DEFAULT_DEDUP_TTL_HOURS,
    NO_SQL_MESSAGE,
    PURGE_BATCH_SIZE,
    PURGE_INTERVAL,
    AgentResolver,
    BaseSessionStore,
    NotTransactionalError,
    SaveHook,
    SessionDeletedError,
    TransactionalStore,
    dump_metadata,
    require_transactional,
)

__all__ = [
    "DEFAULT_DEDUP_TTL_HOURS",
    "DEFAULT_MAX_TURNS",
    "NO_SQL_MESSAGE",
    "PURGE_BATCH_SIZE",
    "PURGE_INTERVAL",
    "AgentResolver",
    "BaseSessionStore",
    "KeyedLocks",
    "LogSafePredicate",
    "NotTransactionalError",
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
]
