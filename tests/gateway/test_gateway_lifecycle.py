"""Start-up, shutdown and the reply path's edges (issue 13: B4-B8, S2-S6)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

import bot.gateway.instances as instances_module
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.models.base import ModelResponse
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.sql import Transaction
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import DatabaseUnavailableError, ModelError, PlatformError, StorageError
from bot.gateway import gateway as gateway_module
from bot.gateway.gateway import Gateway, Replies
from bot.gateway.instances import Owner
from bot.gateway.keys import session_id_for
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.core import DeliveredMark
from bot.gateway.ledger.obligations import NOBODY, RECOVERED_MARKER, Obligation
from bot.platforms.base import SendResult
from tests.fakes.adapter import FakeAdapter, make_event
from tests.gateway.conftest import SECRET, Rig


def _gateway(store: SQLiteSessionStore, adapter: FakeAdapter, model: ScriptedModel) -> Gateway:
    runner = Runner(Agent(name="Helper", instructions=""), store, model=model)
    return Gateway(runner, store, [adapter], Settings(), secret=SECRET)


def _sample(gateway: Gateway, name: str, **labels: str) -> float:
    value = gateway.metrics.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


class GatedAdapter(FakeAdapter):
    """Sends only once ``release`` is set (a slow platform)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        await self.release.wait()
        return await super().send(chat_id, text, thread_id=thread_id, reply_to=reply_to)


async def _owe(store: SQLiteSessionStore, count: int) -> None:
    """``count`` replies owed by a process that died (another pid, never alive)."""
    ledger = DeliveryLedger(store, owner=Owner(999_999, "dead"))
    async with store.transaction() as tx:
        for n in range(count):
            await ledger.record_in(
                tx,
                Obligation.owed(
                    obligation_id=f"owed{n:04d}",
                    session_key=f"agent:main:fake:dm:chat_{n}",
                    session_id=f"fake-{n:016x}",
                    platform="fake",
                    chat_id=f"chat-{n}",
                    thread_id=None,
                    reply_to=None,
                    content=f"owed reply {n}",
                    message_ref=f"fake:{n}",
                ),
            )


async def test_start_returns_before_the_backlog_is_resent(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "c.db"))
    await _owe(store, 20)
    adapter = GatedAdapter()
    gateway = _gateway(store, adapter, ScriptedModel())
    try:
        # Every send blocks until released: start() must not wait for any of them.
        await asyncio.wait_for(gateway.start(), 5)
        assert adapter.sent == []
        adapter.release.set()
        await gateway.wait_ready()
        sent = await adapter.wait_for_sent(20)
        assert sorted(s.text for s in sent) == sorted(f"owed reply {n}" for n in range(20))
        assert await gateway._dispatcher.drain(5)
        assert (await gateway.ledger.status()).get("delivered") == 20
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def test_new_messages_are_accepted_while_the_backlog_drains(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "c.db"))
    await _owe(store, 3)
    adapter = GatedAdapter()
    model = ScriptedModel([ScriptedModel.reply("fresh")])
    gateway = _gateway(store, adapter, model)
    try:
        await gateway.start()
        assert await adapter.deliver(make_event("hi", chat_id="new-chat"))
        adapter.release.set()
        sent = await adapter.wait_for_sent(4)
        assert {s.text for s in sent} >= {"fresh", "owed reply 0"}
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def test_no_turn_runs_after_stop_returned(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "c.db"))
    adapter = FakeAdapter()
    model = ScriptedModel([ScriptedModel.reply("late")])
    gateway = _gateway(store, adapter, model)
    await gateway.start()
    await gateway.wait_ready()
    delivery = asyncio.create_task(adapter.deliver(make_event("hi")))
    await asyncio.sleep(0)  # the event is past the accepting check, inside tx 1
    await gateway.stop(grace=5)
    accepted = await delivery
    in_flight = gateway._dispatcher.in_flight
    requests_at_stop = len(model.requests)
    await store.close()
    # Either the turn ran (and answered) inside stop(), or it was left to recovery.
    assert in_flight == 0
    assert requests_at_stop == len(adapter.sent)
    assert accepted


