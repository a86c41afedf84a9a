"""Which process owns a row, and whether it is still alive: pids on one host, leases on PostgreSQL.

Inbox and ledger rows carry their owner. When the owner dies, another process
takes its work over; the question is how to tell that it died.

- SQLite (one host; ``run`` holds an ``flock`` per data directory): the owner is
  ``(pid, instance id, start time)`` and ``is_owner_alive`` asks the kernel.
- PostgreSQL (any number of processes on any number of hosts): every gateway
  process registers in ``chatflow_instances`` with a lease and renews it every
  ``lease / 3`` seconds. An owner is alive iff its lease has not expired.
  Lease times are the database server's clock, so hosts whose clocks disagree
  still agree on who is alive.

A process that stalls past its lease (or loses the database for that long)
renews it when it can and carries on: whatever another process took over in
between is fenced (its inbox rows and obligations changed owner, and the
guarded updates of the stalled process no longer match them), so the work is
not done twice. Meanwhile it fences itself: ``holds_lease`` is false from the
moment its lease may have expired (its own clock, counted from the start of
the last renewal that committed), and the gateway neither sends nor claims
until a renewal succeeds. After an outage, ``may_take_over`` stays false for
a grace period (a whole lease after the first renewal that worked again), so
the processes that were cut off with it renew their own leases before anyone
takes their work: a shared outage causes no takeover storm. Before taking an
expired process's work, ``end_backends_of_expired`` ends that process's
database sessions (``pg_terminate_backend`` by ``application_name``), so the
locks and transactions a frozen process holds are freed at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional
from bot.core.stores.pgconnect import APPLICATION_PREFIX
from bot.errors import StorageError

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "InstanceInfo",
    "InstanceRegistry",
    "Owner",
    "OwnerLiveness",
    "from_epoch",
    "is_owner_alive",
    "lease_liveness",
    "to_epoch",
]

logger = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS: Final = 15.0
"""How long a registration stays valid without renewal (renewed every third of it)."""
PRUNE_AFTER: Final = timedelta(hours=1)
"""Registrations expired for longer than this are deleted."""

_COMPONENT: Final = "instances"
_TABLE: Final = "chatflow_instances"
_NOW: Final = "CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION)"
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {_TABLE} ("
        "instance_id TEXT PRIMARY KEY NOT NULL, "
        "pid INTEGER NOT NULL, "
        "host TEXT NOT NULL, "
        "host_key TEXT NOT NULL, "
        "started_ticks INTEGER, "
        "started_at REAL NOT NULL, "
        "renewed_at REAL NOT NULL, "
        "lease_expires_at REAL NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {_TABLE}_lease ON {_TABLE} (lease_expires_at)",
    ),
}


def _monotonic() -> float:
    return time.monotonic()


# -- row times ----------------------------------------------------------------
# Inbox, ledger and registry rows store times as Unix seconds (REAL / DOUBLE
# PRECISION), so both dialects compare them as plain numbers.


def to_epoch(moment: datetime) -> float:
    """Unix seconds of ``moment``; a naive ``moment`` is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def from_epoch(seconds: float) -> datetime:
    """The UTC ``datetime`` of a stored Unix time."""
    return datetime.fromtimestamp(float(seconds), UTC)


# -- owners -------------------------------------------------------------------


def _process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (Linux ``/proc``), else ``None``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        # The command name (field 2) may hold spaces and parentheses: split after it.
        fields = data[data.rindex(b")") + 2 :].split()
        return int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class Owner:
    """Which process owns a ledger or inbox row."""

    pid: int
    """Operating-system process id."""
    instance_id: str
    """Random id (uuid4 hex) made once per process: tells a restarted process from its
    predecessor when both got the same pid; on PostgreSQL, the id its lease is kept under."""
    started: int | None = None
    """Process start time in clock ticks since boot (Linux), to detect a pid reused by
    another program; ``None`` where unknown."""

    @classmethod
    def current(cls) -> Owner:
        """This process's owner identity (one per process; renewed after a fork)."""
        global _current_owner
        pid = os.getpid()
        if _current_owner is None or _current_owner.pid != pid:
            _current_owner = cls(pid, uuid.uuid4().hex, _process_start_ticks(pid))
        return _current_owner


