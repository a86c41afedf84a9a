"""Session leases on PostgreSQL: one turn per session across processes, no connection held.

A turn owns its session through a row of ``chatflow_session_leases`` (session
id, ``owner_instance``, ``generation``, ``expires_at``), taken by one short
statement and given back by another. Between the two, while the model thinks,
the turn holds no connection, so a process's running turns are limited by
``MAX_CONCURRENT_TURNS``, not by its pool, and nothing lives in a database
session between transactions (PgBouncer's transaction pooling works).

- **Take**: ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` the row is free or its
  lease has expired and no live waiter is queued for the session, bumping
  ``generation``. Turns of one process queue first on the in-process lock (the
  store's ``KeyedLocks``), so a process has at most one taker per session and
  its turns keep their arrival order.
- **Queue (FIFO across processes)**: a taker that gets no row back draws a
  ticket, a row of ``chatflow_session_waiters`` (an identity column, so tickets
  rise in the order they were drawn), and polls with backoff and jitter (no
  ``LISTEN``, which needs a session) by one statement that takes the lease
  only when no live ticket older than its own is queued for the session, and
  deletes the ticket in the same statement. So turns are served in the order they
  reach the database: a process's next turn of a session gets there when the one
  before it ends (only the head of the in-process queue takes or draws), never
  ahead of a ticket already drawn. A waiter that gives up (cancelled, failed)
  deletes its ticket. Tickets live as leases do: renewed with them, dead after
  ``lease_seconds`` unrenewed, swept at once by a takeover of their instance.
- **Renew**: every third of the lease one ``UPDATE`` pushes back the expiry of
  every lease this process holds (one statement per process, not per turn),
  and one more that of its tickets while it has any.
- **Give back**: ``UPDATE`` to free, matching owner and generation.
- **Fence**: the turn's save (tx 2) reads the row ``FOR SHARE`` with this
  owner and generation in the same transaction (``fence_sql``); a turn whose
  lease was taken over (its process froze past the lease) fails to save and
  writes nothing. The share lock keeps a taker out until that commit ends.

The owner is the process's instance id, the token ``owner_instance`` of issue
#37: a dead process's sessions go to the others once its leases expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final

from bot.core.ids import log_session_id

__all__ = [
    "DEFAULT_SESSION_LEASE_SECONDS",
    "LEASE_COMPONENT",
    "LEASE_MIGRATIONS",
    "SessionLeases",
]

logger = logging.getLogger(__name__)

DEFAULT_SESSION_LEASE_SECONDS: Final = 15.0
"""A session lease's length; renewed every third of it while held."""
LEASE_COMPONENT: Final = "session_leases"
"""The lease table's row in ``chatflow_schema_versions``."""
LEASE_MIGRATIONS: Final = {
    1: (
        """CREATE TABLE IF NOT EXISTS chatflow_session_leases (
            session_id TEXT PRIMARY KEY NOT NULL,
            owner_instance TEXT NOT NULL,
            generation BIGINT NOT NULL,
            expires_at TIMESTAMPTZ NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS chatflow_session_leases_owner "
        "ON chatflow_session_leases (owner_instance)",
    ),
    2: (
        """CREATE TABLE IF NOT EXISTS chatflow_session_waiters (
            ticket BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            session_id TEXT NOT NULL,
            owner_instance TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
            expires_at TIMESTAMPTZ NOT NULL
        )""",
        "CREATE INDEX IF NOT EXISTS chatflow_session_waiters_session "
        "ON chatflow_session_waiters (session_id, ticket)",
        "CREATE INDEX IF NOT EXISTS chatflow_session_waiters_owner "
        "ON chatflow_session_waiters (owner_instance)",
    ),
}
"""PostgreSQL DDL: the lease table and the waiters' tickets (SQLite keeps its
in-process locks)."""

_ON_CONFLICT: Final = (
    "ON CONFLICT (session_id) DO UPDATE SET owner_instance = excluded.owner_instance, "
    "generation = l.generation + 1, expires_at = excluded.expires_at "
    "WHERE l.owner_instance = '' OR l.expires_at < clock_timestamp() "
    "RETURNING generation"
)
_TAKE_SQL: Final = (
    # The fast path: free (or expired) and nobody queued.
    "INSERT INTO chatflow_session_leases AS l "
    "(session_id, owner_instance, generation, expires_at) "
    "SELECT $1, $2, 1, clock_timestamp() + $3 * interval '1 second' "
    "WHERE NOT EXISTS (SELECT 1 FROM chatflow_session_waiters "
    "WHERE session_id = $1 AND expires_at > clock_timestamp()) " + _ON_CONFLICT
)
_TICKET_SQL: Final = (
    "INSERT INTO chatflow_session_waiters (session_id, owner_instance, expires_at) "
    "VALUES ($1, $2, clock_timestamp() + $3 * interval '1 second') RETURNING ticket"
)
_TAKE_IN_TURN_SQL: Final = (
    # Take only when no live ticket older than ticket $4 is queued for the session; the
    # ticket goes with the take. A ticket swept meanwhile (its instance was taken over
    # while still alive) keeps its place all the same: nothing waits on it.
    "WITH taken AS (INSERT INTO chatflow_session_leases AS l "
    "(session_id, owner_instance, generation, expires_at) "
    "SELECT $1, $2, 1, clock_timestamp() + $3 * interval '1 second' "
    "WHERE NOT EXISTS (SELECT 1 FROM chatflow_session_waiters WHERE session_id = $1 "
    "AND ticket < $4 AND expires_at > clock_timestamp()) " + _ON_CONFLICT + "), "
    "served AS (DELETE FROM chatflow_session_waiters "
    "WHERE ticket = $4 AND EXISTS (SELECT 1 FROM taken)) "
    "SELECT generation FROM taken"
)
_DROP_TICKET_SQL: Final = (
    # One taker per session in a process (the in-process lock): (session, owner) is
    # its ticket, even one whose number never came back.
    "DELETE FROM chatflow_session_waiters WHERE session_id = $1 AND owner_instance = $2"
)
_RENEW_TICKETS_SQL: Final = (
    "UPDATE chatflow_session_waiters "
    "SET expires_at = clock_timestamp() + $2 * interval '1 second' "
    "WHERE owner_instance = $1 AND ticket = ANY($3::bigint[])"
)
_FREE_SQL: Final = (
    "UPDATE chatflow_session_leases SET owner_instance = '', expires_at = '-infinity' "
    "WHERE session_id = $1 AND owner_instance = $2 AND generation = $3"
)
_FREE_ANY_SQL: Final = (
    "UPDATE chatflow_session_leases SET owner_instance = '', expires_at = '-infinity' "
    "WHERE session_id = $1 AND owner_instance = $2"
)
_FREE_ALL_SQL: Final = (
    "UPDATE chatflow_session_leases SET owner_instance = '', expires_at = '-infinity' "
    "WHERE owner_instance = $1 AND session_id = ANY($2::text[])"
)
_RENEW_SQL: Final = (
    "UPDATE chatflow_session_leases "
    "SET expires_at = clock_timestamp() + $2 * interval '1 second' "
    "WHERE owner_instance = $1 AND session_id = ANY($3::text[])"
)
_FENCE_SQL: Final = (
    "SELECT 1 FROM chatflow_session_leases "
    "WHERE session_id = ? AND owner_instance = ? AND generation = ? FOR SHARE"
)
FIRST_WAIT_SECONDS: Final = 0.005
"""The first pause before asking again for a session another process holds."""
MAX_WAIT_SECONDS: Final = 0.2
"""The longest pause between two tries (the hand-over's worst added latency)."""

Run = Callable[..., Awaitable[Any]]
"""``run(sql, *args)``: one statement on a pooled connection, its first value back."""


class SessionLeases:
    """This process's session leases on one database (see the module's text)."""

    def __init__(self, owner: str, lease_seconds: float, run: Run) -> None:
        if not owner:
            raise ValueError("a lease owner must not be empty")
        if lease_seconds <= 0:
            raise ValueError("lease_seconds must be positive")
        self.owner = owner
        self.lease_seconds = lease_seconds
        self._run = run
        self._held: dict[str, int] = {}
        self._tickets: dict[str, int] = {}
        # The leases the current task holds (a turn and the tasks it starts): its saves
        # are fenced by them. One variable per store, so two stores never mix.
        self._mine: ContextVar[dict[str, int] | None] = ContextVar(
            f"chatflow_session_leases_{id(self)}", default=None
        )
        self._renewer: asyncio.Task[None] | None = None
        self.waiting = 0
        """Turns waiting for a session another process holds (a gauge)."""

    def __len__(self) -> int:
        return len(self._held)

    @property
    def queued(self) -> int:
        """Sessions this process waits for with a ticket drawn."""
        return len(self._tickets)

    async def take(self, session_id: str) -> int:
        """Wait until this process holds ``session_id``'s lease; its generation.

        The caller holds the in-process lock of the session: one taker per session here.
        First come, first served across processes: a taker that finds the session held
        (or others queued) draws a ticket and is served in ticket order.
        """
        generation = await self._try(_TAKE_SQL, session_id, self.owner, self.lease_seconds)
        if generation is not None:
            return self._took(session_id, generation)
        self.waiting += 1
        try:
            ticket = await self._draw(session_id)
            delay = FIRST_WAIT_SECONDS
            while True:
                generation = await self._try(
                    _TAKE_IN_TURN_SQL, session_id, self.owner, self.lease_seconds, ticket
                )
                if generation is not None:
                    self._tickets.pop(session_id, None)  # deleted by the take
                    return self._took(session_id, generation)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, MAX_WAIT_SECONDS)
        except BaseException:
            if self._tickets.pop(session_id, None) is not None:
                await self._cleanup(_DROP_TICKET_SQL, session_id)
            raise
        finally:
            self.waiting -= 1

    async def _try(self, sql: str, session_id: str, *args: Any) -> Any:
        try:
            return await self._run(sql, session_id, *args)
        except BaseException:
            # Cancelled or cut mid-statement: the row may be ours now. Free it before
            # the in-process lock goes (the next turn here would take it again, and a
            # late free of "any generation" would free that one).
            await self._free_any(session_id)
            raise

    async def _draw(self, session_id: str) -> int:
        # Marked before the statement: cut mid-way, the ticket may exist all the same.
        self._tickets[session_id] = 0
        ticket = int(await self._run(_TICKET_SQL, session_id, self.owner, self.lease_seconds))
        self._tickets[session_id] = ticket
        self._start_renewing()
        return ticket

    def _took(self, session_id: str, generation: Any) -> int:
        self._held[session_id] = int(generation)
        self._start_renewing()
        return int(generation)

    async def _free_any(self, session_id: str) -> None:
        await self._cleanup(_FREE_ANY_SQL, session_id)

    async def _cleanup(self, sql: str, session_id: str) -> None:
        """Run ``sql`` for this owner and session to its end, even when cancelled."""
        freeing = asyncio.ensure_future(self._run(sql, session_id, self.owner))
        while not freeing.done():  # bounded by the statement timeout
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({freeing})
        if not freeing.cancelled() and freeing.exception() is not None:
            logger.info(
                "a session lease or ticket was left to expire (%s)",
                type(freeing.exception()).__name__,
            )

    def enter(self, session_id: str, generation: int) -> object:
        """Mark the current task as holding the lease (its saves are fenced by it)."""
        mine = dict(self._mine.get() or {})
        mine[session_id] = generation
        return self._mine.set(mine)

    def leave(self, token: object) -> None:
        """Undo ``enter``."""
        self._mine.reset(token)  # type: ignore[arg-type]

    async def give_back(self, session_id: str, generation: int) -> None:
        """Free the lease (shielded: a cancelled turn still frees it)."""
        self._held.pop(session_id, None)
        try:
            await asyncio.shield(self._run(_FREE_SQL, session_id, self.owner, generation))
        except (asyncio.CancelledError, Exception) as exc:
            # The row expires on its own: it is no longer renewed.
            logger.warning(
                "could not free the lease of session %s (%s); it expires in %g s",
                log_session_id(session_id),
                type(exc).__name__,
                self.lease_seconds,
            )
            if isinstance(exc, asyncio.CancelledError):
                raise

    def fence(self, session_id: str) -> tuple[str, tuple[Any, ...]] | None:
        """The statement a save of ``session_id`` runs in its transaction, or ``None``
        when the current task holds no lease on it. No row back: the lease was lost."""
        mine = self._mine.get()
        if mine is None or session_id not in mine:
            return None
        return _FENCE_SQL, (session_id, self.owner, mine[session_id])

    def _start_renewing(self) -> None:
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_forever())

    async def _renew_forever(self) -> None:
        while self._held or self._tickets:
            await asyncio.sleep(self.lease_seconds / 3)
            held = list(self._held)
            tickets = [t for t in self._tickets.values() if t]
            if not held and not tickets:
                break
            try:
                if held:
                    await self._run(_RENEW_SQL, self.owner, self.lease_seconds, held)
                if tickets:
                    await self._run(_RENEW_TICKETS_SQL, self.owner, self.lease_seconds, tickets)
            except Exception as exc:  # the saves are fenced; the next tick tries again
                logger.warning(
                    "could not renew %d session leases and %d tickets (%s)",
                    len(held),
                    len(tickets),
                    exc,
                )

    async def close(self) -> None:
        """Stop renewing and free the leases still held (a clean stop); a failure
        leaves them to expire."""
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
        held, self._held = list(self._held), {}
        if held:
            try:
                await self._run(_FREE_ALL_SQL, self.owner, held)
            except Exception as exc:
                logger.warning("%d session leases left to expire (%s)", len(held), exc)