async def test_a_sent_reply_whose_outcome_was_not_recorded_is_resent_marked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "c.db")
    store = SQLiteSessionStore(path)
    adapter = FakeAdapter()
    gateway = _gateway(store, adapter, ScriptedModel([ScriptedModel.reply("Refund on its way.")]))
    await gateway.start()
    await gateway.wait_ready()

    class Locked:
        """Every transaction of the ledger's own fails (tx 2 is the turn's, and lands)."""

        async def __aenter__(self) -> Transaction:
            raise StorageError("database is locked")

        async def __aexit__(self, *exc: object) -> None:
            return None

    async def locked(body: object, **options: object) -> object:
        raise StorageError("database is locked")

    monkeypatch.setattr(gateway.ledger, "_tx", Locked)
    monkeypatch.setattr(gateway.ledger, "_run", locked)
    await adapter.deliver(make_event("refund?"))
    await adapter.wait_for_sent(1)
    await gateway.stop(grace=5)
    await store.close()
    # A restart: same pid, new instance id.
    monkeypatch.setattr(instances_module, "_current_owner", None)
    store2 = SQLiteSessionStore(path)
    adapter2 = FakeAdapter()
    gateway2 = _gateway(store2, adapter2, ScriptedModel())
    try:
        await gateway2.start()
        sent = await adapter2.wait_for_sent(1)
        assert sent[0].text == RECOVERED_MARKER + "Refund on its way."
    finally:
        await gateway2.stop(grace=1)
        await store2.close()


@pytest.mark.parametrize(
    "content", [pytest.param("", id="empty"), pytest.param(" \n\t", id="whitespace")]
)
async def test_a_blank_answer_gets_the_apology_not_silence(
    rigs: Callable[..., object], content: str
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ModelResponse(content=content))
    event = make_event("hello")
    await rig.adapter.deliver(event)
    sent = await rig.adapter.wait_for_sent(1)
    assert sent[0].text == Replies().apology
    assert await rig.gateway._dispatcher.drain(5)
    status = await rig.gateway.ledger.status()
    assert status["delivered"] == 1 and sum(status.values()) == 1
    # The failed turn left nothing behind (not even the user's message).
    session = await rig.store.get(session_id_for(rig.gateway.session_key_for(event)))
    assert session is None or session.history == []


