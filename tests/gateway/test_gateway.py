"""The gateway loop in one process: fake adapter, scripted model, SQLite on disk."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.core.models.base import ModelResponse
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import ModelError, PlatformError, StorageError
from bot.gateway.dispatcher import DispatcherBusyError
from bot.gateway.events import MessageEvent
from bot.gateway.gateway import Replies
from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.fakes.adapter import FakeAdapter, make_event, transient
from tests.gateway.conftest import Rig


async def test_a_dm_is_answered_once_and_quotes_the_message(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("Hi there!"))
    event = make_event("hello")
    assert await rig.adapter.deliver(event)
    sent = await rig.adapter.wait_for_sent(1)
    assert sent[0].text == "Hi there!"
    assert sent[0].chat_id == "chat-1"
    assert sent[0].reply_to == event.platform_message_id
    status = await rig.gateway.ledger.status()
    assert status.get("delivered") == 1


async def test_same_message_delivered_five_times_concurrently_gives_one_turn(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("once"))
    event = make_event("hello")
    results = await asyncio.gather(*(rig.adapter.deliver(event) for _ in range(5)))
    assert sorted(results) == [False, False, False, False, True]
    await rig.adapter.wait_for_sent(1)
    assert await rig.gateway._dispatcher.drain(5)
    assert [s.text for s in rig.adapter.sent] == ["once"]
    assert len(rig.model.requests) == 1


async def test_groups_answer_only_when_addressed(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("yes?"))
    plain = make_event("just chatting", chat_type="group", chat_id="g1")
    mention = make_event("@bot help", chat_type="group", chat_id="g1", mentions_bot=True)
    assert not await rig.adapter.deliver(plain)
    assert await rig.adapter.deliver(mention)
    sent = await rig.adapter.wait_for_sent(1)
    assert sent[0].text == "yes?"
    assert len(rig.model.requests) == 1


async def test_group_listed_in_answer_all_chats_gets_every_message(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs(group_answer_all_chats=frozenset({"g2"}))  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("ok"))
    assert await rig.adapter.deliver(make_event("hi all", chat_type="group", chat_id="g2"))
    await rig.adapter.wait_for_sent(1)


async def test_allowlist_ignores_strangers(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs(allowed_users=frozenset({"friend"}))  # type: ignore[misc]
    assert not await rig.adapter.deliver(make_event("hi", sender_id="stranger"))
    rig.model.add(ScriptedModel.reply("hello friend"))
    assert await rig.adapter.deliver(make_event("hi", sender_id="friend", chat_id="c2"))
    assert (await rig.adapter.wait_for_sent(1))[0].text == "hello friend"


async def test_turns_of_one_session_keep_their_order(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(*(ScriptedModel.reply(f"answer {n}") for n in range(5)))
    for n in range(5):
        assert await rig.adapter.deliver(make_event(f"question {n}"))
    sent = await rig.adapter.wait_for_sent(5)
    assert [s.text for s in sent] == [f"answer {n}" for n in range(5)]
    # the model saw each question after the previous answer
    last = rig.model.requests[-1].messages
    assert [m.content for m in last if m.role.value == "user"] == [
        f"question {n}" for n in range(5)
    ]


async def test_failed_turn_sends_one_apology_and_leaves_the_session_as_it_was(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("first answer"))
    await rig.adapter.deliver(make_event("first"))
    await rig.adapter.wait_for_sent(1)
    session_id = rig.gateway._dispatcher  # placeholder to keep lints quiet
    del session_id
    sessions = await rig.store.list_sessions()
    before = await rig.store.get(sessions[0])
    assert before is not None
    rig.model.add(ModelError("provider down", retryable=True))
    event = make_event("second")
    await rig.adapter.deliver(event)
    sent = await rig.adapter.wait_for_sent(2)
    assert sent[1].text == Replies().apology
    after = await rig.store.get(sessions[0])
    assert after is not None
    assert after.history == before.history
    async with rig.store.transaction() as tx:
        waiting = await tx.fetchall("SELECT 1 FROM chatflow_inbox WHERE state = 'received'")
    assert waiting == []


async def test_media_without_caption_gets_the_text_only_answer(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    await rig.adapter.deliver(make_event("", media_kind="photo"))
    sent = await rig.adapter.wait_for_sent(1)
    assert sent[0].text == Replies().media_only
    assert rig.model.requests == []


async def test_reset_command_forgets_the_conversation(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("noted"), ScriptedModel.reply("fresh"))
    await rig.adapter.deliver(make_event("remember 42"))
    await rig.adapter.wait_for_sent(1)
    await rig.adapter.deliver(make_event("/reset", command="reset"))
    assert (await rig.adapter.wait_for_sent(2))[1].text == Replies().reset
    await rig.adapter.deliver(make_event("what did I say?"))
    await rig.adapter.wait_for_sent(3)
    users = [m.content for m in rig.model.requests[-1].messages if m.role.value == "user"]
    assert users == ["what did I say?"]


async def test_retry_after_keeps_the_reply_and_spends_no_attempt(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.adapter.fail_next.append(transient("slow down", retry_after=30))
    rig.model.add(ScriptedModel.reply("later"))
    await rig.adapter.deliver(make_event("hi"))
    assert await rig.gateway._dispatcher.drain(5)
    rows = await rig.gateway.ledger.list_obligations(state="failed")
    assert len(rows) == 1
    assert rows[0].attempts == 0
    assert rig.adapter.sent == []


async def test_permanent_send_error_abandons_with_a_reason(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.adapter.fail_next.append(PlatformError("blocked by user", platform="fake"))
    rig.model.add(ScriptedModel.reply("hello"))
    await rig.adapter.deliver(make_event("hi"))
    assert await rig.gateway._dispatcher.drain(5)
    rows = await rig.gateway.ledger.list_obligations(state="abandoned")
    assert len(rows) == 1
    assert "blocked" in (rows[0].last_error or "")


async def test_ledger_write_failure_is_logged_and_the_reply_still_sent(
    rigs: Callable[..., object],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    real = rig.store.run

    async def flaky_run(body: Any, **options: Any) -> Any:
        # Every write after the reply left (mark_delivered) fails.
        if rig.adapter.sent:
            raise StorageError("disk full")
        return await real(body, **options)

    rig.model.add(ScriptedModel.reply("still here"))
    monkeypatch.setattr(rig.store, "run", flaky_run)
    with caplog.at_level(logging.WARNING):
        await rig.adapter.deliver(make_event("hi"))
        sent = await rig.adapter.wait_for_sent(1)
        assert await rig.gateway._dispatcher.drain(5)
    assert sent[0].text == "still here"
    assert any("disk full" in r.getMessage() or r.exc_info for r in caplog.records)
    # The outcome waits in memory and lands once the database writes again.
    assert rig.gateway.ledger.unrecorded == 1
    monkeypatch.setattr(rig.store, "run", real)
    assert await rig.gateway.ledger.record_unrecorded() == 0
    assert (await rig.gateway.ledger.status()).get("delivered") == 1


async def test_unconnected_adapter_keeps_its_rows_without_spending_attempts(
    rigs: Callable[..., object], tmp_path: Path
) -> None:
    first: Rig = await rigs()  # type: ignore[misc]
    first.model.add(ScriptedModel.reply("owed"))
    first.adapter.fail_next.append(transient("network down"))
    await first.adapter.deliver(make_event("hi"))
    assert await first.gateway._dispatcher.drain(5)
    await first.gateway.stop(grace=1)
    await first.store.close()
    # As if the process had died in the middle of the send: a dead owner, 'attempting'.
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    async with store.transaction() as tx:
        await tx.execute(
            "UPDATE chatflow_delivery_obligations SET owner_pid = 999999999, state = 'attempting'"
        )
    await store.close()

    offline: Rig = await rigs(connected=False)  # type: ignore[misc]
    rows = await offline.gateway.ledger.list_obligations()
    assert [r.attempts for r in rows] == [1]
    await offline.gateway.stop(grace=1)
    await offline.store.close()

    online: Rig = await rigs()  # type: ignore[misc]
    sent = await online.adapter.wait_for_sent(1)
    assert sent[0].text.startswith(RECOVERED_MARKER)
    assert sent[0].text.endswith("owed")


async def test_a_failed_send_is_retried_in_process_when_due(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.adapter.fail_next.append(transient("connection reset"))
    rig.model.add(ScriptedModel.reply("second time lucky"))
    await rig.adapter.deliver(make_event("hi"))
    assert await rig.gateway._dispatcher.drain(5)
    assert rig.adapter.sent == []
    assert await rig.gateway.retry_due() == 0  # backoff not over yet
    async with rig.store.transaction() as tx:
        await tx.execute("UPDATE chatflow_delivery_obligations SET next_attempt_at = 0")
    assert await rig.gateway.retry_due() == 1
    assert [s.text for s in rig.adapter.sent] == ["second time lucky"]
    assert (await rig.gateway.ledger.status())["delivered"] == 1


async def test_operator_retry_of_an_abandoned_reply_is_sent_by_the_next_sweep(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.adapter.fail_next.append(PlatformError("chat not found", platform="fake"))
    rig.model.add(ScriptedModel.reply("try me again"))
    await rig.adapter.deliver(make_event("hi"))
    assert await rig.gateway._dispatcher.drain(5)
    (row,) = await rig.gateway.ledger.list_obligations(state="abandoned")
    assert await rig.gateway.ledger.retry(row.obligation_id)
    assert await rig.gateway.retry_due(sweep=True) == 1
    assert [s.text for s in rig.adapter.sent] == ["try me again"]


async def test_failed_status_is_recorded_against_its_obligation(
    rigs: Callable[..., object],
) -> None:
    adapter = FakeAdapter()  # on_status_failed is None until the gateway installs its handler
    rig: Rig = await rigs(adapter=adapter)  # type: ignore[misc]
    handler = adapter.on_status_failed
    assert handler is not None
    rig.model.add(ScriptedModel.reply("delivered, then failed"))
    await rig.adapter.deliver(make_event("hi"))
    assert await rig.gateway._dispatcher.drain(5)
    (row,) = await rig.gateway.ledger.list_obligations(state="delivered")
    await handler(row.sent_ids[0], "131026 undeliverable")
    again = await rig.gateway.ledger.get(row.obligation_id)
    assert again is not None and "131026" in (again.last_error or "")


async def test_the_user_sees_typing_while_a_slow_turn_runs(
    rigs: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    shown = asyncio.Event()
    real = rig.adapter.indicate_typing

    async def indicate_typing(event: MessageEvent) -> None:
        await real(event)
        shown.set()

    async def thinking(_: object) -> ModelResponse:
        await shown.wait()  # the model answers only once "typing" is on screen
        return ScriptedModel.reply("done thinking")

    monkeypatch.setattr(rig.adapter, "indicate_typing", indicate_typing)
    rig.model.add(thinking)
    await rig.adapter.deliver(make_event("hi"))
    assert [s.text for s in await rig.adapter.wait_for_sent(1)] == ["done thinking"]
    assert rig.adapter.typing == 1


async def test_a_fast_answer_costs_no_typing_call(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("instant"))
    await rig.adapter.deliver(make_event("hi"))
    await rig.adapter.wait_for_sent(1)
    assert rig.gateway._dispatcher is not None and await rig.gateway._dispatcher.drain(5)
    assert rig.adapter.typing == 0


async def test_stop_lets_a_turn_in_flight_finish_and_refuses_new_messages(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    in_model = asyncio.Event()
    release = asyncio.Event()

    async def slow(_: object) -> ModelResponse:
        in_model.set()
        await release.wait()
        return ScriptedModel.reply("finished after the stop began")

    rig.model.add(slow)
    await rig.adapter.deliver(make_event("hi"))
    await asyncio.wait_for(in_model.wait(), 5)
    stopping = asyncio.create_task(rig.gateway.stop(grace=10))
    await asyncio.sleep(0)  # let stop() run up to its wait for the turn
    assert not stopping.done()
    with pytest.raises(DispatcherBusyError):
        await rig.adapter.deliver(make_event("too late"))
    release.set()
    await asyncio.wait_for(stopping, 10)
    assert [s.text for s in rig.adapter.sent] == ["finished after the stop began"]
    assert (await rig.gateway.ledger.status())["delivered"] == 1
