"""The trace-context columns on PostgreSQL: a database made before them migrates, old rows
read with none, new rows keep the span that owed them."""

from __future__ import annotations

from bot.core.scheduling import MIGRATIONS as JOB_MIGRATIONS
from bot.core.scheduling import TABLE as JOBS
from bot.core.scheduling import JobRoute, ScheduleRequest, apply_in
from bot.core.sql import ensure_schema
from bot.core.stores.postgres import PostgresSessionStore
from bot.gateway.approvals.table import MIGRATIONS as APPROVAL_MIGRATIONS
from bot.gateway.approvals.table import approval_rows
from bot.gateway.inbox import _MIGRATIONS as INBOX_MIGRATIONS
from bot.gateway.inbox import Inbox
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import MIGRATIONS, TABLE, Obligation
from bot.tracing import spans
from tests.fakes.adapter import make_event
from tests.fakes.tracing import recording_spans
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]  # the fixture, imported for this module's test


async def test_an_older_postgres_database_gains_the_columns_and_keeps_its_rows(
    pg_dsn: str,
) -> None:
    async with PostgresSessionStore(pg_dsn) as store:
        async with store.transaction() as tx:  # the tables as the previous release left them
            await ensure_schema(tx, "delivery_ledger", {v: MIGRATIONS[v] for v in (1, 2, 3, 4)})
            await ensure_schema(tx, "scheduled_jobs", {v: JOB_MIGRATIONS[v] for v in (1, 2)})
            await ensure_schema(tx, "approvals", {v: APPROVAL_MIGRATIONS[v] for v in (1, 2)})
            await ensure_schema(tx, "inbox", {v: INBOX_MIGRATIONS[v] for v in (1, 2)})
            await tx.execute(
                f"INSERT INTO {TABLE} (obligation_id, session_key, session_id, platform, "
                "chat_id, message_ref, content, state, owner_pid, owner_instance, created_at, "
                "fresh_since, updated_at) VALUES ('o-old', 'k', 's', 'fake', 'c', 'm', 'hi', "
                "'pending', 1, 'gone', 1.0, 1.0, 1.0)"
            )
        ledger = DeliveryLedger(store)
        await ledger.open()
        old = await ledger.get("o-old")
        assert old is not None and old.traceparent is None
        assert await approval_rows(store) == []
        dead = Inbox(store, owner="dead-process")
        with recording_spans(), spans.span("chatflow.tx2"):
            owing = spans.traceparent()
            obligation = Obligation.owed(
                obligation_id="o-new",
                session_key="k",
                session_id="s",
                platform="fake",
                chat_id="c",
                thread_id=None,
                reply_to=None,
                content="hi",
                message_ref="m2",
            )
            async with store.transaction() as tx:
                assert await ledger.record_in(tx, obligation)
                route = JobRoute("k", "s", "fake", "c", None, traceparent=owing)
                await apply_in(tx, [ScheduleRequest("job_1", "ping", 5.0)], route, 1.0)
            assert await dead.accept(make_event("hello"), session_key="k", session_id="s")
        new = await ledger.get("o-new")
        assert owing is not None and new is not None and new.traceparent == owing
        async with store.transaction() as tx:
            assert await tx.fetchall(f"SELECT traceparent FROM {JOBS}") == [(owing,)]
        [entry] = await Inbox(store, owner="taker").recover(3600, live_owners={"taker"})
        assert entry.link == owing