async def test_queued_gauge_falls_back_to_zero(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(*(ScriptedModel.reply(f"a{n}") for n in range(5)))
    for n in range(5):
        await rig.adapter.deliver(make_event(f"q{n}"))
    await rig.adapter.wait_for_sent(5)
    assert await rig.gateway._dispatcher.drain(5)
    assert _sample(rig.gateway, "chatflow_queued_messages") == 0.0


async def test_every_abandonment_is_counted(rigs: Callable[..., object], tmp_path: Path) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    # A permanent send error abandons the reply ...
    rig.adapter.fail_next.append(
        PlatformError("blocked by the user", platform="fake", retryable=False)
    )
    rig.model.add(ScriptedModel.reply("never arrives"))
    await rig.adapter.deliver(make_event("hi"))
    assert await rig.gateway._dispatcher.drain(5)
    assert _sample(rig.gateway, "chatflow_abandoned_total", platform="fake") == 1.0
    # ... and so does the sweep, for a row a dead process left out of attempts.
    await _owe(rig.store, 1)
    async with rig.store.transaction() as tx:
        await tx.execute(
            "UPDATE chatflow_delivery_obligations SET state = 'failed', attempts = 3 "
            "WHERE obligation_id = 'owed0000'"
        )
    assert await rig.gateway.retry_due(sweep=True) == 0
    assert (await rig.gateway.ledger.get("owed0000")).state == "abandoned"  # type: ignore[union-attr]
    assert _sample(rig.gateway, "chatflow_abandoned_total", platform="fake") == 2.0


async def test_allowed_chats_match_a_migrated_group_by_its_old_id(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs(  # type: ignore[misc]
        allowed_chats=frozenset({"-100"}), group_answer_all_chats=frozenset({"-100"})
    )
    migration = replace(
        make_event("", chat_type="group", chat_id="-100200"), migrate_from_chat_id="-100"
    )
    assert not await rig.adapter.deliver(migration)
    rig.model.add(ScriptedModel.reply("still here"))
    assert await rig.adapter.deliver(make_event("hello all", chat_type="group", chat_id="-100200"))
    assert (await rig.adapter.wait_for_sent(1))[0].text == "still here"


async def test_a_migrated_group_keeps_its_session_after_its_key_was_remembered(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    before = make_event("/start", chat_type="group", chat_id="-100", command="start")
    assert await rig.adapter.deliver(before)  # its session key is built and remembered
    key = rig.gateway.session_key_for(before)
    migration = replace(
        make_event("", chat_type="group", chat_id="-100200"), migrate_from_chat_id="-100"
    )
    assert not await rig.adapter.deliver(migration)
    after = make_event("/help", chat_type="group", chat_id="-100200", command="help")
    assert rig.gateway.session_key_for(after) == key
    assert rig.gateway.session_key_for(before) == key


class FlakyStartAdapter(FakeAdapter):
    """Its platform is unreachable for the first ``failures`` starts."""

    def __init__(self, name: str, failures: int) -> None:
        super().__init__(name=name)
        self.failures = failures
        self.started = asyncio.Event()

    async def start(self, on_event: object) -> None:
        if self.failures:
            self.failures -= 1
            raise PlatformError("unreachable", platform=self.name, retryable=True)
        await super().start(on_event)  # type: ignore[arg-type]
        self.started.set()


async def test_an_unreachable_platform_at_boot_does_not_stop_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(gateway_module, "ADAPTER_START_BACKOFF", (0.01, 2.0, 5.0))
    store = SQLiteSessionStore(str(tmp_path / "c.db"))
    down = FlakyStartAdapter("telegram", failures=2)
    up = FakeAdapter(name="whatsapp")
    runner = Runner(
        Agent(name="Helper", instructions=""),
        store,
        model=ScriptedModel([ScriptedModel.reply("hi"), ScriptedModel.reply("hi again")]),
    )
    gateway = Gateway(runner, store, [down, up], Settings(), secret=SECRET)
    try:
        await gateway.start()
        await gateway.wait_ready()
        assert up.is_connected and not down.is_connected
        assert await up.deliver(make_event("hello", platform="whatsapp"))
        await up.wait_for_sent(1)
        await asyncio.wait_for(down.started.wait(), 5)
        assert await down.deliver(make_event("hello", platform="telegram"))
        await down.wait_for_sent(1)
        # The operator sees the back-off, attempt by attempt.
        retries = [r.getMessage() for r in caplog.records if "could not start" in r.getMessage()]
        assert [m.rsplit("; ", 1)[1] for m in retries] == ["retrying in 0 s", "retrying in 2 s"]
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def test_a_wrong_setting_at_boot_still_stops_start_up(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "c.db"))

    class Refused(FakeAdapter):
        async def start(self, on_event: object) -> None:
            raise PlatformError(
                "Unauthorized: check TELEGRAM_BOT_TOKEN", platform="fake", retryable=False
            )

    gateway = _gateway(store, Refused(), ScriptedModel())
    try:
        with pytest.raises(PlatformError, match="TELEGRAM_BOT_TOKEN"):
            await gateway.start()
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def test_adapter_stop_errors_are_logged(
    rigs: Callable[..., object], caplog: pytest.LogCaptureFixture
) -> None:
    class BadStop(FakeAdapter):
        async def stop(self) -> None:
            raise RuntimeError("socket already closed")

    rig: Rig = await rigs(adapter=BadStop())  # type: ignore[misc]
    with caplog.at_level(logging.WARNING, logger="bot.gateway.gateway"):
        await rig.gateway.stop(grace=1)
    assert any("did not stop cleanly" in r.getMessage() for r in caplog.records)


async def test_a_message_that_always_fails_tx1_is_dropped_after_the_poison_limit(
    rigs: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    real_accept = rig.gateway.inbox.accept
    poison = make_event("bad", chat_id="poison-chat")

    async def accept(event: object, **kwargs: str) -> bool:
        if getattr(event, "message_id", None) == poison.message_id:
            raise ValueError("a bug that this message always triggers")
        return await real_accept(event, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rig.gateway.inbox, "accept", accept)
    for _ in range(gateway_module.MAX_ACCEPT_FAILURES - 1):
        with pytest.raises(ValueError, match="always triggers"):
            await rig.adapter.deliver(poison)
    with caplog.at_level(logging.ERROR, logger="bot.gateway.gateway"):
        # The platform can confirm it now; the chats behind it move on.
        assert not await rig.adapter.deliver(poison)
    assert any("dropped" in r.getMessage() for r in caplog.records)
    assert all(poison.message_id not in r.getMessage() for r in caplog.records)
    rig.model.add(ScriptedModel.reply("fine"))
    assert await rig.adapter.deliver(make_event("ok", chat_id="other-chat"))
    await rig.adapter.wait_for_sent(1)


async def test_tx1_failures_during_an_outage_never_drop_the_message(
    rigs: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    event = make_event("hello")

    async def down(*args: object, **kwargs: object) -> bool:
        raise StorageError("disk I/O error")

    async def ping() -> None:
        raise StorageError("disk I/O error")

    monkeypatch.setattr(rig.gateway.inbox, "accept", down)
    monkeypatch.setattr(rig.store, "ping", ping)
    for _ in range(gateway_module.MAX_ACCEPT_FAILURES * 2):
        with pytest.raises(StorageError):
            await rig.adapter.deliver(event)


async def test_tx1_failing_while_the_database_was_away_is_never_poison_once_it_is_back(
    rigs: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each failure said the database was away; by the fifth the database answers again
    (the outage healed): the message is still refused, so the platform redelivers it,
    never confirmed and dropped as poison."""
    rig: Rig = await rigs()  # type: ignore[misc]
    event = make_event("hello")

    async def away(*args: object, **kwargs: object) -> bool:
        raise DatabaseUnavailableError("cannot reach PostgreSQL: connection refused")

    monkeypatch.setattr(rig.gateway.inbox, "accept", away)  # the store's ping still answers
    for _ in range(gateway_module.MAX_ACCEPT_FAILURES * 2):
        with pytest.raises(DatabaseUnavailableError):
            await rig.adapter.deliver(event)


async def test_stop_commits_the_buffered_delivered_marks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.db"
    store = SQLiteSessionStore(str(path))
    adapter = FakeAdapter()
    gateway = _gateway(store, adapter, ScriptedModel([ScriptedModel.reply("Done.")]))
    await gateway.start()
    await gateway.wait_ready()
    real = gateway.ledger._write_delivered

    async def held(marks: Sequence[DeliveredMark]) -> set[str]:
        await gateway._stopping.wait()  # the group commit lands only once stop() began
        return await real(marks)

    monkeypatch.setattr(gateway.ledger, "_write_delivered", held)
    await adapter.deliver(make_event("done?"))
    await adapter.wait_for_sent(1)
    await gateway.stop(grace=5)
    # Read at once, on another connection: no loop turn in between for a late flusher.
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = db.execute("SELECT state FROM chatflow_delivery_obligations").fetchall()
    await store.close()
    assert rows == [("delivered",)]


async def test_a_message_for_a_platform_not_connected_waits_and_is_not_marked_resent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # N3/N6: the operator's message to a platform that is down is never handed to it,
    # so it waits (not "failed"), and after a restart it goes out without the
    # "resent after a restart" marker.
    monkeypatch.setattr(gateway_module, "ADAPTER_START_BACKOFF", (3600.0,))
    path = str(tmp_path / "c.db")
    store = SQLiteSessionStore(path)
    down = FlakyStartAdapter("telegram", failures=1)
    runner = Runner(Agent(name="Helper", instructions=""), store, model=ScriptedModel())
    gateway = Gateway(
        runner, store, [down, FakeAdapter(name="whatsapp")], Settings(), secret=SECRET
    )
    await gateway.start()
    await gateway.wait_ready()
    queued = Obligation.owed(
        obligation_id="operator0001",
        session_key="agent:main:telegram:dm:chat_42",
        session_id="telegram-0123456789abcdef",
        platform="telegram",
        chat_id="42",
        thread_id=None,
        reply_to=None,
        content="Hello from the operator",
        message_ref="operator:1",
    )
    async with store.transaction() as tx:  # as `python -m bot send` queues it
        await DeliveryLedger(store, owner=NOBODY).record_in(tx, queued)
    assert await gateway.outbox.retry_due() == 1
    row = await gateway.ledger.get("operator0001")
    assert row is not None
    assert (row.state, row.attempts) == ("pending", 0)
    assert row.last_error == "waiting: telegram is not connected"
    await gateway.stop(grace=1)
    await store.close()
    monkeypatch.setattr(instances_module, "_current_owner", None)  # a restart: a new instance
    store2 = SQLiteSessionStore(path)
    back = FakeAdapter(name="telegram")
    gateway2 = _gateway(store2, back, ScriptedModel())
    try:
        await gateway2.start()
        (sent,) = await back.wait_for_sent(1)
        assert sent.text == "Hello from the operator"  # no marker: it was never sent
    finally:
        await gateway2.stop(grace=1)
        await store2.close()


async def test_a_failed_turn_logs_its_cause_without_any_text(
    rigs: Callable[..., object], caplog: pytest.LogCaptureFixture
) -> None:
    # N17: the WARNING said only "(ModelError)"; the cause (a 401, a refused connection)
    # was for doctor alone to find.
    rig: Rig = await rigs()  # type: ignore[misc]
    try:
        raise ConnectionRefusedError("connect to 10.0.0.1 refused")
    except ConnectionRefusedError as inner:
        refused = ModelError("provider unreachable")
        refused.__cause__ = inner
    rig.model.add(ModelError("Incorrect API key sk-secret provided", status_code=401))
    rig.model.add(refused)
    with caplog.at_level(logging.WARNING, logger="bot.gateway.turns"):
        for n in range(2):
            await rig.adapter.deliver(make_event(f"hello {n}", message_id=f"fake:{n}"))
            await rig.adapter.wait_for_sent(n + 1)
    lines = [r.getMessage() for r in caplog.records if "turn failed" in r.getMessage()]
    assert [line.split("(", 1)[1].split(")", 1)[0] for line in lines] == [
        "ModelError, HTTP 401",
        "ModelError, ConnectionRefusedError",
    ]
    assert "sk-secret" not in caplog.text and "10.0.0.1" not in caplog.text
