"""The ledger's recovery: claim owed rows for a (re)send, abandon hopeless ones, prune old ones.

A process that dies mid-send leaves rows whose owner is dead;
``sweep_recoverable`` claims them (one guarded UPDATE per row, so of two racing
processes only one wins a row) and hands them back for a resend, with
``needs_marker`` when the earlier send may have arrived. ``due_retries`` does
the same for this process's own ``failed`` rows once their retry is due.
Rows out of attempts or older than ``STALE_AFTER`` are abandoned on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from bot.core.sql import Transaction
from bot.gateway.instances import Owner, to_epoch
from bot.gateway.ledger.core import STORAGE_ERRORS, LedgerCore, logger
from bot.gateway.ledger.obligations import (
    COLUMNS,
    MAX_ATTEMPTS,
    NOBODY,
    RETENTION,
    SENT_TABLE,
    STALE_AFTER,
    TABLE,
    Obligation,
    StoredRow,
    clip_error,
    decode_row,
)

__all__ = ["Recovery"]

_BATCH = 100
_REMEMBER_CUT_SEND = (
    "maybe_delivered = CASE WHEN state = 'attempting' THEN 1 ELSE maybe_delivered END"
)
"""A send cut by its process's death may have arrived: remembered for good, so a later
certain failure of the resend does not lose the marker of the resend after it."""


class Recovery(LedgerCore):
    """Sweeps, claims, retries and pruning (part of ``DeliveryLedger``)."""

    async def due_retries(self, now: datetime | None = None) -> list[Obligation]:
        """Claim this process's ``failed`` rows whose retry time has come, its rows
        waiting for their platform (``mark_waiting``) once due, and the ``pending``
        rows queued for any gateway (owner ``NOBODY``); best effort.

        Each returned row is already ``attempting`` (attempts counted): send
        it without ``mark_attempting``. ``needs_marker`` is set when an earlier
        attempt may have arrived. Rows past ``STALE_AFTER`` or out of attempts
        are abandoned instead. A storage failure is logged and returns ``[]``.
        Queued rows are claimed by one guarded UPDATE each, so of several
        processes polling at once only one sends a row.
        """
        await self.flush()  # claims read states: let the buffered delivered marks land first
        moment = self._now(now)
        me = self._owner

        async def body(tx: Transaction) -> list[tuple[Any, ...]]:
            own = await tx.fetchall(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE state = 'failed' "
                "AND next_attempt_at <= ? AND owner_pid = ? AND owner_instance = ? "
                "ORDER BY next_attempt_at, created_at",
                (moment, me.pid, me.instance_id),
            )
            # Rows given back unsent while their platform was not connected (mark_waiting).
            waiting = await tx.fetchall(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE state = 'pending' "
                "AND next_attempt_at <= ? AND owner_pid = ? AND owner_instance = ? "
                "ORDER BY next_attempt_at, created_at",
                (moment, me.pid, me.instance_id),
            )
            # Through the (state, next_attempt_at) index: only the few pending rows are read.
            queued = await tx.fetchall(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE state = 'pending' "
                "AND next_attempt_at IS NULL AND owner_pid = ? AND owner_instance = ? "
                "ORDER BY created_at, obligation_id",
                (NOBODY.pid, NOBODY.instance_id),
            )
            return own + waiting + queued

        try:
            # The poll runs every few seconds: a read that finds nothing writes nothing.
            rows = await self._run(body, write=False)
            if not rows:
                return []
            candidates = [decode_row(r) for r in rows]
            claimed = await self._settle(candidates, moment, needs_marker_for=_maybe_only)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("claim due retries of", "(any)", exc)
            return []
        return claimed

    async def sweep_recoverable(
        self,
        now: datetime | None = None,
        *,
        deliverable_platforms: Collection[str] | None = None,
        adopt_only: bool = False,
    ) -> list[Obligation]:
        """Claim the rows a dead process owed and return them for a resend.

        With ``adopt_only`` the rows are only made ours (owner changed, state and
        attempts as they were) and returned with ``needs_marker`` decided; the
        caller ``claim``s each right before sending it, so rows that wait in a
        queue spend no attempt if this process dies before their turn comes.

        Looks at ``pending``/``attempting``/``failed`` rows whose owner is dead
        (``is_owner_alive`` on SQLite, an expired lease on PostgreSQL, or the
        ``liveness`` given). Rows older than ``STALE_AFTER`` or with
        ``MAX_ATTEMPTS`` attempts used become ``abandoned`` (logged). Rows of a
        platform not in ``deliverable_platforms`` are otherwise left alone, no
        attempt spent. ``failed`` rows whose retry is not yet due are adopted
        (owner = us, still ``failed``) for ``due_retries``. The rest are claimed
        with one guarded UPDATE each (owner and state unchanged since read, so
        only one of two racing processes wins), moved to ``attempting`` with
        attempts + 1, and returned oldest first with ``needs_marker`` when an
        earlier attempt may have arrived (the row was ``attempting``, or a failure
        was ambiguous; never for ``pending`` rows nor certain failures such as
        "adapter not connected"). Send them without ``mark_attempting``.

        Call it at start-up once adapters are connected, and from time to time
        afterwards to pick up rows the operator re-queued. A storage failure is
        logged and returns what was claimed so far.
        """
        await self.flush()  # claims read states: let the buffered delivered marks land first
        moment = self._now(now)
        alive: dict[Owner, bool] = {}
        claimed: list[Obligation] = []

        async def body(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(
                f"SELECT {COLUMNS} FROM {TABLE} "
                "WHERE state IN ('pending', 'attempting', 'failed') "
                "ORDER BY created_at, obligation_id",
                (),
            )

        try:
            rows = await self._run(body, write=False)
            candidates: list[StoredRow] = []
            for values in rows:
                row = decode_row(values)
                if row.owner not in alive:
                    alive[row.owner] = await self._is_alive(row.owner)
                if alive[row.owner]:
                    continue
                candidates.append(row)
            for start in range(0, len(candidates), _BATCH):
                batch = await self._settle(
                    candidates[start : start + _BATCH],
                    moment,
                    needs_marker_for=_maybe_sent,
                    deliverable_platforms=deliverable_platforms,
                    adopt_only=adopt_only,
                )
                claimed.extend(batch)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("sweep", "(any)", exc)
        if claimed:
            logger.info("claimed %d undelivered repl(ies) from a previous run", len(claimed))
        return claimed

    async def _settle(
        self,
        rows: Sequence[StoredRow],
        moment: float,
        *,
        needs_marker_for: Callable[[Obligation], bool],
        deliverable_platforms: Collection[str] | None = None,
        adopt_only: bool = False,
    ) -> list[Obligation]:
        """Abandon, adopt or claim ``rows`` in one transaction, each by a guarded UPDATE.

        Returns the claimed obligations.
        """
        me = self._owner
        stale_before = moment - STALE_AFTER.total_seconds()
        claimed: list[Obligation] = []
        abandoned: list[tuple[str, str, str]] = []
        guard = (
            "WHERE obligation_id = ? AND owner_pid = ? AND owner_instance = ? "
            "AND state = ? AND attempts = ?"
        )
        if not rows:
            return []

        async def body(tx: Transaction) -> None:
            for row in rows:
                ob = row.obligation
                stamp = (
                    ob.obligation_id,
                    row.owner.pid,
                    row.owner.instance_id,
                    ob.state,
                    ob.attempts,
                )
                reason: str | None = None
                if row.fresh_since < stale_before:
                    reason = f"stale: owed for more than {STALE_AFTER.total_seconds() / 3600:g} h"
                elif ob.attempts >= MAX_ATTEMPTS:
                    reason = f"gave up after {ob.attempts} attempts"
                    if ob.last_error:
                        reason += f"; last error: {ob.last_error}"
                if reason is not None:
                    changed = await tx.execute(
                        f"UPDATE {TABLE} SET state = 'abandoned', last_error = ?, "
                        f"next_attempt_at = NULL, updated_at = ? {guard}",
                        (clip_error(reason), moment, *stamp),
                    )
                    if changed == 1:
                        abandoned.append((ob.obligation_id, reason, ob.platform))
                    continue
                if deliverable_platforms is not None and ob.platform not in deliverable_platforms:
                    continue
                due = ob.next_attempt_at is None or to_epoch(ob.next_attempt_at) <= moment
                if (ob.state == "failed" and not due) or adopt_only:
                    adopted = await tx.execute(
                        f"UPDATE {TABLE} SET owner_pid = ?, owner_instance = ?, "
                        f"owner_started = ?, {_REMEMBER_CUT_SEND}, updated_at = ? {guard}",
                        (me.pid, me.instance_id, me.started, moment, *stamp),
                    )
                    if adopted == 1 and adopt_only and (due or ob.state != "failed"):
                        claimed.append(replace(ob, needs_marker=needs_marker_for(ob)))
                    continue
                changed = await tx.execute(
                    f"UPDATE {TABLE} SET owner_pid = ?, owner_instance = ?, owner_started = ?, "
                    "state = 'attempting', attempts = attempts + 1, next_attempt_at = NULL, "
                    f"{_REMEMBER_CUT_SEND}, updated_at = ? {guard}",
                    (me.pid, me.instance_id, me.started, moment, *stamp),
                )
                if changed == 1:
                    claimed.append(replace(ob.claimed(), needs_marker=needs_marker_for(ob)))

        await self._run(body)
        for obligation_id, reason, platform in abandoned:
            logger.warning("obligation %s abandoned: %s", obligation_id, reason)
            self._abandoned(platform)
        return claimed

    async def claim(self, obligation: Obligation) -> Obligation | None:
        """Claim a row adopted by ``sweep_recoverable(adopt_only=True)`` to send it now.

        Moves it to ``attempting`` (attempts + 1) if it is still ours and as it
        was read; ``None`` when it changed meanwhile (another path took it) or
        the database failed (logged; the row stays for the next sweep).
        """
        me = self._owner
        params = (
            self._now(),
            obligation.obligation_id,
            me.pid,
            me.instance_id,
            obligation.state,
            obligation.attempts,
        )

        async def body(tx: Transaction) -> int:
            return await tx.execute(
                f"UPDATE {TABLE} SET state = 'attempting', attempts = attempts + 1, "
                "next_attempt_at = NULL, updated_at = ? WHERE obligation_id = ? "
                "AND owner_pid = ? AND owner_instance = ? AND state = ? AND attempts = ?",
                params,
            )

        try:
            changed = await self._run(body)
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("claim", obligation.obligation_id, exc)
            return None
        if changed != 1:
            return None
        return obligation.claimed()

    async def own_quiet(self, before: float, *, skip: Callable[[str], bool]) -> list[Obligation]:
        """This process's ``pending`` and ``attempting`` rows last touched before ``before``
        (Unix time) that ``skip(obligation_id)`` says nothing here holds: work a failure
        (the database away mid-send, a commit whose outcome was unknown) left owed by a
        live process, which no sweep of dead owners takes. Returned as read, with
        ``needs_marker`` for ``attempting`` rows (an earlier send may have arrived); the
        caller ``claim``s each. Delivered marks still buffered here are not quiet rows."""
        me = self._owner

        async def body(tx: Transaction) -> list[tuple[Any, ...]]:
            return await tx.fetchall(
                f"SELECT {COLUMNS} FROM {TABLE} WHERE state IN ('pending', 'attempting') "
                "AND owner_pid = ? AND owner_instance = ? AND updated_at < ? "
                "ORDER BY created_at, obligation_id",
                (me.pid, me.instance_id, before),
            )

        quiet: list[Obligation] = []
        for values in await self._run(body, write=False):
            ob = decode_row(values).obligation
            if skip(ob.obligation_id) or self._buffered(ob.obligation_id):
                continue
            if ob.obligation_id in self._unrecorded:
                continue  # its outcome waits to be written: not lost
            quiet.append(replace(ob, needs_marker=_maybe_sent(ob)))
        return quiet

    async def holds(self, obligation: Obligation) -> bool:
        """Whether the row of ``obligation`` (as this process claimed it) is still this
        process's to send: same owner, state and attempts. ``False`` on a storage failure."""
        me = self._owner

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(
                f"SELECT 1 FROM {TABLE} WHERE obligation_id = ? AND owner_pid = ? "
                "AND owner_instance = ? AND state = ? AND attempts = ?",
                (
                    obligation.obligation_id,
                    me.pid,
                    me.instance_id,
                    obligation.state,
                    obligation.attempts,
                ),
            )

        try:
            return await self._run(body, write=False) is not None
        except STORAGE_ERRORS as exc:
            self._log_storage_failure("check the owner of", obligation.obligation_id, exc)
            return False

    async def prune(self, now: datetime | None = None) -> int:
        """Delete ``delivered``/``abandoned`` rows settled more than ``RETENTION`` ago.

        Works in batches of short transactions; returns the number deleted.
        Raises ``StorageError`` on a database failure.
        """
        cutoff = self._now(now) - RETENTION.total_seconds()
        total = 0

        async def body(tx: Transaction) -> list[tuple[str]]:
            rows = await tx.fetchall(
                f"SELECT obligation_id FROM {TABLE} "
                "WHERE state IN ('delivered', 'abandoned') AND updated_at < ? LIMIT ?",
                (cutoff, _BATCH),
            )
            ids = [(str(r[0]),) for r in rows]
            if ids:
                await tx.executemany(f"DELETE FROM {SENT_TABLE} WHERE obligation_id = ?", ids)
                await tx.executemany(f"DELETE FROM {TABLE} WHERE obligation_id = ?", ids)
            return ids

        while True:
            ids = await self._run(body)
            total += len(ids)
            if len(ids) < _BATCH:
                break
        if total:
            logger.debug("pruned %d ledger row(s)", total)
        return total


def _maybe_only(obligation: Obligation) -> bool:
    return obligation.maybe_delivered


def _maybe_sent(obligation: Obligation) -> bool:
    """Whether an earlier attempt may have reached the platform: a send cut by its
    process's death (``attempting``), or one that failed ambiguously. A ``failed`` row
    whose failure was certain (a refusal, "adapter not connected") reached nobody."""
    return obligation.state == "attempting" or obligation.maybe_delivered
