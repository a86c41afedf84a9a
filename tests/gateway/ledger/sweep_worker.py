"""Helper process for ``test_ledger_race``: sweep the ledger once, in step with a rival.

Usage: ``python sweep_worker.py <db path> <barrier dir> <name> <workers>``. Prints the
claimed obligation ids as one JSON line. It stays alive until every worker has swept:
a live owner keeps its claims, a dead one would hand them to the rival.

The workers run in lockstep: each reads the candidate rows, then waits until every
worker has read them before claiming any. Both therefore try to claim every row, and
only the guarded UPDATE decides who wins.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway import ledger as ledger_module
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.sweep import Recovery

TIMEOUT = 30.0


async def wait_for(condition_met: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition_met():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.002)


def claim_in_lockstep(barrier: Path, name: str, workers: int) -> None:
    """Hold the first claim batch until every worker has read its candidates."""
    original = DeliveryLedger._settle
    waited = False

    async def settle(self: Recovery, *args: Any, **kwargs: Any) -> Any:
        nonlocal waited
        if not waited:
            waited = True
            (barrier / f"read-{name}").touch()
            await wait_for(lambda: len(list(barrier.glob("read-*"))) >= workers, "the rival")
        return await original(self, *args, **kwargs)

    ledger_module.DeliveryLedger._settle = settle  # type: ignore[method-assign]


async def main(db: str, barrier: Path, name: str, workers: int) -> None:
    claim_in_lockstep(barrier, name, workers)
    store = SQLiteSessionStore(db)
    try:
        ledger = DeliveryLedger(store)
        await ledger.open()
        (barrier / f"ready-{name}").touch()
        await wait_for((barrier / "go").exists, "the start signal")
        claimed = await ledger.sweep_recoverable()
        print(json.dumps([o.obligation_id for o in claimed]), flush=True)
        (barrier / f"done-{name}").touch()
        await wait_for(lambda: len(list(barrier.glob("done-*"))) >= workers, "the rival")
    finally:
        await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
