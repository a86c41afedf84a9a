"""The SQLite store's database thread: one ``sqlite3`` connection, bodies run in one go.

``SQLiteWriter`` owns the connection and a FIFO of requests. A *body*
(``SQLiteSessionStore.run``) is driven on the thread to its end in one call:
its ``Transaction`` methods never suspend. Bodies queued together share one
transaction (group commit, no timer): ``BEGIN IMMEDIATE``, a ``SAVEPOINT`` per
body (a failing body rolls back only its own), one ``COMMIT``; every caller's
future resolves after that COMMIT, with one loop wake-up per batch. An
*interactive* transaction (``transaction()`` blocks, migrations) holds the
thread exclusively and runs one statement per hop, as aiosqlite did.

Freshness without a hop (``probe``): a file database gets a second, read-only
connection whose ``PRAGMA data_version`` moves whenever *another* connection
committed. After every COMMIT and every call outside a transaction the thread
publishes the probe's value (``published``) and reads its own connection's,
which moves only for commits of other connections: then it bumps ``changed``.
Its own writes to the session tables that no store save made (a body or a
``transaction()`` block's statements) bump ``changed`` too. The loop compares
the probe's value with ``published`` (``probe_unchanged``): equal means that
nothing committed anywhere since, so a cached window is still the stored one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable, Sequence
from typing import Any, Final

from bot.errors import StorageError

__all__ = [
    "MAX_BATCH",
    "Body",
    "Interactive",
    "SQLiteWriter",
    "SyncTransaction",
    "run_execute",
    "run_executemany",
    "run_fetchall",
]

logger = logging.getLogger(__name__)

MAX_BATCH: Final = 64
"""Most bodies committed by one COMMIT (bounds the latency a batch adds)."""

Body = Callable[[Any], Coroutine[Any, Any, Any]]
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]

_ENDS_ON_SUCCESS: Final = 1
_ENDS_ALWAYS: Final = 2


def run_execute(conn: sqlite3.Connection, sql: str, params: Sequence[Any]) -> int:
    """One statement on ``conn``; its row count. sqlite3 errors become ``StorageError``."""
    try:
        return int(conn.execute(sql, tuple(params)).rowcount)
    except sqlite3.Error as exc:
        raise StorageError(f"SQL statement failed: {exc}") from exc


def run_executemany(conn: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    """One statement per parameter set on ``conn``."""
    try:
        conn.executemany(sql, rows)
    except sqlite3.Error as exc:
        raise StorageError(f"SQL statement failed: {exc}") from exc


def run_fetchall(
    conn: sqlite3.Connection, sql: str, params: Sequence[Any]
) -> list[tuple[Any, ...]]:
    """A query's rows on ``conn``."""
    try:
        return [tuple(row) for row in conn.execute(sql, tuple(params)).fetchall()]
    except sqlite3.Error as exc:
        raise StorageError(f"SQL query failed: {exc}") from exc


def touches_sessions(sql: str) -> bool:
    """Whether ``sql`` names a table a cached window is read from."""
    return "chatflow_messages" in sql or "chatflow_sessions" in sql


class SyncTransaction:
    """The ``Transaction`` of a body: ``async`` methods that call sqlite3 and never suspend."""

    __slots__ = ("_active", "_conn", "touched", "watch")

    dialect: Final = "sqlite"
    """Statements are SQLite SQL."""

    def __init__(self, conn: sqlite3.Connection, watch: bool = True) -> None:
        self._conn = conn
        self._active = True
        self.watch = watch
        """Note writes to the session tables (off while a store save writes its own)."""
        self.touched = False
        """A watched statement wrote to the session tables."""

    def _connection(self) -> sqlite3.Connection:
        if not self._active:
            raise StorageError("this transaction has ended")
        return self._conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1 if none apply)."""
        if self.watch and touches_sessions(sql):
            self.touched = True
        return run_execute(self._connection(), sql, params)

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter set."""
        if self.watch and touches_sessions(sql):
            self.touched = True
        conn = self._connection()
        run_executemany(conn, sql, [tuple(params) for params in seq_of_params])

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query and return every row."""
        return run_fetchall(self._connection(), sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Run a query and return its first row, or ``None``."""
        rows = run_fetchall(self._connection(), sql, params)
        return rows[0] if rows else None


class _Request:
    __slots__ = ("future", "loop")

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Any] = self.loop.create_future()


