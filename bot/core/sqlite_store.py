"""SQLite session store (aiosqlite): sessions, messages and dedup ids in one file.

Concurrency
    One aiosqlite connection per store. aiosqlite runs statements on its own
    worker thread, so the event loop never waits on the disk, but coroutines
    sharing the connection would interleave their statements and transactions;
    an ``asyncio.Lock`` therefore serialises every operation and transaction.
    Write transactions start with ``BEGIN IMMEDIATE`` and ``busy_timeout`` is
    5 s, so several processes can share the file. Using the store from inside
    its own ``transaction()`` block raises ``StorageError`` instead of
    deadlocking: run such SQL through the ``Transaction``.

Durability
    ``journal_mode=WAL`` with ``synchronous=NORMAL``: a committed transaction
    survives a crash or kill of the process (the promise Chatflow makes: tx 1 and
    tx 2 of DESIGN §2); a power loss or OS crash may lose the last few commits
    but never corrupts the file. In-memory databases keep SQLite's default
    journal. A commit interrupted by task cancellation is awaited to its end
    before the cancellation continues, so a session's bookkeeping always
    matches the file.

Schema
    Created and migrated forward on open, in one transaction, by
    ``bot.core.session_schema`` (component ``session_store`` of
    ``chatflow_schema_versions``, mirrored in ``PRAGMA user_version``). A
    database from a newer Chatflow, or one holding chatflow tables of another
    layout (the chatflow-agent package), raises ``SchemaVersionError``.

Timestamps
    ``created_at`` / ``updated_at`` are ISO-8601 UTC text with microseconds
    (they sort chronologically); ``processed_at`` is Unix time (REAL).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import aiosqlite

from bot.core._locks import KeyedLocks
from bot.core.ids import validate_session_id
from bot.core.session import DEFAULT_MAX_TURNS
from bot.core.session_schema import SCHEMA_VERSION, ensure_session_schema_in
from bot.core.sql_store import DriverTransaction, SQLSessionStore
from bot.core.store import DEFAULT_DEDUP_TTL_HOURS
from bot.errors import StorageError

__all__ = ["BUSY_TIMEOUT_MS", "SCHEMA_VERSION", "SQLiteSessionStore"]

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
"""How long a statement waits for another process's write lock."""

# Locks of one database file are shared by every store instance of this process.
_SHARED_SESSION_LOCKS = KeyedLocks()


def _is_memory_target(path: str, uri: bool) -> bool:
    if path == ":memory:":
        return True
    if not uri:
        return False
    parts = urlsplit(path)
    return parts.path in ("", ":memory:") or "memory" in parse_qs(parts.query).get("mode", [])


