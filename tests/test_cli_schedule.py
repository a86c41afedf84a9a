"""``python -m bot schedule list|cancel``: the operator's view of scheduled messages."""

from __future__ import annotations

import time
from pathlib import Path

from bot.core.scheduling import JobRoute, ScheduleRequest, apply_in
from bot.core.stores.base import TransactionalStore
from bot.core.stores.postgres import PostgresSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation
from bot.gateway.scheduler import Scheduler
from bot.metrics import Metrics
from tests.pgtest import pg_dsn
from tests.test_cli import _bot

__all__ = ["pg_dsn"]

PHONE = "15551234567"
DM = JobRoute("agent:main:whatsapp:dm:k1", "whatsapp-0123456789abcdef", "whatsapp", PHONE, None)
TOPIC = JobRoute(
    "agent:main:telegram:group:k2", "telegram-fedcba9876543210", "telegram", "-1001234567890", "42"
)
LONG = "Your parcel ships today; the tracking number is in your account <b>page</b> " * 2


def _schedule(tmp_path: Path, *args: str, **env: str) -> tuple[int, str, str]:
    result = _bot(tmp_path, "schedule", *args, **env)
    return result.returncode, result.stdout, result.stderr


def _sqlite(tmp_path: Path) -> SQLiteSessionStore:
    (tmp_path / "data").mkdir(exist_ok=True)
    return SQLiteSessionStore(str(tmp_path / "data" / "chatflow.db"))


async def _add(store: TransactionalStore, route: JobRoute, *jobs: ScheduleRequest) -> None:
    async with store.transaction() as tx:
        await apply_in(tx, list(jobs), route, time.time())


async def _states(store: TransactionalStore) -> dict[str, str]:
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT id, state FROM chatflow_scheduled_jobs")
    return {str(job_id): str(state) for job_id, state in rows}


async def _jobs(store: TransactionalStore) -> None:
    soon = time.time() + 3600
    await _add(
        store,
        DM,
        ScheduleRequest("job_later", LONG, soon + 600),
        ScheduleRequest("job_weekly", "Weekly check-in", soon + 60, "0 9 * * 1"),
    )
    await _add(store, TOPIC, ScheduleRequest("job_soon", "Standup in 5", soon))


def test_list_with_no_jobs_says_so(tmp_path: Path) -> None:
    code, out, err = _schedule(tmp_path, "list")
    assert (code, out) == (0, "No scheduled messages.\n"), err


async def test_list_shows_waiting_jobs_soonest_first_without_chat_ids(tmp_path: Path) -> None:
    store = _sqlite(tmp_path)
    await _jobs(store)
    await _add(store, DM, ScheduleRequest("job_gone", "cancel me", time.time() + 5))
    async with store.transaction() as tx:
        await tx.execute("UPDATE chatflow_scheduled_jobs SET state = 'fired' WHERE id = 'job_gone'")
    await store.close()

    code, out, err = _schedule(tmp_path, "list")
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == ["job_soon", "job_weekly", "job_later"]
    soon, weekly, later = lines
    assert "telegram" in soon and TOPIC.session_id in soon and soon.endswith("Standup in 5")
    assert "0 9 * * 1" in weekly and DM.session_id in weekly
    assert " - " in later and later.endswith(LONG[:59] + "…")
    assert len(later.split("  ")[-1]) == 60
    assert PHONE not in out and "-1001234567890" not in out


async def test_list_filters_by_chat_and_thread(tmp_path: Path) -> None:
    store = _sqlite(tmp_path)
    await _jobs(store)
    await store.close()

    code, out, _ = _schedule(tmp_path, "list", "--chat", f"whatsapp:{PHONE}")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["job_weekly", "job_later"]
    code, out, _ = _schedule(tmp_path, "list", "--chat", "telegram:-1001234567890:42")
    assert [line.split()[0] for line in out.splitlines()] == ["job_soon"]
    code, out, _ = _schedule(tmp_path, "list", "--chat", "telegram:-1001234567890")
    assert out == "No scheduled messages.\n"
    code, _, err = _schedule(tmp_path, "list", "--chat", "fax:123")
    assert code == 2 and "unknown platform" in err


async def test_cancel_a_waiting_job_once(tmp_path: Path) -> None:
    store = _sqlite(tmp_path)
    await _jobs(store)
    await store.close()

    assert _schedule(tmp_path, "cancel", "job_soon")[:2] == (0, "cancelled job_soon\n")
    code, out, err = _schedule(tmp_path, "cancel", "job_soon")
    assert (code, out) == (2, "")
    assert (
        err.splitlines()[-1]
        == "chatflow: schedule: cannot cancel job_soon: it was already cancelled"
    )
    store = _sqlite(tmp_path)
    try:
        assert (await _states(store))["job_soon"] == "cancelled"
        assert (await _states(store))["job_later"] == "scheduled"
    finally:
        await store.close()
    _, out, _ = _schedule(tmp_path, "list")
    assert "job_soon" not in out


