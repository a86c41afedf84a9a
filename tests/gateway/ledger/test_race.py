"""Two processes sweep one ledger at the same moment: every row is claimed exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.instances import Owner
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import compute_obligation_id

ROWS = 200
WORKERS = 2
WORKER = Path(__file__).with_name("sweep_worker.py")
ROOT = Path(__file__).resolve().parents[3]


async def dead_pid() -> int:
    """The pid of a process that has exited."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import os; print(os.getpid())", stdout=subprocess.PIPE
    )
    out, _ = await child.communicate()
    return int(out)


async def seed(db: Path) -> set[str]:
    store = SQLiteSessionStore(db)
    ledger = DeliveryLedger(store, owner=Owner(await dead_pid(), "crashed"))
    ids: set[str] = set()
    try:
        async with store.transaction() as tx:
            for i in range(ROWS):
                key = f"agent:main:telegram:dm:chat_{i:012x}"
                oid = compute_obligation_id(key, f"telegram:{i}:1", f"reply {i}")
                await ledger.record_obligation_in(
                    tx,
                    obligation_id=oid,
                    session_key=key,
                    session_id=f"telegram-{i:016x}",
                    platform="telegram",
                    chat_id=str(i),
                    thread_id=None,
                    reply_to=None,
                    content=f"reply {i}",
                    message_ref=f"telegram:{i}:1",
                )
                ids.add(oid)
        # a third of them were mid-send when the owner died
        async with store.transaction() as tx:
            await tx.execute(
                "UPDATE chatflow_delivery_obligations SET state = 'attempting', attempts = 1 "
                "WHERE rowid % 3 = 0"
            )
    finally:
        await store.close()
    return ids


async def wait_until(
    condition_met: Callable[[], bool], procs: list[asyncio.subprocess.Process]
) -> None:
    deadline = time.monotonic() + 30
    while not condition_met():
        for proc in procs:
            if proc.returncode is not None:
                raise AssertionError(f"worker exited early: {await proc.communicate()}")
        assert time.monotonic() < deadline, "workers did not get ready"
        await asyncio.sleep(0.005)


async def test_two_processes_sweeping_at_once_never_claim_a_row_twice(tmp_path: Path) -> None:
    db = tmp_path / "race.db"
    ids = await seed(db)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            str(db),
            str(barrier),
            f"w{n}",
            str(WORKERS),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        for n in range(WORKERS)
    ]
    try:
        await wait_until(lambda: len(list(barrier.glob("ready-*"))) == WORKERS, procs)
        (barrier / "go").touch()
        outputs = await asyncio.wait_for(
            asyncio.gather(*(proc.communicate() for proc in procs)), 60
        )
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.communicate()
    claims: list[set[str]] = []
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
        claims.append(set(json.loads(out.decode().strip().splitlines()[-1])))

    first, second = claims
    assert first.isdisjoint(second)
    assert first | second == ids

    store = SQLiteSessionStore(db)
    try:
        async with store.transaction() as tx:
            rows = await tx.fetchall(
                "SELECT state, owner_pid, COUNT(*) FROM chatflow_delivery_obligations "
                "GROUP BY state, owner_pid"
            )
    finally:
        await store.close()
    worker_pids = {proc.pid for proc in procs}
    assert {r[0] for r in rows} == {"attempting"}
    assert {r[1] for r in rows} <= worker_pids
    assert sum(r[2] for r in rows) == ROWS
