"""PostgreSQL session store (asyncpg): the SQLite store's tables and rules, for several processes.

Same tables, columns and semantics as ``SQLiteSessionStore`` (DESIGN §3.3):
saves write only what changed, in one transaction, with the caller's ``also``
hook inside it; a stale context cannot overwrite a newer turn; dedup claims are
one ``INSERT ... ON CONFLICT`` on a unique key, so of any number of processes
exactly one wins an id.

Connections
    One asyncpg pool; every connection is borrowed for one transaction or one
    statement and given back. Nothing lives in a database session between
    transactions (no session advisory lock, no ``SET``), so the store also works
    through PgBouncer in transaction mode (``ConnectionOptions.pooler``).

Per-session order across processes
    ``session_lock`` takes the in-process lock first (coroutines of one process
    queue locally, in arrival order), then the session's lease row
    (``bot.core.stores.pglease``): taken by one short statement, given back by
    another, renewed by one statement per process every third of the lease.
    While the model thinks the turn holds no connection. A killed process's
    leases expire and go to the others; a frozen one's save is fenced: tx 2
    reads the lease row ``FOR SHARE`` with this owner and generation, and
    refuses to save without it (``SessionLeaseLostError``).

Timeouts
    Every wait is bounded (``bot.core.stores.pgconnect``): per-host connects,
    statements, pool acquisition; a COMMIT is never cancelled but cut, and then
    reported as ``CommitOutcomeUnknownError``. Errors that mean the database is
    away are ``DatabaseUnavailableError``.

Migrations
    The SQLite store's, from ``bot.core.stores.schema``: versioned in
    ``chatflow_schema_versions`` (component ``session_store``; the gateway
    records its own components there) and run under a transaction-scoped
    advisory lock, so processes starting together migrate once and never
    collide on ``CREATE TABLE``.

Errors
    asyncpg and connection errors become ``StorageError``; the DSN (it may hold
    a password) never appears in a message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final, TypeAlias, cast

import asyncpg

from bot.core.ids import validate_session_id
from bot.core.session import DEFAULT_MAX_TURNS
from bot.core.sql import (
    ensure_schema,
    is_postgres_url,
    qmark_to_dollar,
    redact_dsn,
    rowcount_from_status,
)
from bot.core.stores.base import DEFAULT_DEDUP_TTL_HOURS
from bot.core.stores.cache import DEFAULT_CACHE_MESSAGES, VERSION_SQL, SessionCache
from bot.core.stores.pgconnect import ConnectionOptions, connector
from bot.core.stores.pglease import (
    DEFAULT_SESSION_LEASE_SECONDS,
    LEASE_COMPONENT,
    LEASE_MIGRATIONS,
    SessionLeases,
)
from bot.core.stores.schema import SCHEMA_VERSION, ensure_session_schema_in
from bot.core.stores.sql import DriverTransaction, SQLSessionStore
from bot.errors import DatabaseUnavailableError, StorageError

__all__ = [
    "DEFAULT_MAX_POOL",
    "SCHEMA_VERSION",
    "PostgresSessionStore",
    "is_postgres_url",
    "redact_dsn",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_POOL: Final = 10
"""Connections of the main pool (transactions)."""
CLOSE_TIMEOUT_SECONDS: Final = 10.0
"""How long ``close`` waits for borrowed connections before cutting them."""

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

    _Conn: TypeAlias = PoolConnectionProxy[asyncpg.Record]

# What can go wrong talking to the server, translated to StorageError where it enters.
_DB_ERRORS: Final = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # a connection left mid-operation by a timed-out statement
    OSError,
    TimeoutError,
)


# Server answers that mean "not reachable now" rather than "this statement is wrong":
# shutting down, starting up, a standby after a failover, a statement timed out.
_UNAVAILABLE_SERVER: Final = (
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.QueryCanceledError,
    asyncpg.TargetServerAttributeNotMatched,
)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) and not str(exc):
        # A server (or a proxy in front of it) that accepts connections but never answers.
        return "no answer in time: the server (or the network to it) went silent"
    return f"{type(exc).__name__}: {exc}"


def _cut(conn: _Conn) -> None:
    """Close ``conn`` at once; one the pool already let go of (its server end died, or
    it was cut before) needs nothing more."""
    with contextlib.suppress(asyncpg.InterfaceError):
        conn.terminate()


def _unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database is away (so the same work may succeed later)."""
    if isinstance(exc, asyncpg.PostgresError):
        return isinstance(exc, _UNAVAILABLE_SERVER)
    return isinstance(
        exc, (OSError, TimeoutError, asyncpg.InterfaceError, asyncpg.InternalClientError)
    )