async def test_cancel_an_unknown_or_fired_job_fails_with_one_line(tmp_path: Path) -> None:
    code, out, err = _schedule(tmp_path, "cancel", "job_nope")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == "chatflow: schedule: cannot cancel job_nope: no such job"

    store = _sqlite(tmp_path)
    await _add(store, DM, ScheduleRequest("job_past", "sent already", time.time() - 5))
    fired: list[Obligation] = []
    scheduler = Scheduler(
        store, DeliveryLedger(store), Metrics(), max_lateness=3600, on_fired=fired.extend
    )
    assert await scheduler.fire_due() == 1
    await store.close()
    code, out, err = _schedule(tmp_path, "cancel", "job_past")
    assert (code, out) == (2, "")
    assert err.splitlines()[-1] == "chatflow: schedule: cannot cancel job_past: it was fired"


async def _cancelled_is_never_fired(store: TransactionalStore, tmp_path: Path, **env: str) -> None:
    due = time.time() - 1
    await _add(store, DM, ScheduleRequest("job_due", "do not send", due))
    fired: list[Obligation] = []
    ledger = DeliveryLedger(store)
    await ledger.open()
    scheduler = Scheduler(store, ledger, Metrics(), max_lateness=3600, on_fired=fired.extend)

    code, out, err = _schedule(tmp_path, "cancel", "job_due", **env)
    assert (code, out) == (0, "cancelled job_due\n"), err
    # The running scheduler had already read the job as due: its claim re-reads the row.
    assert await scheduler._fire("job_due", due) is None
    assert await scheduler.fire_due() == 0
    assert fired == [] and await ledger.list_obligations() == []
    assert (await _states(store))["job_due"] == "cancelled"


async def test_a_job_cancelled_from_the_cli_is_not_fired_by_a_running_scheduler(
    tmp_path: Path,
) -> None:
    store = _sqlite(tmp_path)
    try:
        await _cancelled_is_never_fired(store, tmp_path)
    finally:
        await store.close()


async def test_on_postgres_list_and_cancel(pg_dsn: str, tmp_path: Path) -> None:
    store = PostgresSessionStore(pg_dsn)
    await store.open()
    try:
        await _jobs(store)
        code, out, err = _schedule(tmp_path, "list", DATABASE_URL=pg_dsn)
        assert code == 0, err
        assert [line.split()[0] for line in out.splitlines()] == [
            "job_soon",
            "job_weekly",
            "job_later",
        ]
        await _cancelled_is_never_fired(store, tmp_path, DATABASE_URL=pg_dsn)
    finally:
        await store.close()


async def test_sessions_reset_cancels_and_delete_erases_the_conversations_jobs(
    tmp_path: Path,
) -> None:
    """G4: the operator's reset stops a conversation's reminders; delete, the erasure
    tool, leaves none of its jobs' texts or chat ids behind. Other chats keep theirs."""
    from agents.reminders import reminders

    store = _sqlite(tmp_path)
    for route in (DM, TOPIC):
        await store.save(await store.get_or_create(route.session_id, reminders))
    await _jobs(store)  # two jobs in the DM conversation, one in the topic
    async with store.transaction() as tx:
        await tx.execute(
            "UPDATE chatflow_scheduled_jobs SET state = 'fired' WHERE id = ?", ("job_later",)
        )
    await store.close()
    env = {"AGENTS_MODULE": "agents.reminders"}

    reset = _bot(tmp_path, "sessions", "reset", TOPIC.session_id, **env)
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout == f"reset {TOPIC.session_id} (1 scheduled message(s) cancelled)\n"
    deleted = _bot(tmp_path, "sessions", "delete", DM.session_id, **env)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout == f"deleted {DM.session_id} (1 scheduled message(s) cancelled)\n"
    store = _sqlite(tmp_path)
    try:
        assert await _states(store) == {"job_soon": "cancelled"}
        async with store.transaction() as tx:
            rows = await tx.fetchall(
                "SELECT 1 FROM chatflow_scheduled_jobs WHERE chat_id = ?", (PHONE,)
            )
        assert rows == []
    finally:
        await store.close()


def test_an_unknown_schedule_timezone_stops_start_up_with_one_line(tmp_path: Path) -> None:
    """G12: SCHEDULE_TIMEZONE is checked before anything starts (run, doctor, every command)."""
    result = _bot(tmp_path, "sessions", "list", SCHEDULE_TIMEZONE="Europe/Berln")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "chatflow: configuration error: SCHEDULE_TIMEZONE: 'Europe/Berln' is not an IANA "
        "time zone name (e.g. UTC, Europe/Berlin, America/New_York)"
    ]
