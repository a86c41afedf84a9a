"""The delivery ledger: every final reply is an obligation until it is delivered.

A turn's reply is recorded in the turn's own transaction (tx 2, ``record_in``;
the gateway records it already claimed), so a committed turn always owes its
reply. The gateway then brackets the send with ``mark_attempting`` and
``mark_delivered`` or ``mark_failed``. A process that dies mid-send leaves rows
whose owner is dead; ``sweep_recoverable`` at the next start claims them (one
guarded UPDATE per row, so of two racing processes only one wins a row) and
hands them back for a resend, with ``needs_marker`` when the earlier send may
have arrived.

States: ``pending`` -> ``attempting`` -> ``delivered``; ``attempting`` ->
``failed`` (retry later) or ``abandoned`` (given up, reason logged).
``abandoned`` is terminal except for the operator's ``retry``.

Delivered marks are group-committed: ``mark_delivered`` buffers the mark and
one flusher writes every mark buffered meanwhile in one transaction, the next
one starting as soon as the last committed (no timer). ``flush()`` writes what
is buffered; the sent-id lookups, sweeps, due retries, operator queries and
``Gateway.stop`` call it first, so this process always reads its own sends. A
crash before the commit leaves the rows ``attempting``: resent with the marker.

The ledger is best effort around the send: a storage failure in ``mark_*`` is
logged and never blocks a reply. Only ``record_in`` (and its wrapper
``record_obligation_in``) raises, because it is part of the turn's transaction.

The owner of a row is ``(pid, instance id)``; the instance id is new in every
process, so a restarted process that got the same pid (PID 1 in a container)
still sees the old owner as dead. On SQLite (one host) liveness of another pid
is checked with ``os.kill(pid, 0)`` and, on Linux, the process start time,
which catches an unrelated program that reused the pid. On PostgreSQL (several
processes, several hosts) an owner is alive iff its lease in
``chatflow_instances`` has not expired (``bot.gateway.instances``), and the
updates a process makes around its own sends are guarded by owner, so a
process that stalled past its lease cannot undo the work of the one that took
its rows over.

Layout, one module per concept:

- ``bot.gateway.ledger.obligations``: the ``Obligation`` record, its id, states,
  limits, table layout and row decoding;
- ``bot.gateway.ledger.core``: ``LedgerCore``, the rows' state machine around one
  send (recording, the marks, group-committed delivered marks, fencing) and
  the state every part shares;
- ``bot.gateway.ledger.sweep``: what a (re)start does with the rows: sweeps,
  claims, due retries and pruning;
- ``bot.gateway.ledger.admin``: the operator's queries and actions.

``DeliveryLedger`` is ``LedgerCore`` with the recovery and the operator's parts
on top: one public type with every method, because the parts share every piece
of state and the core's helpers (``_settle``, ``_abandoned``, ``flush``).
Import the public names from here.
"""

from __future__ import annotations

from bot.gateway.instances import Owner, OwnerLiveness, is_owner_alive
from bot.gateway.ledger.admin import LedgerAdmin
from bot.gateway.ledger.obligations import (
    MAX_ATTEMPTS,
    RECOVERED_MARKER,
    RETENTION,
    RETRY_BACKOFF,
    STALE_AFTER,
    STATES,
    Obligation,
    ObligationState,
    compute_obligation_id,
)
from bot.gateway.ledger.sweep import Recovery

__all__ = [
    "MAX_ATTEMPTS",
    "RECOVERED_MARKER",
    "RETENTION",
    "RETRY_BACKOFF",
    "STALE_AFTER",
    "STATES",
    "DeliveryLedger",
    "Obligation",
    "ObligationState",
    "Owner",
    "OwnerLiveness",
    "compute_obligation_id",
    "is_owner_alive",
]


class DeliveryLedger(Recovery, LedgerAdmin):
    """Obligations in the session store's database (``chatflow_delivery_obligations``).

    ``DeliveryLedger(store, *, clock=None, owner=None, liveness=None,
    on_abandoned=None)``: ``owner`` defaults to this process's, ``liveness``
    to the leases on PostgreSQL and pid checks on SQLite, and
    ``on_abandoned(platform)`` is called for every row this ledger abandons.
    """
