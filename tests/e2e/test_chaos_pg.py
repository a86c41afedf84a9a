"""Chaos: the database fails under several bot processes, and nothing is lost or stranded.

``make chaos`` (``CHATFLOW_CHAOS=full``) starts a PostgreSQL primary and a
synchronous streaming standby (``tests.e2e.pgcluster``), three bots whose
``DATABASE_URL`` lists both servers with ``target_session_attrs=read-write``,
each through fault proxies of its own, and plays every fault in turn, with no
bot restarted:

1. a short outage (half a lease) as silence (no byte flows, connections stay);
2. the same as a cut (every connection reset, new ones refused);
3. a long outage (three leases), cut;
4. an immediate restart of the primary;
5. one bot frozen (SIGSTOP) past its lease, then thawed;
6. one bot cut off from the database while the others go on;
7. a failover: the primary killed, the standby promoted, the bots moving by
   their multi-host URL.

Each fault's figures must show 0 lost, 0 unmarked duplicates, 0 stranded, 0
acknowledged commits lost, every job once and every owed reply within
3 x lease + 20 s of the heal. The figures go to docs/RELIABILITY.md.
``make chaos`` also plays the two short outages with the proxies in front of
PgBouncer in transaction mode (``tests.pgbouncer``, issue #38).

``make test`` runs the two cheapest faults (short silence, short cut) with two
bots on the test server (``scripts/with-postgres.sh``) and the same bars.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.chaos_report import write_figures, write_pooler_figures
from tests.e2e.chaos_world import HEADER, LEASE_SECONDS, ChaosWorld, Figures, Phase
from tests.e2e.pgcluster import PgCluster
from tests.pgbouncer import bouncer
from tests.pgtest import fresh_schema

FULL = os.environ.get("CHATFLOW_CHAOS") == "full"

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200 if FULL else 240)]
SEED = int(os.environ.get("CHATFLOW_CHAOS_SEED", "20261207"))
SHORT = LEASE_SECONDS / 2
LONG = LEASE_SECONDS * 3


def _phases(world: ChaosWorld, cluster: PgCluster | None) -> list[Phase]:
    async def nothing() -> None:
        return None

    short = [
        Phase("short outage, silence (0.5 lease)", world.silence, world.heal, SHORT),
        Phase("short outage, cut (0.5 lease)", world.cut, world.heal, SHORT),
    ]
    if cluster is None:
        return short

    async def freeze() -> None:
        proc = world.bots[0].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGSTOP)

    async def thaw() -> None:
        proc = world.bots[0].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGCONT)

    async def restart_primary() -> None:
        await cluster.stop_primary()
        await cluster.start_primary()

    async def fail_over() -> None:
        await cluster.stop_primary()  # fenced first: it takes no more writes
        await cluster.promote()

    async def cut_one() -> None:
        await world.cut(0)

    async def heal_one() -> None:
        await world.heal(0)

    return [
        *short,
        Phase("long outage, cut (3 leases)", world.cut, world.heal, LONG),
        Phase("primary restarted at once", restart_primary, nothing, 0.0),
        Phase("one bot frozen (SIGSTOP) for 3 leases", freeze, thaw, LONG),
        Phase("one bot cut off for 3 leases, others go on", cut_one, heal_one, LONG),
        Phase("failover: primary killed, standby promoted", fail_over, nothing, 0.0),
    ]


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[tuple[ChaosWorld, PgCluster | None]]:
    rng = random.Random(SEED)
    if FULL:
        cluster = PgCluster(synchronous=True)
        try:
            await cluster.start()
            made = ChaosWorld(
                ports=[cluster.primary_port, cluster.standby_port],
                admin_dsn=lambda: cluster.dsn(cluster.writable_port),
                database="chatflow",
                query="target_session_attrs=read-write",
                rng=rng,
            )
            try:
                await made.start(tmp_path, 3, {})
                yield made, cluster
            finally:
                await made.stop()
        finally:
            await cluster.stop()
        return
    async with fresh_schema() as dsn:
        parts = urlsplit(dsn)
        assert parts.port is not None
        made = ChaosWorld(
            ports=[parts.port],
            admin_dsn=lambda: dsn,
            database=parts.path.lstrip("/"),
            query=f"{parts.query}&target_session_attrs=read-write",
            rng=rng,
        )
        try:
            await made.start(tmp_path, 2, {})
            yield made, None
        finally:
            await made.stop()


async def test_database_faults_lose_nothing_and_strand_nothing(
    world: tuple[ChaosWorld, PgCluster | None],
) -> None:
    await _play(*world)


@pytest.mark.skipif(not FULL, reason="make chaos: the faults through PgBouncer")
async def test_database_faults_through_pgbouncer_lose_nothing(tmp_path: Path) -> None:
    """The short outages (silence, cut) with the fault proxies in front of PgBouncer in
    transaction mode (issue #38): the bots hold nothing in a database session."""
    async with fresh_schema() as dsn, bouncer(dsn, pool_size=8) as through:
        parts = urlsplit(through)
        assert parts.port is not None
        made = ChaosWorld(
            ports=[parts.port],
            admin_dsn=lambda: dsn,
            database=parts.path.lstrip("/"),
            query="target_session_attrs=read-write",
            rng=random.Random(SEED),
        )
        try:
            await made.start(tmp_path, 2, {"DATABASE_POOLER": "transaction"})
            await _play(made, None)
        finally:
            await made.stop()


async def _play(made: ChaosWorld, cluster: PgCluster | None) -> None:
    size = (6, 4, 3) if FULL else (3, 3, 2)
    results: list[Figures] = []
    for index, phase in enumerate(_phases(made, cluster)):
        conversations, messages, jobs = size
        results.append(
            await made.run_phase(
                index, phase, conversations=conversations, messages=messages, jobs=jobs
            )
        )
    table = "\n".join([HEADER, *(f.row() for f in results)])
    print("\n" + table)
    if FULL and cluster is not None:
        write_figures(table, seed=SEED, lease=LEASE_SECONDS)
    elif FULL:
        write_pooler_figures(table)
    failed = [f.fault for f in results if not f.holds(LEASE_SECONDS)]
    logs = "\n".join(f"--- bot{i}\n" + "\n".join(b.log[-60:]) for i, b in enumerate(made.bots))
    assert not failed, f"{failed}\n{table}\n{logs}"
    # Webhooks that arrived while the database was away were refused, so retried.
    assert sum(f.refused_webhooks for f in results) > 0