class _SQLiteTransaction(DriverTransaction):
    """The ``Transaction`` handed to callers of ``transaction()`` and ``save(also=...)``."""

    __slots__ = ("_conn",)

    dialect: Final = "sqlite"
    """Statements are SQLite SQL."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        super().__init__()
        self._conn = conn

    def _connection(self) -> aiosqlite.Connection:
        if not self._active:
            raise StorageError("this transaction has ended")
        return self._conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1 if none apply)."""
        conn = self._connection()
        try:
            cursor = await conn.execute(sql, tuple(params))
        except sqlite3.Error as exc:
            raise StorageError(f"SQL statement failed: {exc}") from exc
        return int(cursor.rowcount)

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter set."""
        conn = self._connection()
        batch = [tuple(params) for params in seq_of_params]
        try:
            await conn.executemany(sql, batch)
        except sqlite3.Error as exc:
            raise StorageError(f"SQL statement failed: {exc}") from exc

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query and return every row."""
        conn = self._connection()
        try:
            rows = await conn.execute_fetchall(sql, tuple(params))
        except sqlite3.Error as exc:
            raise StorageError(f"SQL query failed: {exc}") from exc
        return [tuple(row) for row in rows]

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Run a query and return its first row, or ``None`` (use ``LIMIT`` for big results)."""
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def _send_commit(self) -> None:
        # sqlite3 commits on aiosqlite's thread: it runs to its end even if we are cancelled.
        await self._conn.commit()

    async def _rollback(self) -> None:
        try:
            await self._conn.rollback()
        except sqlite3.Error:
            logger.warning("rolling back a session-store transaction failed", exc_info=True)

    def _driver_error(self, exc: BaseException) -> str | None:
        return str(exc) if isinstance(exc, sqlite3.Error) else None


class SQLiteSessionStore(SQLSessionStore):
    """Sessions, messages and dedup ids in one SQLite file, through aiosqlite.

    Opens lazily on first use (or ``await store.open()``); ``close()`` is final.
    ``":memory:"`` and ``file:...?mode=memory`` URIs work on the one connection.
    Unknown keyword arguments (e.g. ``busy_timeout``) raise ``TypeError``.
    """

    # One writer at a time (BEGIN IMMEDIATE) already gives what FOR SHARE/UPDATE give.
    _PURGE_SQL = (
        "DELETE FROM chatflow_processed_messages WHERE rowid IN ("
        "SELECT rowid FROM chatflow_processed_messages WHERE processed_at < ? "
        "ORDER BY processed_at LIMIT ?)"
    )

    dialect = "sqlite"

    def __init__(
        self,
        db_path: str | os.PathLike[str],
        default_max_turns: int = DEFAULT_MAX_TURNS,
        *,
        dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        super().__init__(default_max_turns, dedup_ttl_hours=dedup_ttl_hours, clock=clock)
        path = os.fspath(db_path)
        if not isinstance(path, str):
            raise TypeError("db_path must be a str or a path")
        if not path:
            raise ValueError("db_path must not be empty (use ':memory:' for a private database)")
        self._db_path = path
        self._uri = path.startswith("file:")
        self._memory = _is_memory_target(path, self._uri)
        self._conn: aiosqlite.Connection | None = None
        self._closed = False
        self._open_lock = asyncio.Lock()
        self._op_lock = asyncio.Lock()
        # The task holding _op_lock: its re-entry would deadlock, so it is refused.
        self._op_owner: asyncio.Task[Any] | None = None
        self._lock_namespace: Hashable | None = None
        if path == ":memory:":
            # A private database: only this instance can see it.
            self._lock_namespace = ("private", uuid.uuid4().hex)
        elif self._uri:
            self._lock_namespace = ("uri", path)

    @property
    def db_path(self) -> str:
        """The path or URI given to the constructor."""
        return self._db_path

    # -- connection -----------------------------------------------------------------

    @property
    def _connected(self) -> bool:
        return self._conn is not None

    async def _open_connection(self) -> None:
        self._conn = await self._connect()

    async def close(self) -> None:
        """Close the connection; the store cannot be used afterwards. Idempotent."""
        if self._op_owner is not None and self._op_owner is asyncio.current_task():
            raise StorageError("close() called inside the store's own transaction")
        self._closed = True
        async with self._open_lock, self._op_lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    await conn.close()
                except sqlite3.Error as exc:
                    raise StorageError(f"closing the database failed: {exc}") from exc

    async def _connect(self) -> aiosqlite.Connection:
        if not self._memory and not self._uri:
            try:
                await asyncio.to_thread(self._prepare_directory)
            except OSError as exc:
                raise StorageError(f"cannot create the database directory: {exc}") from exc
        conn = aiosqlite.connect(self._db_path, uri=self._uri, isolation_level=None)
        try:
            await conn
        except BaseException as exc:
            # aiosqlite stops its worker thread without waiting; let it finish while
            # this loop still runs, or its last callback hits a closed loop.
            worker = getattr(conn, "_thread", None)
            if isinstance(worker, threading.Thread) and worker.is_alive():
                await asyncio.to_thread(worker.join, 5)
            if isinstance(exc, sqlite3.Error):
                raise StorageError(f"cannot open the session database: {exc}") from exc
            raise
        try:
            await self._configure(conn)
            await self._migrate(conn)
        except BaseException:
            await conn.close()
            raise
        return conn

    def _prepare_directory(self) -> None:
        real = os.path.realpath(self._db_path)
        Path(real).parent.mkdir(parents=True, exist_ok=True)
        self._lock_namespace = ("file", real)

    async def _configure(self, conn: aiosqlite.Connection) -> None:
        try:
            await conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            await conn.execute("PRAGMA foreign_keys = ON")
            if not self._memory:
                rows = list(await conn.execute_fetchall("PRAGMA journal_mode = WAL"))
                mode = str(rows[0][0]).lower() if rows else "unknown"
                if mode != "wal":
                    logger.warning("SQLite refused WAL mode (journal_mode=%s)", mode)
            await conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot configure the session database: {exc}") from exc

    async def _migrate(self, conn: aiosqlite.Connection) -> None:
        tx = _SQLiteTransaction(conn)
        try:
            await conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot prepare the session tables: {exc}") from exc
        async with self._settle(tx, None):
            await ensure_session_schema_in(tx)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[aiosqlite.Connection]:
        task = asyncio.current_task()
        if self._op_owner is not None and self._op_owner is task:
            raise StorageError(
                "the session store was used inside its own transaction; "
                "run that SQL through the Transaction instead"
            )
        await self.open()
        async with self._op_lock:
            conn = self._conn
            if conn is None:
                raise StorageError("the session store is closed")
            self._op_owner = task
            try:
                yield conn
            finally:
                self._op_owner = None

    @asynccontextmanager
    async def _transaction(
        self, *, write: bool, on_commit: Callable[[], None] | None = None
    ) -> AsyncIterator[_SQLiteTransaction]:
        async with self._connection() as conn:
            tx = _SQLiteTransaction(conn)
            try:
                await conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            except sqlite3.Error as exc:
                raise StorageError(f"cannot start a transaction: {exc}") from exc
            except BaseException:
                # Cancelled while BEGIN was queued: it still runs, so undo it.
                await tx._rollback()
                raise
            async with self._settle(tx, on_commit):
                yield tx

    # -- sessions -------------------------------------------------------------------

    @asynccontextmanager
    async def session_lock(self, session_id: str) -> AsyncIterator[None]:
        """Serialise turns of ``session_id`` across every store instance on this file.

        Not re-entrant. Locks are keyed by (resolved database path, session id)
        and exist only while held or awaited.
        """
        validate_session_id(session_id)
        async with _SHARED_SESSION_LOCKS.hold((await self._namespace(), session_id)):
            yield

    async def _namespace(self) -> Hashable:
        if self._lock_namespace is None:
            self._lock_namespace = (
                "file",
                await asyncio.to_thread(os.path.realpath, self._db_path),
            )
        return self._lock_namespace

    def _is_unique_violation(self, exc: BaseException | None) -> bool:
        return isinstance(exc, sqlite3.IntegrityError)