class _Body(_Request):
    __slots__ = ("body", "own", "write")

    def __init__(self, body: Body, write: bool, own: bool = False) -> None:
        super().__init__()
        self.body = body
        self.write = write
        self.own = own  # a store save: its session-table writes are accounted by the store


class _Call(_Request):
    __slots__ = ("ends", "fn", "session")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        ends: int = 0,
        session: Interactive | None = None,
    ) -> None:
        super().__init__()
        self.fn = fn
        self.ends = ends
        self.session = session


class Interactive(_Request):
    """An exclusive transaction driven from the loop; ``future`` resolves once it began."""

    __slots__ = ("calls", "dead", "hop", "touched", "write")

    def __init__(self, write: bool) -> None:
        super().__init__()
        self.write = write
        self.calls: deque[_Call] = deque()
        self.dead = False
        self.hop: asyncio.Future[Any] | None = None
        self.touched = False  # set on the loop before a statement on the session tables


class _Stop(_Request):
    __slots__ = ()


def _settle_all(outcomes: list[_Outcome]) -> None:
    for future, value, error in outcomes:
        if future.cancelled():
            continue  # a statement whose caller left; its transaction is rolled back
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


def _deliver(outcomes: list[_Outcome]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
    for outcome in outcomes:
        by_loop.setdefault(outcome[0].get_loop(), []).append(outcome)
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(_settle_all, items)


def _storage_error(message: str, cause: BaseException) -> StorageError:
    error = StorageError(message)
    error.__cause__ = cause
    return error


class SQLiteWriter:
    """A daemon thread owning one sqlite3 connection (``connect`` runs on it)."""

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        name: str,
        probe: Callable[[], sqlite3.Connection] | None = None,
    ) -> None:
        self._connect = connect
        self._probe_connect = probe
        self._probe: sqlite3.Connection | None = None
        self._probe_lock = threading.Lock()
        self._own_version: int | None = None
        self.published: int | None = None
        """The probe's ``data_version`` as of the thread's last look (``None``: no probe)."""
        self.changed = 0
        """Bumped when a commit was seen that no store save accounted for."""
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._stopping = False
        self._conn: sqlite3.Connection | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.commits = 0
        """COMMITs that succeeded (batches and interactive transactions)."""
        self.hops = 0
        """Requests handed to the thread (one loop-to-thread round trip each)."""

    # -- loop side --------------------------------------------------------------------

    async def start(self) -> None:
        """Start the thread and connect; raises what ``connect`` raised."""
        started = _Call(lambda conn: None)
        self._queue.append(started)
        self._thread.start()
        await started.future

    def _execute(self, request: _Request) -> asyncio.Future[Any]:
        # Every hop passes here (benchmarks wrap it to count round trips).
        call = request if isinstance(request, _Call) else None
        session = None if call is None else call.session
        with self._cond:
            if call is None or session is None:
                if self._stopping:
                    raise StorageError("the session store is closed")
                self._queue.append(request)
            elif session.dead:
                if call.ends == _ENDS_ALWAYS:
                    call.future.set_result(None)  # nothing left to roll back
                else:
                    call.future.set_exception(StorageError("this transaction has ended"))
                return call.future
            else:
                session.calls.append(call)
            self._cond.notify()
        self.hops += 1
        return request.future

    def _hop(self, request: _Request) -> asyncio.Future[Any]:
        hop: asyncio.Future[Any] = asyncio.ensure_future(self._execute(request))
        return hop

    def submit(self, body: Body, write: bool, own: bool = False) -> asyncio.Future[Any]:
        """Queue ``body`` to be driven on the thread; its future resolves after its COMMIT.

        ``own``: a store save, whose writes to the session tables the store accounts for.
        """
        return self._hop(_Body(body, write, own))

    async def call(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn(conn)`` on the thread, outside any transaction."""
        return await self._hop(_Call(fn))

    def begin(self, write: bool) -> Interactive:
        """Queue an exclusive transaction; await its ``future`` before using it."""
        session = Interactive(write)
        session.hop = self._hop(session)  # keeps a benchmark's wrapping task referenced
        return session

    def call_in(
        self, session: Interactive, fn: Callable[[sqlite3.Connection], Any], ends: int = 0
    ) -> asyncio.Future[Any]:
        """Run ``fn(conn)`` inside ``session``; ``ends`` says when it ends the transaction."""
        return self._hop(_Call(fn, ends, session))

    async def commit_in(self, session: Interactive) -> None:
        """COMMIT ``session``; a driver error leaves it open for ``rollback_in``."""
        await self.call_in(
            session, lambda conn: self._commit_interactive(conn, session), _ENDS_ON_SUCCESS
        )

    async def rollback_in(self, session: Interactive) -> None:
        """Roll ``session`` back and end it."""
        await self.call_in(session, _rollback, _ENDS_ALWAYS)

    def probe_unchanged(self) -> int | None:
        """``changed`` if nothing committed on the database since the thread last published.

        ``None`` otherwise, or when that cannot be told at once (no probe, the lock
        held, a busy database): loop side, it never waits. ``changed`` is read with
        the value it belongs to, so a bump is never missed.
        """
        probe = self._probe
        if probe is None or not self._probe_lock.acquire(blocking=False):
            return None
        try:
            published, changed = self.published, self.changed
            if published is None:
                return None
            row = probe.execute("PRAGMA data_version").fetchone()
        except sqlite3.Error:
            return None
        finally:
            self._probe_lock.release()
        return changed if row is not None and row[0] == published else None

    async def set_trace_callback(self, callback: Callable[[str], object] | None) -> None:
        """Install a ``sqlite3`` trace callback (it runs on the database thread)."""
        await self.call(lambda conn: conn.set_trace_callback(callback))

    async def close(self) -> None:
        """Run what is queued, close the connection, end the thread. Idempotent."""
        stop = _Stop()
        with self._cond:
            if self._stopping:
                return
            self._stopping = True
            self._queue.append(stop)
            self._cond.notify()
        await stop.future

    # -- database thread ----------------------------------------------------------------

    def _main(self) -> None:
        first = self._queue.popleft()
        try:
            self._conn = self._connect()
        except BaseException as exc:
            with self._cond:
                self._stopping = True
                pending, self._queue = list(self._queue), deque()
            closed = StorageError("the session store is closed")
            _deliver([(first.future, None, exc)] + [(r.future, None, closed) for r in pending])
            return
        conn = self._conn
        self._open_probe(conn)
        _deliver([(first.future, None, None)])
        while True:
            batch: list[_Body] = []
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                head = self._queue.popleft()
                if isinstance(head, _Body):
                    batch.append(head)
                    while self._queue and len(batch) < MAX_BATCH:
                        following = self._queue[0]
                        if not isinstance(following, _Body):
                            break
                        self._queue.popleft()
                        batch.append(following)
            if batch:
                self._run_batch(conn, batch)
            elif isinstance(head, Interactive):
                self._run_interactive(conn, head)
            elif isinstance(head, _Call):
                _deliver([self._call(conn, head)])
            else:
                break
        error: BaseException | None = None
        self._close_probe()
        try:
            conn.close()
        except sqlite3.Error as exc:
            error = _storage_error(f"closing the database failed: {exc}", exc)
        _deliver([(head.future, None, error)])

    def _call(self, conn: sqlite3.Connection, call: _Call) -> _Outcome:
        try:
            outcome: _Outcome = (call.future, call.fn(conn), None)
        except BaseException as exc:
            outcome = (call.future, None, exc)
        if call.session is None and not conn.in_transaction:
            self._publish(conn, False)
        return outcome

    def _commit(self, conn: sqlite3.Connection, touched: bool = False) -> None:
        conn.execute("COMMIT")
        self.commits += 1
        self._publish(conn, touched)

    def _commit_interactive(self, conn: sqlite3.Connection, session: Interactive) -> None:
        self._commit(conn, session.touched)

    def _open_probe(self, conn: sqlite3.Connection) -> None:
        if self._probe_connect is None:
            return
        try:
            self._probe = self._probe_connect()
        except (sqlite3.Error, OSError):
            # Without it every cached load reads the version, as before.
            logger.warning("cannot open the freshness probe connection", exc_info=True)
            return
        self._publish(conn, False)

    def _publish(self, conn: sqlite3.Connection, touched: bool) -> None:
        """Record the probe's ``data_version`` as of now (database thread)."""
        probe = self._probe
        if probe is None:
            return
        with self._probe_lock:
            # One step for the loop: it sees the bump and the new value together. Our
            # own connection's value moves only for other connections' commits, and it
            # is read after the probe's, so none can slip in between unnoticed.
            try:
                value = probe.execute("PRAGMA data_version").fetchone()[0]
                own = conn.execute("PRAGMA data_version").fetchone()[0]
            except sqlite3.Error:
                self.published = None  # the next publish starts over
                self.changed += 1
                return
            if touched or (self._own_version is not None and own != self._own_version):
                self.changed += 1
            self._own_version = own
            self.published = value

    def _close_probe(self) -> None:
        probe, self._probe = self._probe, None
        self.published = None
        if probe is not None:
            with self._probe_lock, contextlib.suppress(sqlite3.Error):
                probe.close()

    def _run_interactive(self, conn: sqlite3.Connection, session: Interactive) -> None:
        if conn.in_transaction:  # a failed rollback left one open
            _rollback(conn)
        try:
            conn.execute("BEGIN IMMEDIATE" if session.write else "BEGIN")
        except BaseException as exc:
            with self._cond:
                session.dead = True
                pending, session.calls = list(session.calls), deque()
            error = _storage_error(f"cannot start a transaction: {exc}", exc)
            ended = StorageError("this transaction has ended")
            _deliver(
                [(session.future, None, error)]
                + [(c.future, None, None if c.ends == _ENDS_ALWAYS else ended) for c in pending]
            )
            return
        _deliver([(session.future, None, None)])
        while True:
            with self._cond:
                while not session.calls:
                    self._cond.wait()
                call = session.calls.popleft()
            outcome = self._call(conn, call)
            _deliver([outcome])
            if call.ends == _ENDS_ALWAYS or (call.ends and outcome[2] is None):
                with self._cond:
                    session.dead = True
                return

    def _run_batch(self, conn: sqlite3.Connection, batch: list[_Body]) -> None:
        if conn.in_transaction:
            _rollback(conn)
        outcomes: list[_Outcome] = []
        touched = [False]
        try:
            conn.execute("BEGIN IMMEDIATE" if any(r.write for r in batch) else "BEGIN")
        except sqlite3.Error as exc:
            _deliver(
                [
                    (r.future, None, _storage_error(f"cannot start a transaction: {exc}", exc))
                    for r in batch
                ]
            )
            return
        try:
            if len(batch) == 1:  # alone: the transaction itself isolates it
                outcomes.append(_drive(conn, batch[0], touched))
                if outcomes[0][2] is not None:
                    _rollback(conn)
                    _deliver(outcomes)
                    return
            else:
                for request in batch:
                    conn.execute("SAVEPOINT chatflow_body")
                    outcome = _drive(conn, request, touched)
                    if outcome[2] is not None:
                        conn.execute("ROLLBACK TO chatflow_body")
                    conn.execute("RELEASE chatflow_body")
                    outcomes.append(outcome)
            self._commit(conn, touched[0])
        except BaseException as exc:
            # COMMIT (or a savepoint) failed: nothing of this batch is durable.
            _rollback(conn)
            if isinstance(exc, sqlite3.Error):
                described = f"commit failed: {exc}"
            else:
                described = f"the batch failed: {exc!r}"
            outcomes = [
                (r.future, None, _storage_error(described, exc))
                if i >= len(outcomes) or outcomes[i][2] is None
                else outcomes[i]
                for i, r in enumerate(batch)
            ]
        _deliver(outcomes)


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        logger.warning("rolling back a session-store transaction failed", exc_info=True)


def _drive(conn: sqlite3.Connection, request: _Body, touched: list[bool]) -> _Outcome:
    """Run ``request``'s body to its end in one ``send``; a suspension is an error.

    ``touched[0]`` becomes True if it wrote to the session tables unaccounted.
    """
    tx = SyncTransaction(conn, watch=not request.own)
    # The caller's loop counts as running here, so an await on it (an Event, a
    # sleep, I/O) yields a future that is caught below instead of a confusing
    # "no running event loop"; that future is never awaited.
    asyncio._set_running_loop(request.loop)
    try:
        coro = request.body(tx)
        try:
            yielded = coro.send(None)
        except StopIteration as stop:
            return (request.future, stop.value, None)
        except BaseException as exc:
            return (request.future, None, exc)
        with contextlib.suppress(BaseException):  # the error below says what matters
            coro.close()
        error = StorageError(
            f"a store.run() body suspended (it awaited {yielded!r}); a transaction body "
            "may await only its Transaction's methods"
        )
        return (request.future, None, error)
    finally:
        tx._active = False
        if tx.touched:
            touched[0] = True
        asyncio._set_running_loop(None)
