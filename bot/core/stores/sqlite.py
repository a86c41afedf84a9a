"""SQLite session store: sessions, messages and dedup ids in one file, on a database thread.

Concurrency
    One plain ``sqlite3`` connection per store, owned by a database thread
    (``bot.core.stores.sqlite_writer``), so the event loop never waits on the disk.
    The hot path (loads, saves with their ``also`` hook, claims, tx 1) goes
    through ``run(body)``: the body is driven on that thread in one call, and
    bodies queued together commit with one COMMIT (group commit). A
    ``transaction()`` block holds the thread exclusively, one hop per
    statement, serialised with the batches (and with other blocks by an
    ``asyncio.Lock``). Write transactions start with ``BEGIN IMMEDIATE`` and
    ``busy_timeout`` is 5 s, so several processes can share the file. Using the
    store from inside its own ``transaction()`` block raises ``StorageError``
    instead of deadlocking: run such SQL through the ``Transaction``.

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
    ``bot.core.stores.schema`` (component ``session_store`` of
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
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Final, TypeVar
from urllib.parse import parse_qs, urlsplit

from bot.core.ids import validate_session_id
from bot.core.session import DEFAULT_MAX_TURNS
from bot.core.sql import Transaction
from bot.core.stores._locks import KeyedLocks
from bot.core.stores.base import DEFAULT_DEDUP_TTL_HOURS, TransactionBody
from bot.core.stores.cache import DEFAULT_CACHE_MESSAGES, VERSION_SQL, SessionCache
from bot.core.stores.schema import SCHEMA_VERSION, ensure_session_schema_in
from bot.core.stores.sql import DriverTransaction, SQLSessionStore
from bot.core.stores.sqlite_writer import (
    Interactive,
    SQLiteWriter,
    SyncTransaction,
    run_execute,
    run_executemany,
    run_fetchall,
    touches_sessions,
)
from bot.errors import StorageError

__all__ = ["BUSY_TIMEOUT_MS", "SCHEMA_VERSION", "SQLiteSessionStore"]

logger = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000
"""How long a statement waits for another process's write lock."""

# Locks of one database file are shared by every store instance of this process.
_SHARED_SESSION_LOCKS = KeyedLocks()

_T = TypeVar("_T")


def _is_memory_target(path: str, uri: bool) -> bool:
    if path == ":memory:":
        return True
    if not uri:
        return False
    parts = urlsplit(path)
    return parts.path in ("", ":memory:") or "memory" in parse_qs(parts.query).get("mode", [])


class _SQLiteTransaction(DriverTransaction):
    """The ``Transaction`` of a ``transaction()`` block: one hop to the thread per statement."""

    __slots__ = ("_session", "_writer")

    dialect: Final = "sqlite"
    """Statements are SQLite SQL."""

    def __init__(self, writer: SQLiteWriter, session: Interactive) -> None:
        super().__init__()
        self._writer = writer
        self._session = session

    def _check(self) -> None:
        if not self._active:
            raise StorageError("this transaction has ended")

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1 if none apply)."""
        self._check()
        if touches_sessions(sql):
            self._session.touched = True  # the cached windows are checked again at COMMIT
        args = tuple(params)
        result: int = await self._writer.call_in(
            self._session, lambda conn: run_execute(conn, sql, args)
        )
        return result

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter set."""
        self._check()
        if touches_sessions(sql):
            self._session.touched = True
        rows = [tuple(params) for params in seq_of_params]
        await self._writer.call_in(self._session, lambda conn: run_executemany(conn, sql, rows))

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query and return every row."""
        self._check()
        args = tuple(params)
        rows: list[tuple[Any, ...]] = await self._writer.call_in(
            self._session, lambda conn: run_fetchall(conn, sql, args)
        )
        return rows

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Run a query and return its first row, or ``None`` (use ``LIMIT`` for big results)."""
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def _send_commit(self) -> None:
        # COMMIT runs on the database thread: to its end even if we are cancelled.
        await self._writer.commit_in(self._session)

    async def _rollback(self) -> None:
        # The thread logs a failed ROLLBACK; the next transaction retries it.
        await self._writer.rollback_in(self._session)

    def _driver_error(self, exc: BaseException) -> str | None:
        return str(exc) if isinstance(exc, sqlite3.Error) else None


