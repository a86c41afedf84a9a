"""The SQLite store's database thread: one ``sqlite3`` connection, bodies run in one go.

``SQLiteWriter`` owns the connection and a FIFO of requests. A *body*
(``SQLiteSessionStore.run``) is driven on the thread to its end in one call:
its ``Transaction`` methods never suspend. Bodies queued together share one
transaction (group commit, no timer): ``BEGIN IMMEDIATE``, a ``SAVEPOINT`` per
body (a failing body rolls back only its own), one ``COMMIT``; every caller's
future resolves after that COMMIT, with one loop wake-up per batch. An
*interactive* transaction (``transaction()`` blocks, migrations) holds the
thread exclusively and runs one statement per hop, as aiosqlite did.
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


class SyncTransaction:
    """The ``Transaction`` of a body: ``async`` methods that call sqlite3 and never suspend."""

    __slots__ = ("_active", "_conn")

    dialect: Final = "sqlite"
    """Statements are SQLite SQL."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._active = True

    def _connection(self) -> sqlite3.Connection:
        if not self._active:
            raise StorageError("this transaction has ended")
        return self._conn

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1 if none apply)."""
        return run_execute(self._connection(), sql, params)

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter set."""
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
    __slots__ = ("body", "write")

    def __init__(self, body: Body, write: bool) -> None:
        super().__init__()
        self.body = body
        self.write = write


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

    __slots__ = ("calls", "dead", "hop", "write")

    def __init__(self, write: bool) -> None:
        super().__init__()
        self.write = write
        self.calls: deque[_Call] = deque()
        self.dead = False
        self.hop: asyncio.Future[Any] | None = None


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

    def __init__(self, connect: Callable[[], sqlite3.Connection], name: str) -> None:
        self._connect = connect
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

    def submit(self, body: Body, write: bool) -> asyncio.Future[Any]:
        """Queue ``body`` to be driven on the thread; its future resolves after its COMMIT."""
        return self._hop(_Body(body, write))

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
        await self.call_in(session, self._commit, _ENDS_ON_SUCCESS)

    async def rollback_in(self, session: Interactive) -> None:
        """Roll ``session`` back and end it."""
        await self.call_in(session, _rollback, _ENDS_ALWAYS)

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
        _deliver([(first.future, None, None)])
        conn = self._conn
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
        try:
            conn.close()
        except sqlite3.Error as exc:
            error = _storage_error(f"closing the database failed: {exc}", exc)
        _deliver([(head.future, None, error)])

    @staticmethod
    def _call(conn: sqlite3.Connection, call: _Call) -> _Outcome:
        try:
            return (call.future, call.fn(conn), None)
        except BaseException as exc:
            return (call.future, None, exc)

    def _commit(self, conn: sqlite3.Connection) -> None:
        conn.execute("COMMIT")
        self.commits += 1

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
                outcomes.append(_drive(conn, batch[0]))
                if outcomes[0][2] is not None:
                    _rollback(conn)
                    _deliver(outcomes)
                    return
            else:
                for request in batch:
                    conn.execute("SAVEPOINT chatflow_body")
                    outcome = _drive(conn, request)
                    if outcome[2] is not None:
                        conn.execute("ROLLBACK TO chatflow_body")
                    conn.execute("RELEASE chatflow_body")
                    outcomes.append(outcome)
            self._commit(conn)
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


def _drive(conn: sqlite3.Connection, request: _Body) -> _Outcome:
    """Run ``request``'s body to its end in one ``send``; a suspension is an error."""
    tx = SyncTransaction(conn)
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
        asyncio._set_running_loop(None)