_current_owner: Owner | None = None

OwnerLiveness = Callable[[Owner], Awaitable[bool]]
"""Tells whether the process owning a row may still be working on it."""


def is_owner_alive(owner: Owner) -> bool:
    """Whether the process that owns a row may still be working on it (same host only).

    Dead when: the pid is not positive; the pid is ours but the instance id is
    not (we are a restarted process that got the same pid); no process has
    that pid; or (Linux) the process with that pid started at another time. On
    systems without POSIX signals every other pid counts as alive (rows then
    wait for the ledger's ``STALE_AFTER``).
    """
    if owner.pid <= 0:
        return False
    me = Owner.current()
    if owner.pid == me.pid:
        return owner.instance_id == me.instance_id
    if os.name != "posix":
        return True
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # the pid exists but belongs to another user
    except OSError:
        return True
    if owner.started is not None:
        started = _process_start_ticks(owner.pid)
        if started is not None and started != owner.started:
            return False
    return True


async def _lease_valid_in(tx: Transaction, instance_id: str) -> bool:
    row = await tx.fetchone(
        f"SELECT 1 FROM {_TABLE} WHERE instance_id = ? AND lease_expires_at > {_NOW}",
        (instance_id,),
    )
    return row is not None


def lease_liveness(store: TransactionalStore) -> OwnerLiveness:
    """An ``OwnerLiveness`` for PostgreSQL: alive iff the owner's lease has not expired.

    Needs the registry table (``InstanceRegistry.open`` or ``ensure_instances_schema``).
    """

    async def alive(owner: Owner) -> bool:
        if not owner.instance_id:
            return False
        async with store.transaction() as tx:
            return await _lease_valid_in(tx, owner.instance_id)

    return alive


async def ensure_instances_schema(tx: Transaction) -> None:
    """Create or migrate the registry table inside ``tx``."""
    await ensure_schema(tx, _COMPONENT, _MIGRATIONS)


