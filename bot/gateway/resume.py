"""Work a live process still owes after a database failure: resumed, never stranded.

A turn that fails because the database went away leaves its inbox row
``received``, owned by this process, which is alive: no other process takes
it (they take only the rows of expired leases). So the turn is not answered
with an apology (the fault may heal in a second); ``resume_when_back`` waits,
with backoff, until the database answers again and this process holds its
lease, then reads the message's keys back and goes on from what they say:

- the inbox row is still ``received`` and ours: the turn never committed, run
  it again (in its conversation's lane);
- the row is ``done`` and ours, and the turn's obligation is still ours and
  unsent: the COMMIT whose answer was lost did commit; send the reply (nothing
  went out, so it needs no marker);
- anything else (answered, or taken over by another process): nothing to do.

The outcome of an unknown COMMIT is only ever read back, never guessed.

``reconcile`` is the net under that: from time to time it reads this
process's own ``received`` inbox rows and ``pending``/``attempting``
obligations that nothing in the process holds (no lane, no send, no resume)
and that went quiet, and queues them again: an accepted message whose tx 1
answer was lost, a reply whose send was skipped by the lease fence, a resume
given up at shutdown.

``may_send`` is the outbox's fence: with its lease lapsed, the process waits
for a renewal before a platform send, then sends only a row that is still
its own as it claimed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Final

from bot.errors import ChatflowError, DatabaseUnavailableError
from bot.gateway.inbox import Inbox, InboxEntry
from bot.gateway.instances import InstanceRegistry
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation
from bot.gateway.outbox import Outbox

__all__ = ["RESUME_BACKOFF", "Resumer", "database_away"]

logger = logging.getLogger(__name__)

RESUME_BACKOFF: Final = (0.5, 1.0, 2.0, 4.0)
"""Seconds between checks whether the database is back (the last one repeats)."""


def database_away(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the database could not be reached."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, DatabaseUnavailableError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class Resumer:
    """Resumes this process's own work that a database failure interrupted."""

    def __init__(
        self,
        inbox: Inbox,
        ledger: DeliveryLedger,
        outbox: Outbox,
        instances: InstanceRegistry | None,
        *,
        answers: Callable[[], Awaitable[bool]] | None = None,
        clock: Callable[[], float] = time.time,
        submit_turn: Callable[[InboxEntry], None],
        queue_sends: Callable[[list[Obligation]], None],
        holds: Callable[[str], bool],
        freshness_seconds: float,
    ) -> None:
        """``submit_turn`` and ``queue_sends`` put work in its conversation's lane;
        ``holds(key)`` says whether a lane holds a key (a message id, or
        ``reply:<obligation id>``); ``answers()`` whether the database answers now;
        ``clock`` the Unix time rows are stamped with."""
        self._inbox = inbox
        self._ledger = ledger
        self._outbox = outbox
        self._instances = instances
        self._answers = answers
        self._submit_turn = submit_turn
        self._queue_sends = queue_sends
        self._holds = holds
        self._freshness = freshness_seconds
        self._clock = clock
        self._resuming: dict[str, asyncio.Task[None]] = {}

    @property
    def resuming(self) -> int:
        """Messages waiting for the database to come back."""
        return len(self._resuming)

    # -- one interrupted message ------------------------------------------------------

    def resume_when_back(self, entry: InboxEntry, owed: Obligation | None) -> None:
        """Resume ``entry`` once the database is back (``owed``: the reply its turn was
        committing, if it got that far)."""
        message_id = entry.event.message_id
        if message_id in self._resuming:
            return
        self._resuming[message_id] = asyncio.get_running_loop().create_task(
            self._resume(entry, owed), name="chatflow-resume"
        )

    async def _resume(self, entry: InboxEntry, owed: Obligation | None) -> None:
        message_id = entry.event.message_id
        try:
            for attempt in itertools.count():
                delay = RESUME_BACKOFF[min(attempt, len(RESUME_BACKOFF) - 1)]
                await asyncio.sleep(delay * random.uniform(0.8, 1.2))
                if not await self._back():
                    continue
                try:
                    await self._read_back(entry, owed)
                except ChatflowError as exc:
                    if database_away(exc):
                        continue
                    logger.warning("resuming an interrupted message failed (%s)", exc)
                return
        finally:
            self._resuming.pop(message_id, None)

    async def _back(self) -> bool:
        """The database answers and this process holds its lease."""
        if self._instances is not None and not self._instances.holds_lease():
            return False
        return self._answers is None or await self._answers()

    async def _read_back(self, entry: InboxEntry, owed: Obligation | None) -> None:
        found = await self._inbox.state_of(entry.event.message_id)
        if found is None:
            return
        state, owner = found
        if owner not in (None, self._inbox.owner):
            logger.info("interrupted turn of session %s was taken over", entry.session_id)
            return
        if state == "received":
            logger.info(
                "database back: running the interrupted turn of session %s again", entry.session_id
            )
            self._submit_turn(entry)
            return
        if state == "done" and owed is not None and await self._ledger.holds(owed):
            # Its commit did land (its answer was lost): the reply was never sent.
            logger.info(
                "database back: the turn of session %s had committed; sending its reply",
                entry.session_id,
            )
            self._queue_sends([replace(owed, needs_marker=False)])

    # -- the net ------------------------------------------------------------------------

    def _held(self, key: str) -> bool:
        return key in self._resuming or self._holds(key)

    async def reconcile(self, quiet_seconds: float) -> int:
        """Queue again this process's own work that nothing holds and that went quiet for
        ``quiet_seconds``; returns how many items. Raises ``StorageError``."""
        if self._instances is not None and not self._instances.holds_lease():
            return 0  # not surely ours now: renew first
        before = self._clock() - quiet_seconds
        entries = await self._inbox.own_quiet(
            before, skip=self._held, freshness_seconds=self._freshness
        )
        owed = await self._ledger.own_quiet(
            before,
            skip=lambda oid: self._held(f"reply:{oid}") or oid in self._outbox.sending,
        )
        for entry in entries:
            self._submit_turn(entry)
        self._queue_sends(owed)
        if entries or owed:
            logger.warning(
                "resumed %d message(s) and %d repl(ies) this process owed since a failure",
                len(entries),
                len(owed),
            )
        return len(entries) + len(owed)

    # -- the send fence -------------------------------------------------------------------

    async def may_send(self, obligation: Obligation) -> bool:
        """Whether ``obligation`` may go to the platform now: the lease is surely held, or
        it was renewed within one lease and the row is still ours as claimed."""
        instances = self._instances
        if instances is None or instances.holds_lease():
            return True
        logger.warning(
            "lease not surely held; reply %s waits for a renewal", obligation.obligation_id
        )
        if not await instances.wait_for_lease(instances.lease_seconds):
            return False
        return await self._ledger.holds(obligation)

    async def close(self) -> None:
        """Stop waiting for the database (the rows stay for the next start)."""
        tasks = list(self._resuming.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
