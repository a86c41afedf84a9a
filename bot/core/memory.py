"""Sessions and their stores, under the seeds' import path (``chatflow_agent.core.memory``).

A façade: the code lives in modules of one concept each --

- ``bot.core.session``: ``SessionContext``, its change tracking and checkpoints;
- ``bot.core.stores.base``: the store contract ``BaseSessionStore`` and the SQL
  capability ``TransactionalStore``;
- ``bot.core.stores.in_memory``: the in-memory ``SessionStore``;
- ``bot.core.ids``: session-id validation and the id form fit for logs;
- ``bot.core.sql``: the ``Transaction`` protocol and the SQL both databases run
  (``bot.core.stores.sql`` and ``bot.core.stores.schema``: what the SQL stores share);
- ``bot.core.stores._locks``: ``KeyedLocks``.

Every name importable from here before the split still is (DESIGN §3.0).
"""

from __future__ import annotations

from bot.core.ids import (
    LogSafePredicate,
    log_session_id,
    set_log_safe_session_ids,
    validate_session_id,
)
from bot.core.session import DEFAULT_MAX_TURNS, SessionCheckpoint, SessionContext, seq_runs
from bot.core.sql import Transaction
from bot.core.stores._locks import KeyedLocks
from bot.core.stores.base import (
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
from bot.core.stores.in_memory import SessionStore

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