def _host_key() -> str:
    """Same value for processes whose pids can be checked against each other, else ``""``.

    Host name, boot id and pid namespace: two containers on one machine have
    different pid namespaces, so neither reads the other's pids.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            boot_id = fh.read().strip()
        pid_namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    raw = f"{socket.gethostname()}|{boot_id}|{pid_namespace}"
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:24]


# -- the registry ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """One registered gateway process."""

    instance_id: str
    """Its ``Owner.instance_id``."""
    pid: int
    """Its process id (on its own host)."""
    host: str
    """Its host name."""
    started_at: datetime
    """When it registered (database clock, UTC)."""
    lease_expires_at: datetime
    """When its lease runs out unless renewed (database clock, UTC)."""


class InstanceRegistry:
    """This process's lease in ``chatflow_instances`` and a view of the other live processes.

    PostgreSQL only. ``start()`` registers and renews every ``renew_every``
    seconds until ``stop()``, which deletes the registration so the others take
    over at once whatever was left.
    """

    def __init__(
        self,
        store: TransactionalStore,
        *,
        owner: Owner | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        renew_every: float | None = None,
    ) -> None:
        if require_transactional(store, "the instance registry").dialect != "postgres":
            raise ValueError("the instance registry needs the PostgreSQL store")
        if not lease_seconds > 0:
            raise ValueError("lease_seconds must be positive")
        self._store = store
        self._owner = owner or Owner.current()
        self._lease = float(lease_seconds)
        # The store's session leases (issue #38) carry this process's token and length,
        # so a takeover frees them with the rest of its work. (Duck-typed: only the
        # PostgreSQL store has them, and this module does not load its driver.)
        bind = getattr(store, "bind_lease_owner", None)
        if bind is not None:
            bind(self._owner.instance_id, self._lease)
        self._renew_every = float(renew_every) if renew_every else self._lease / 3
        if not 0 < self._renew_every < self._lease:
            raise ValueError("renew_every must be positive and shorter than the lease")
        self._host = socket.gethostname()
        self._host_key: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._registered = False
        # Self-fencing (monotonic clock): the lease is surely ours until _valid_until;
        # _healthy_since is when renewals started working again (None while failing).
        self._valid_until = 0.0
        self._healthy_since: float | None = None
        self._renewed = asyncio.Event()
        self.grace_seconds = self._lease
        """Renewals must have worked this long before this process takes others' work."""
        self._last_renewed_at: float | None = None  # the database's stamp of our last renewal
        self.lost_commits = 0
        """Times the database was found to have lost an acknowledged renewal."""

    @property
    def owner(self) -> Owner:
        """The owner identity this registry keeps alive."""
        return self._owner

    @property
    def instance_id(self) -> str:
        """This process's instance id."""
        return self._owner.instance_id

    @property
    def lease_seconds(self) -> float:
        """Lease length."""
        return self._lease

    @property
    def check_every(self) -> float:
        """How often a gateway should look for dead owners' work (as often as it renews)."""
        return self._renew_every

    async def open(self) -> None:
        """Create or migrate the registry table; idempotent."""
        async with self._store.transaction() as tx:
            await ensure_instances_schema(tx)

    async def register(self) -> None:
        """Take the lease (creating the table if needed), after reaping dead local predecessors.

        A registration from this host and pid namespace whose process is gone
        (checked as on SQLite) is deleted, so a process restarted after a crash
        takes its predecessor's work over at once instead of after the lease.
        """
        if self._host_key is None:
            self._host_key = await asyncio.to_thread(_host_key)
        host_key = self._host_key
        me = self._owner
        began = _monotonic()
        async with self._store.transaction() as tx:
            await ensure_instances_schema(tx)
            if host_key:
                rows = await tx.fetchall(
                    f"SELECT instance_id, pid, started_ticks FROM {_TABLE} "
                    "WHERE host_key = ? AND instance_id != ?",
                    (host_key, me.instance_id),
                )
                for instance_id, pid, ticks in rows:
                    owner = Owner(int(pid), str(instance_id), None if ticks is None else int(ticks))
                    if await asyncio.to_thread(is_owner_alive, owner):
                        continue
                    await tx.execute(
                        f"DELETE FROM {_TABLE} WHERE instance_id = ? AND pid = ?",
                        (owner.instance_id, owner.pid),
                    )
                    logger.info("instance %s of this host is gone; its work is free", instance_id)
            stamp = await tx.fetchone(
                f"INSERT INTO {_TABLE} (instance_id, pid, host, host_key, started_ticks, "
                f"started_at, renewed_at, lease_expires_at) "
                f"VALUES (?, ?, ?, ?, ?, {_NOW}, {_NOW}, {_NOW} + ?) "
                "ON CONFLICT (instance_id) DO UPDATE SET "
                "renewed_at = excluded.renewed_at, lease_expires_at = excluded.lease_expires_at "
                "RETURNING renewed_at",
                (me.instance_id, me.pid, self._host, host_key, me.started, self._lease),
            )
        if stamp is not None:
            self._last_renewed_at = float(stamp[0])
        self._registered = True
        self._note_renewed(began)
        logger.info(
            "registered instance %s (lease %.0f s, renewed every %.1f s)",
            me.instance_id,
            self._lease,
            self._renew_every,
        )

    async def renew(self) -> bool:
        """Extend the lease; ``False`` if it had already expired (it is renewed all the same)."""
        me = self._owner
        began = _monotonic()
        async with self._store.transaction() as tx:
            before = await tx.fetchone(
                f"SELECT renewed_at, lease_expires_at > {_NOW} FROM {_TABLE} WHERE instance_id = ?",
                (me.instance_id,),
            )
            valid = before is not None and bool(before[1])
            after = await tx.fetchone(
                f"UPDATE {_TABLE} SET renewed_at = {_NOW}, lease_expires_at = {_NOW} + ? "
                "WHERE instance_id = ? RETURNING renewed_at",
                (self._lease, me.instance_id),
            )
        self._check_history(None if before is None else float(before[0]))
        if after is None:
            await self.register()
        else:
            self._last_renewed_at = float(after[0])
            self._note_renewed(began)
        if not valid:
            logger.warning(
                "instance %s renewed a lease that had expired (database unreachable or the "
                "process stalled); other processes may have taken over its work, which it will "
                "not repeat",
                me.instance_id,
            )
        return valid

    def _check_history(self, stored: float | None) -> None:
        """Say so when the database forgot a renewal it had acknowledged: a failover to an
        asynchronous standby lost the last commits (DESIGN: report what cannot be undone)."""
        last = self._last_renewed_at
        if last is None or (stored is not None and stored >= last):
            return
        self.lost_commits += 1
        logger.error(
            "the database lost acknowledged commits: this process's lease renewal of %.1f s "
            "ago is gone (a failover to a standby that had not received it). Messages "
            "accepted and replies or scheduled messages recorded in that window may be "
            "lost or sent again unmarked; use a synchronous standby to rule this out",
            max(0.0, time.time() - last),
        )

    # -- self-fencing ------------------------------------------------------------------

    def _note_renewed(self, began: float) -> None:
        """A renewal that started at ``began`` committed: the server set the expiry to its
        own now + lease, and its now was no earlier than ``began``."""
        self._valid_until = max(self._valid_until, began + self._lease - self._margin)
        if self._healthy_since is None:
            self._healthy_since = began
        self._renewed.set()
        self._renewed = asyncio.Event()

    def _note_failed(self) -> None:
        self._healthy_since = None

    @property
    def _margin(self) -> float:
        """Kept off the end of the lease: clocks drift, and a send takes a moment."""
        return min(self._renew_every / 2, 2.0)

    def holds_lease(self) -> bool:
        """Whether this process surely still holds its lease (its own clock): if not, it
        must not send or claim, since another process may be taking its work over."""
        return _monotonic() < self._valid_until

    async def wait_for_lease(self, within: float) -> bool:
        """Wait until ``holds_lease`` (a renewal commits); ``False`` after ``within`` s."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while not self.holds_lease():
            left = deadline - loop.time()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._renewed.wait(), left)
        return True

    def may_take_over(self) -> bool:
        """Whether this process may take expired processes' work now: it holds its lease,
        and its renewals have worked for ``grace_seconds`` (after an outage the others
        renew theirs first)."""
        healthy = self._healthy_since
        return (
            self.holds_lease()
            and healthy is not None
            and _monotonic() - healthy >= self.grace_seconds
        )

    async def end_backends_of_expired(self) -> int:
        """End the database sessions of processes whose lease expired (their locks and
        open transactions go with them) and free their session leases; returns how many
        sessions were ended. Needs the right to signal
        the role's backends (the same role, or ``pg_signal_backend``)."""
        async with self._store.transaction() as tx:
            rows = await tx.fetchall(
                "SELECT pg_terminate_backend(a.pid) FROM pg_stat_activity a "
                f"JOIN {_TABLE} i ON a.application_name = ? || i.instance_id "
                f"WHERE i.lease_expires_at <= {_NOW} AND i.instance_id != ? "
                "AND a.pid != pg_backend_pid()",
                (APPLICATION_PREFIX, self.instance_id),
            )
        async with self._store.transaction() as tx:
            # Their conversations too (issue #38): a session lease lives no longer than
            # its owner's instance lease, even if a half-frozen owner still renews it.
            # Their saves are fenced by the lease's generation.
            freed = await tx.execute(
                "UPDATE chatflow_session_leases SET owner_instance = '', "
                "expires_at = '-infinity' WHERE owner_instance IN ("
                f"SELECT instance_id FROM {_TABLE} WHERE lease_expires_at <= {_NOW} "
                "AND instance_id != ?)",
                (self.instance_id,),
            )
            # And their places in the sessions' queues: the turns behind them go on.
            await tx.execute(
                "DELETE FROM chatflow_session_waiters WHERE owner_instance IN ("
                f"SELECT instance_id FROM {_TABLE} WHERE lease_expires_at <= {_NOW} "
                "AND instance_id != ?)",
                (self.instance_id,),
            )
        ended = sum(1 for (done,) in rows if done)
        if ended:
            logger.warning("ended %d database session(s) of processes whose lease expired", ended)
        if freed:
            logger.warning("freed %d conversation(s) of processes whose lease expired", freed)
        return ended

    async def start(self) -> None:
        """Register and keep the lease renewed in the background until ``stop``."""
        await self.register()
        if self._task is None:
            self._task = asyncio.create_task(self._renew_loop(), name="chatflow-lease")

    async def _renew_loop(self) -> None:
        failures = 0
        while True:
            await asyncio.sleep(self._renew_every)
            try:
                # Bounded: a renewal stuck on a silent database is no renewal.
                async with asyncio.timeout(self._lease / 2):
                    await self.renew()
            except (StorageError, TimeoutError) as exc:
                self._note_failed()
                failures += 1
                # Every failure matters once the lease is at risk; before that, the first.
                if failures == 1 or failures * self._renew_every >= self._lease:
                    logger.warning("could not renew the instance lease (%s); retrying", exc)
            except Exception:
                self._note_failed()
                failures += 1
                logger.exception("renewing the instance lease failed; retrying")
            else:
                failures = 0

    async def stop(self) -> None:
        """Stop renewing and delete the registration (best effort); idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not self._registered:
            return
        self._registered = False
        try:
            async with self._store.transaction() as tx:
                await tx.execute(
                    f"DELETE FROM {_TABLE} WHERE instance_id = ?", (self._owner.instance_id,)
                )
        except StorageError as exc:
            logger.warning("could not remove the instance registration (%s); it expires", exc)

    async def live(self) -> list[InstanceInfo]:
        """Registered processes whose lease is valid, this one included, oldest first."""
        async with self._store.transaction() as tx:
            rows = await tx.fetchall(
                f"SELECT instance_id, pid, host, started_at, lease_expires_at FROM {_TABLE} "
                f"WHERE lease_expires_at > {_NOW} ORDER BY started_at, instance_id",
                (),
            )
        return [
            InstanceInfo(str(iid), int(pid), str(host), from_epoch(started), from_epoch(expires))
            for iid, pid, host, started, expires in rows
        ]

    async def live_ids(self) -> set[str]:
        """Instance ids of the live processes (this one always included)."""
        return {info.instance_id for info in await self.live()} | {self.instance_id}

    async def others(self) -> list[InstanceInfo]:
        """Live processes other than this one."""
        return [info for info in await self.live() if info.instance_id != self.instance_id]

    async def is_alive(self, owner: Owner) -> bool:
        """``OwnerLiveness`` by lease (this process is always alive to itself)."""
        if owner.instance_id == self.instance_id:
            return True
        if not owner.instance_id:
            return False
        async with self._store.transaction() as tx:
            return await _lease_valid_in(tx, owner.instance_id)

    async def prune(self, older_than: timedelta = PRUNE_AFTER) -> int:
        """Delete registrations expired for more than ``older_than``; return how many."""
        async with self._store.transaction() as tx:
            deleted = await tx.execute(
                f"DELETE FROM {_TABLE} WHERE lease_expires_at < {_NOW} - ?",
                (older_than.total_seconds(),),
            )
        return max(deleted, 0)