def _error(what: str, exc: BaseException) -> StorageError:
    """``StorageError`` for ``exc`` (``DatabaseUnavailableError`` when the database is away)."""
    kind = DatabaseUnavailableError if _unavailable(exc) else StorageError
    return kind(f"{what}: {_describe(exc)}")


async def _end_transaction(conn: asyncpg.Connection[asyncpg.Record]) -> None:
    """The pool's reset behind a transaction-mode pooler: roll back, nothing else."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _PgTransaction(DriverTransaction):
    """The ``Transaction`` of ``PostgresSessionStore``: ``?`` SQL on one connection."""

    __slots__ = ("_commit_timeout", "_conn", "_timeout")

    dialect: Final = "postgres"
    """Statements are PostgreSQL SQL, written with ``?`` placeholders."""

    def __init__(
        self, conn: _Conn, timeout: float | None = None, commit_timeout: float | None = None
    ) -> None:
        super().__init__()
        self._conn = conn
        self._timeout = timeout
        self._commit_timeout = commit_timeout

    def _connection(self) -> _Conn:
        if not self._active:
            raise StorageError("this transaction has ended")
        return self._conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1 if none apply)."""
        conn = self._connection()
        try:
            status = await conn.execute(qmark_to_dollar(sql), *params, timeout=self._timeout)
        except _DB_ERRORS as exc:
            raise _error("SQL statement failed", exc) from exc
        return rowcount_from_status(status)

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter set."""
        conn = self._connection()
        batch = [tuple(params) for params in seq_of_params]
        if not batch:
            return
        try:
            await conn.executemany(qmark_to_dollar(sql), batch, timeout=self._timeout)
        except _DB_ERRORS as exc:
            raise _error("SQL statement failed", exc) from exc

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query and return every row."""
        conn = self._connection()
        try:
            rows = await conn.fetch(qmark_to_dollar(sql), *params, timeout=self._timeout)
        except _DB_ERRORS as exc:
            raise _error("SQL query failed", exc) from exc
        return [tuple(row) for row in rows]

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Run a query and return its first row, or ``None`` (use ``LIMIT`` for big results)."""
        conn = self._connection()
        try:
            row = await conn.fetchrow(qmark_to_dollar(sql), *params, timeout=self._timeout)
        except _DB_ERRORS as exc:
            raise _error("SQL query failed", exc) from exc
        return None if row is None else tuple(row)

    async def _send_commit(self) -> None:
        # Never cancelled (a cancel request can leave a COMMIT durable here and missing
        # on a standby promoted later): past its time the connection is cut instead,
        # which the server does not act on mid-commit, and the outcome is unknown.
        commit = asyncio.ensure_future(self._conn.execute("COMMIT"))
        done, _ = await asyncio.wait({commit}, timeout=self._commit_timeout)
        if not done:
            _cut(self._conn)
            with contextlib.suppress(asyncio.CancelledError, *_DB_ERRORS):
                await commit
            raise TimeoutError("no answer to COMMIT in time; the connection was cut")
        await commit

    def _commit_ambiguous(self, exc: BaseException) -> bool:
        # An error the server sent in answer to COMMIT means it rolled back; a connection
        # that died (or a server that went down) after COMMIT was sent says nothing.
        if isinstance(exc, asyncpg.PostgresError):
            return isinstance(exc, _UNAVAILABLE_SERVER)
        return _unavailable(exc)

    async def _rollback(self) -> None:
        try:
            # Bounded: a server that froze (its host still acknowledging) never answers.
            await asyncio.shield(self._conn.execute("ROLLBACK", timeout=self._timeout))
        except (asyncio.CancelledError, *_DB_ERRORS):
            # The connection's state is unknown: drop it rather than hand it back.
            logger.warning("rolling back a session-store transaction failed; dropping it")
            _cut(self._conn)

    def _driver_error(self, exc: BaseException) -> str | None:
        return _describe(exc) if isinstance(exc, _DB_ERRORS) else None


class PostgresSessionStore(SQLSessionStore):
    """Sessions, messages and dedup ids in PostgreSQL, shared by any number of processes.

    ``dsn`` is a ``postgresql://`` (or ``postgres://``) URL; extra query
    parameters are server settings (``?search_path=tenant_a`` keeps the tables
    in that schema). Opens lazily on first use (or ``await store.open()``);
    ``close()`` is final. Unknown keyword arguments raise ``TypeError``.
    ``cache_messages`` bounds the committed windows kept in memory
    (``bot.core.stores.cache``; 0 turns the cache off).
    """

    _FOR_SHARE = " FOR SHARE"
    _FOR_UPDATE = " FOR UPDATE"
    _PURGE_SQL = (
        "DELETE FROM chatflow_processed_messages WHERE message_id IN ("
        "SELECT message_id FROM chatflow_processed_messages WHERE processed_at < ? "
        "ORDER BY processed_at LIMIT ? FOR UPDATE SKIP LOCKED)"
    )

    dialect = "postgres"

    def __init__(
        self,
        dsn: str,
        default_max_turns: int = DEFAULT_MAX_TURNS,
        *,
        dedup_ttl_hours: float = DEFAULT_DEDUP_TTL_HOURS,
        clock: Callable[[], datetime] | None = None,
        prune_to_turns: int | None = None,
        min_pool: int = 1,
        max_pool: int = DEFAULT_MAX_POOL,
        cache_messages: int = DEFAULT_CACHE_MESSAGES,
        options: ConnectionOptions | None = None,
        lease_owner: str | None = None,
        session_lease_seconds: float = DEFAULT_SESSION_LEASE_SECONDS,
    ) -> None:
        """``options``: timeouts, keepalives, ``application_name`` and pooler mode.
        ``lease_owner`` names this process in session leases (its instance id, the
        fencing token of ``owner_instance``; a random one if ``None``)."""
        super().__init__(
            default_max_turns,
            dedup_ttl_hours=dedup_ttl_hours,
            clock=clock,
            prune_to_turns=prune_to_turns,
        )
        self._cache = SessionCache(cache_messages)
        if not isinstance(dsn, str):
            raise TypeError("dsn must be a str")
        if not is_postgres_url(dsn):
            raise ValueError("dsn must be a postgresql:// URL")
        if not 0 <= min_pool <= max_pool or max_pool < 1:
            raise ValueError("need 0 <= min_pool <= max_pool and max_pool >= 1")
        self._dsn = dsn
        self._options = options or ConnectionOptions()
        self._min_pool = min_pool
        self._max_pool = max_pool
        self._pool: asyncpg.Pool | None = None
        self._waiters = 0
        self._leases = SessionLeases(
            lease_owner or uuid.uuid4().hex, session_lease_seconds, self._run_one
        )
        self._closed = False
        self._open_lock = asyncio.Lock()
        self._lock_namespace = ""
        # Tasks inside one of this store's transactions: their re-entry is refused,
        # as on SQLite, so code written against either store behaves the same.
        self._tx_tasks: set[asyncio.Task[Any]] = set()

    def __repr__(self) -> str:
        return f"<PostgresSessionStore {redact_dsn(self._dsn)}>"

    # -- connection -----------------------------------------------------------------

    @property
    def _connected(self) -> bool:
        return self._pool is not None

    async def _open_connection(self) -> None:
        await self._connect()

    async def _connect(self) -> None:
        try:
            pool = await self._create_pool(self._min_pool, self._max_pool)
        except _DB_ERRORS as exc:
            where = f"DATABASE_URL: cannot connect to PostgreSQL at {redact_dsn(self._dsn)}"
            if isinstance(exc, TimeoutError) and not str(exc):
                raise DatabaseUnavailableError(
                    f"{where}: no answer within {self._options.connect_timeout:g} s: the server "
                    "accepted the connection but never completed the handshake"
                ) from exc
            raise _error(where, exc) from exc
        try:
            await self._migrate(pool)
        except BaseException as exc:
            pool.terminate()
            if isinstance(exc, _DB_ERRORS):
                raise _error("cannot prepare the session tables", exc) from exc
            raise
        self._pool = pool

    @property
    def options(self) -> ConnectionOptions:
        """The timeouts, keepalives and ``application_name`` of this store's connections."""
        return self._options

    async def _create_pool(self, min_size: int, max_size: int) -> asyncpg.Pool:
        return await asyncpg.create_pool(
            self._dsn,
            min_size=min_size,
            max_size=max_size,
            # The stubs' protocol spells out asyncpg.connect's every keyword; the hook
            # forwards them all.
            connect=cast(Any, connector(self._options)),
            server_settings=self._options.server_settings(),
            # Through a transaction-mode pooler a prepared statement may be missing on
            # the server connection the next transaction gets.
            statement_cache_size=0 if self._options.pooler == "transaction" else 100,
            # asyncpg's reset (RESET ALL, unlock all, ...) would run on whatever server
            # connection the pooler lends, undoing its connect_query settings: the store
            # leaves no session state, so only an open transaction needs ending.
            reset=_end_transaction if self._options.pooler == "transaction" else None,
        )

    async def _acquire(self, pool: asyncpg.Pool) -> _Conn:
        self._waiters += 1
        try:
            conn: _Conn = await pool.acquire(timeout=self._options.acquire_timeout)
        except _DB_ERRORS as exc:
            self._forget_snapshots()
            raise _error("cannot reach PostgreSQL", exc) from exc
        finally:
            self._waiters -= 1
        return conn

    @property
    def connection_waiters(self) -> int:
        """Tasks waiting for one of the pool's connections now (a gauge)."""
        return self._waiters

    async def _migrate(self, pool: asyncpg.Pool) -> None:
        async with pool.acquire(timeout=self._options.acquire_timeout) as conn:
            await conn.execute("BEGIN")
            tx = _PgTransaction(conn)
            async with self._settle(tx, None):
                names = await tx.fetchone("SELECT current_database(), current_schema()")
                database, schema = (None, None) if names is None else names
                if schema is None:
                    schema = await self._create_schema(conn)
                    names = await tx.fetchone("SELECT current_database(), current_schema()")
                    database = None if names is None else names[0]
                self._lock_namespace = f"{database}|{schema}"
                await ensure_session_schema_in(tx)
                await ensure_schema(tx, LEASE_COMPONENT, LEASE_MIGRATIONS)

    async def _create_schema(self, conn: _Conn) -> str:
        """Create the first schema of ``search_path`` (``?search_path=tenant_a``): it names
        where the operator wants the tables, and a new database has none of its own."""
        path = str(await conn.fetchval("SHOW search_path"))
        wanted = next(
            (p.strip().strip('"') for p in path.split(",") if p.strip() not in ("", '"$user"')),
            None,
        )
        if wanted is None:
            raise StorageError("PostgreSQL has no schema to create tables in (set search_path)")
        try:
            await conn.execute("SAVEPOINT chatflow_schema")
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {_quote_identifier(wanted)}")
        except asyncpg.PostgresError as exc:
            await conn.execute("ROLLBACK TO SAVEPOINT chatflow_schema")
            raise StorageError(
                f"PostgreSQL schema {wanted!r} (search_path) does not exist and could not be "
                f"created ({_describe(exc)}): create it with CREATE SCHEMA, or grant CREATE "
                "on the database"
            ) from exc
        logger.info("created the PostgreSQL schema named in search_path")
        return wanted

    async def close(self) -> None:
        """Close both pools; the store cannot be used afterwards. Idempotent."""
        if asyncio.current_task() in self._tx_tasks:
            raise StorageError("close() called inside the store's own transaction")
        if self._pool is not None and not self._closed:
            await self._leases.close()
        self._closed = True
        async with self._open_lock:
            pools = [p for p in (self._pool,) if p is not None]
            self._pool = None
        for pool in pools:
            try:
                await asyncio.wait_for(pool.close(), CLOSE_TIMEOUT_SECONDS)
            except (TimeoutError, *_DB_ERRORS):
                logger.warning("PostgreSQL pool did not close in time; cutting its connections")
                pool.terminate()

    async def _pools(self) -> tuple[asyncpg.Pool, asyncpg.Pool]:
        await self.open()
        pool = self._pool
        if pool is None:
            raise StorageError("the session store is closed")
        return pool, pool

    @asynccontextmanager
    async def _transaction(
        self, *, write: bool = True, on_commit: Callable[[], None] | None = None
    ) -> AsyncIterator[_PgTransaction]:
        task = asyncio.current_task()
        if task is not None and task in self._tx_tasks:
            raise StorageError(
                "the session store was used inside its own transaction; "
                "run that SQL through the Transaction instead"
            )
        pool, _ = await self._pools()
        conn = await self._acquire(pool)
        if task is not None:
            self._tx_tasks.add(task)
        try:
            try:
                await conn.execute(
                    "BEGIN" if write else "BEGIN READ ONLY", timeout=self._options.statement_timeout
                )
            except _DB_ERRORS as exc:
                raise _error("cannot start a transaction", exc) from exc
            tx = _PgTransaction(
                conn, self._options.statement_timeout, self._options.statement_timeout
            )
            async with self._settle(tx, on_commit):
                yield tx
        except DatabaseUnavailableError:
            self._forget_snapshots()
            raise
        finally:
            if task is not None:
                self._tx_tasks.discard(task)
            await self._release(pool, conn)

    def _forget_snapshots(self) -> None:
        """The database went away: the server that answers next (a promoted standby) may
        lack commits this cache saw, and a session rebuilt there could match a snapshot's
        version and length with other content. Every session is read afresh."""
        self._cache.clear()

    async def _release(self, pool: asyncpg.Pool, conn: _Conn) -> None:
        # asyncpg shields the release from cancellation (which goes on to the caller)
        # and closes a connection it cannot reset, so the pool never gets one back
        # mid-transaction; a failed reset leaves nothing more to do here.
        with contextlib.suppress(*_DB_ERRORS):
            await pool.release(conn)

    @property
    def max_connections(self) -> int:
        """The most server connections this store opens (its one pool)."""
        return self._max_pool

    async def behind_proxy(self) -> bool:
        """Whether something stands between this process and the server (PgBouncer, a
        TCP proxy): the server's backend sees a client address other than this socket's."""
        pool, _ = await self._pools()
        conn = await self._acquire(pool)
        try:
            transport = getattr(conn, "_transport", None)  # the proxy passes it through
            mine = None if transport is None else transport.get_extra_info("sockname")
            row = await conn.fetchrow(
                "SELECT client_addr::text, client_port FROM pg_stat_activity "
                "WHERE pid = pg_backend_pid()",
                timeout=self._options.statement_timeout,
            )
        except _DB_ERRORS as exc:
            raise _error("SQL query failed", exc) from exc
        finally:
            await self._release(pool, conn)
        if row is None or row[1] is None or not isinstance(mine, tuple):
            return False  # a Unix socket: nothing between
        return int(row[1]) != int(mine[1])

    # -- session leases --------------------------------------------------------------

    async def _run_one(self, sql: str, *args: Any) -> Any:
        """One statement on a pooled connection (autocommit): its first value."""
        pool, _ = await self._pools()
        conn = await self._acquire(pool)
        try:
            return await conn.fetchval(sql, *args, timeout=self._options.statement_timeout)
        except _DB_ERRORS as exc:
            raise _error("cannot take or free a session lease", exc) from exc
        finally:
            await self._release(pool, conn)

    def bind_lease_owner(self, owner: str, lease_seconds: float) -> None:
        """Name this process in session leases by ``owner`` (its instance id, the token of
        its instance lease) with leases of ``lease_seconds``: ``InstanceRegistry`` calls
        it, so a takeover of the instance frees its sessions too. Refused while leases
        are held."""
        if (len(self._leases) or self._leases.queued) and owner != self._leases.owner:
            raise StorageError("cannot rename the lease owner while sessions are held")
        self._leases.owner = owner
        self._leases.lease_seconds = lease_seconds

    @property
    def leases(self) -> SessionLeases:
        """This store's session leases (``bot.core.stores.pglease``)."""
        return self._leases

    @asynccontextmanager
    async def session_lock(self, session_id: str) -> AsyncIterator[None]:
        """Serialise turns of ``session_id`` across every process on this database.

        Not re-entrant. The in-process lock first (this process's turns queue in
        arrival order), then the session's lease row, taken and given back by short
        statements: no connection is held in between. The save of a turn inside is
        fenced by the lease (``_lease_fence``).
        """
        validate_session_id(session_id)
        async with self._session_locks.hold(session_id):
            await self.open()
            generation = await self._leases.take(session_id)
            token = self._leases.enter(session_id, generation)
            try:
                yield
            finally:
                self._leases.leave(token)
                await self._leases.give_back(session_id, generation)

    def _lease_fence(self, session_id: str) -> tuple[str, tuple[Any, ...]] | None:
        return self._leases.fence(session_id)

    # -- sessions -------------------------------------------------------------------

    def _is_unique_violation(self, exc: BaseException | None) -> bool:
        return isinstance(exc, asyncpg.UniqueViolationError)

    async def _read_version(self, session_id: str) -> tuple[Any, ...] | None:
        # One autocommit read on a pooled connection: no BEGIN or COMMIT round trip.
        task = asyncio.current_task()
        if task is not None and task in self._tx_tasks:
            return await super()._read_version(session_id)  # refuses the re-entry
        pool, _ = await self._pools()
        conn = await self._acquire(pool)
        try:
            row = await conn.fetchrow(
                qmark_to_dollar(VERSION_SQL),
                session_id,
                session_id,
                timeout=self._options.statement_timeout,
            )
        except _DB_ERRORS as exc:
            raise _error("SQL query failed", exc) from exc
        finally:
            await self._release(pool, conn)
        return None if row is None else tuple(row)