class SQLiteSessionStore(SQLSessionStore):
    """Sessions, messages and dedup ids in one SQLite file, on a database thread.

    Opens lazily on first use (or ``await store.open()``); ``close()`` is final.
    ``":memory:"`` and ``file:...?mode=memory`` URIs work on the one connection.
    Unknown keyword arguments (e.g. ``busy_timeout``) raise ``TypeError``.
    ``cache_messages`` bounds the committed windows kept in memory
    (``bot.core.stores.cache``; 0 turns the cache off).
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
        prune_to_turns: int | None = None,
        cache_messages: int = DEFAULT_CACHE_MESSAGES,
    ) -> None:
        super().__init__(
            default_max_turns,
            dedup_ttl_hours=dedup_ttl_hours,
            clock=clock,
            prune_to_turns=prune_to_turns,
        )
        # Committed windows by session (bot.core.stores.cache); 0 turns it off.
        self._cache = SessionCache(cache_messages)
        self._in_flight = 0  # run() bodies submitted and not yet answered
        self._changed_seen = 0  # the writer's ``changed`` when the cache was last cleared
        path = os.fspath(db_path)
        if not isinstance(path, str):
            raise TypeError("db_path must be a str or a path")
        if not path:
            raise ValueError("db_path must not be empty (use ':memory:' for a private database)")
        self._db_path = path
        self._uri = path.startswith("file:")
        self._memory = _is_memory_target(path, self._uri)
        # The database thread (named _conn: benchmarks and tests reach it by that name).
        self._conn: SQLiteWriter | None = None
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

    @property
    def commits(self) -> int:
        """COMMITs this store ran so far (group commit makes it less than its transactions)."""
        return 0 if self._conn is None else self._conn.commits

    # -- connection -----------------------------------------------------------------

    @property
    def _connected(self) -> bool:
        return self._conn is not None

    async def _open_connection(self) -> None:
        # A private or URI database has no second connection to probe it.
        probe = None if self._memory or self._uri else self._connect_probe
        writer = SQLiteWriter(self._connect, name=f"chatflow-sqlite-{id(self):x}", probe=probe)
        await writer.start()
        try:
            await self._migrate(writer)
        except BaseException:
            await writer.close()
            raise
        self._changed_seen = writer.changed
        self._cache.clear()  # nothing it holds was checked against this connection
        self._conn = writer

    async def close(self) -> None:
        """Close the connection; the store cannot be used afterwards. Idempotent."""
        if self._op_owner is not None and self._op_owner is asyncio.current_task():
            raise StorageError("close() called inside the store's own transaction")
        self._closed = True
        async with self._open_lock, self._op_lock:
            writer, self._conn = self._conn, None
            if writer is not None:
                await writer.close()

    def _connect(self) -> sqlite3.Connection:
        # Runs on the database thread.
        if not self._memory and not self._uri:
            try:
                self._prepare_directory()
            except OSError as exc:
                raise StorageError(f"cannot create the database directory: {exc}") from exc
        try:
            conn = sqlite3.connect(
                self._db_path, uri=self._uri, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open the session database: {exc}") from exc
        try:
            self._configure(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_probe(self) -> sqlite3.Connection:
        # Runs on the database thread, after _connect (the file exists, in WAL mode).
        uri = Path(os.path.abspath(self._db_path)).as_uri() + "?mode=ro"
        probe = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        try:
            probe.execute("PRAGMA busy_timeout = 0")  # the loop reads it: never wait
        except BaseException:
            probe.close()
            raise
        return probe

    def _prepare_directory(self) -> None:
        real = os.path.realpath(self._db_path)
        Path(real).parent.mkdir(parents=True, exist_ok=True)
        self._lock_namespace = ("file", real)

    def _configure(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            conn.execute("PRAGMA foreign_keys = ON")
            if not self._memory:
                rows = conn.execute("PRAGMA journal_mode = WAL").fetchall()
                mode = str(rows[0][0]).lower() if rows else "unknown"
                if mode != "wal":
                    logger.warning("SQLite refused WAL mode (journal_mode=%s)", mode)
            conn.execute("PRAGMA synchronous = NORMAL")
        except sqlite3.Error as exc:
            raise StorageError(f"cannot configure the session database: {exc}") from exc

    async def _migrate(self, writer: SQLiteWriter) -> None:
        session = writer.begin(write=True)
        try:
            await session.future
        except StorageError as exc:
            raise StorageError(f"cannot prepare the session tables: {exc}") from exc.__cause__
        async with self._settle(_SQLiteTransaction(writer, session), None) as tx:
            await ensure_session_schema_in(tx)

    def _check_reentry(self) -> None:
        if self._op_owner is not None and self._op_owner is asyncio.current_task():
            raise StorageError(
                "the session store was used inside its own transaction; "
                "run that SQL through the Transaction instead"
            )

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[SQLiteWriter]:
        task = asyncio.current_task()
        self._check_reentry()
        await self.open()
        async with self._op_lock:
            writer = self._conn
            if writer is None:
                raise StorageError("the session store is closed")
            self._op_owner = task
            try:
                yield writer
            finally:
                self._op_owner = None

    @asynccontextmanager
    async def _transaction(
        self, *, write: bool, on_commit: Callable[[], None] | None = None
    ) -> AsyncIterator[_SQLiteTransaction]:
        async with self._connection() as writer:
            session = writer.begin(write)
            tx = _SQLiteTransaction(writer, session)
            try:
                await session.future
            except BaseException:
                # Cancelled while BEGIN was queued: it still runs, so undo it.
                await tx._rollback()
                raise
            async with self._settle(tx, on_commit):
                yield tx

    async def run(
        self,
        body: TransactionBody[_T],
        *,
        write: bool = True,
        on_commit: Callable[[], None] | None = None,
    ) -> _T:
        """Drive ``body(tx)`` on the database thread in one call, committed with its batch.

        The body must not suspend: it may await only ``tx``'s methods (which
        never do); one that awaits anything else fails with ``StorageError``
        and is rolled back. A cancelled caller still waits for the outcome.
        """
        self._check_reentry()
        writer = await self._writer()
        outcome: asyncio.Future[_T] = writer.submit(body, write)
        self._in_flight += 1
        try:
            return await self._await_outcome(outcome, on_commit)
        finally:
            self._in_flight -= 1

    @staticmethod
    async def _await_outcome(
        outcome: asyncio.Future[_T], on_commit: Callable[[], None] | None
    ) -> _T:
        # Once handed to the thread the body's outcome is the database's: wait for
        # it whatever happens to this task, so the caller's bookkeeping matches it.
        cancelled = False
        while not outcome.done():
            try:
                await asyncio.shield(outcome)
            except asyncio.CancelledError:
                if outcome.cancelled():
                    raise
                cancelled = True
            except BaseException:
                break  # the outcome is read below
        error = outcome.exception()
        if error is not None:
            if cancelled:
                raise asyncio.CancelledError from error
            raise error
        if on_commit is not None:
            on_commit()
        if cancelled:
            raise asyncio.CancelledError
        return outcome.result()

    # -- sessions -------------------------------------------------------------------

    def session_lock(self, session_id: str) -> AbstractAsyncContextManager[None]:
        """Serialise turns of ``session_id`` across every store instance on this file.

        Not re-entrant. Locks are keyed by (resolved database path, session id)
        and exist only while held or awaited.
        """
        validate_session_id(session_id)
        namespace = self._lock_namespace
        if namespace is not None:  # every turn after the first: no generator around it
            return _SHARED_SESSION_LOCKS.hold((namespace, session_id))
        return self._first_session_lock(session_id)

    @asynccontextmanager
    async def _first_session_lock(self, session_id: str) -> AsyncIterator[None]:
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

    async def _writer(self) -> SQLiteWriter:
        """The database thread, opened on first use; ``StorageError`` once closed."""
        if self._conn is None:
            await self.open()
            if self._conn is None:
                raise StorageError("the session store is closed")
        return self._conn

    async def load_extension(self, load: Callable[[sqlite3.Connection], object]) -> None:
        """Run ``load(conn)`` (e.g. ``sqlite_vec.load``) on the database thread with extension
        loading allowed only meanwhile: the extension is usable in this store's transactions."""
        writer = await self._writer()

        def run(conn: sqlite3.Connection) -> None:
            conn.enable_load_extension(True)
            try:
                load(conn)
            finally:
                conn.enable_load_extension(False)

        await writer.call(run)

    def _watch_from_here(self, tx: Transaction) -> None:
        if isinstance(tx, SyncTransaction):
            tx.watch = True

    def _fresh_without_read(self) -> bool:
        """True iff no connection committed anything since the database thread last looked.

        One ``PRAGMA data_version`` on the probe (no page read, no wait); a commit
        the thread saw that no save of this store accounted for clears the cache.
        """
        writer = self._conn
        if writer is None or self._op_owner is not None:
            return False
        changed = writer.probe_unchanged()
        if changed is None:
            return False
        if changed != self._changed_seen:
            self._cache.clear()
            self._changed_seen = changed
            return False
        return True

    async def _run_own(self, body: TransactionBody[_T], on_commit: Callable[[], None] | None) -> _T:
        self._check_reentry()
        writer = await self._writer()
        outcome: asyncio.Future[_T] = writer.submit(body, True, own=True)
        self._in_flight += 1
        try:
            return await self._await_outcome(outcome, on_commit)
        finally:
            self._in_flight -= 1

    async def _read_version(self, session_id: str) -> tuple[Any, ...] | None:
        self._check_reentry()
        writer = await self._writer()
        if self._in_flight:
            # Bodies are on their way: a read body joins their batch (and its one
            # COMMIT), where a call outside any transaction would split the batch.
            return await super()._read_version(session_id)
        # Idle: one statement in autocommit, no BEGIN and no COMMIT.
        args = (session_id, session_id)
        rows: list[tuple[Any, ...]] = await writer.call(
            lambda conn: run_fetchall(conn, VERSION_SQL, args)
        )
        return rows[0] if rows else None
