"""A failed turn leaves the session as it was: model, tool-round, storage and
cancellation failures, and a blank final answer (B6)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from bot.core.models import ModelResponse, ScriptedModel
from bot.core.models.scripted import RecordedCall
from bot.core.runner import Runner
from bot.core.session import SessionContext
from bot.core.stores.base import BaseSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import EmptyAnswerError, MaxToolRoundsError, ModelError, StorageError, TurnError
from tests.core.runner_support import (
    SID,
    capture_contexts,
    clear_tool_log,
    make_agents,
    snap,
    sqlite_store,
    store,
    stored,
    tool_log,
)

# The fixtures, imported for this module's tests.
__all__ = ["clear_tool_log", "sqlite_store", "store"]


async def test_handoff_is_rolled_back_when_the_new_agent_fails(
    store: BaseSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    triage, _ = make_agents()
    model = ScriptedModel(
        [
            ScriptedModel.reply("hello"),
            ScriptedModel.call("transfer_to_billing"),
            ModelError("billing model down", retryable=True),
        ]
    )
    runner = Runner(triage, store, model=model)
    await runner.run_async(SID, "hi", {"k": "v"})
    before = await stored(store)
    contexts = capture_contexts(monkeypatch, store)
    with pytest.raises(ModelError):
        await runner.run_async(SID, "refund please", {"k": "changed"})
    assert model.requests[2].agent == "Billing"  # the handoff did happen inside the turn
    assert snap(contexts[0]) == before
    assert await stored(store) == before
    assert before[1] == "Triage"


async def test_too_many_tool_rounds_raise_and_roll_back(store: BaseSessionStore) -> None:
    triage, _ = make_agents()
    model = ScriptedModel([ScriptedModel.call("lookup_order", order_id=str(i)) for i in range(3)])
    runner = Runner(triage, store, model=model, max_tool_rounds=2)
    with pytest.raises(MaxToolRoundsError):
        await runner.run_async(SID, "loop")
    assert len(tool_log) == 2  # the third round was refused before running
    assert (await stored(store))[0] == []


async def test_unexpected_exception_becomes_turn_error(store: BaseSessionStore) -> None:
    triage, _ = make_agents()
    runner = Runner(triage, store, model=ScriptedModel([RuntimeError("bug in a model")]))
    with pytest.raises(TurnError) as info:
        await runner.run_async(SID, "hi")
    assert isinstance(info.value.__cause__, RuntimeError)
    assert (await stored(store))[0] == []


async def test_save_failure_rolls_back(
    store: BaseSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    triage, _ = make_agents()
    runner = Runner(triage, store, model=ScriptedModel([ScriptedModel.reply("a")] * 3))
    await runner.run_async(SID, "one")
    before = await stored(store)
    contexts = capture_contexts(monkeypatch, store)

    async def broken_save(session: SessionContext, **kwargs: Any) -> None:
        raise StorageError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(store, "save", broken_save)
        with pytest.raises(StorageError):
            await runner.run_async(SID, "two", {"x": 1})
    assert snap(contexts[0]) == before
    assert await stored(store) == before
    await runner.run_async(SID, "three")
    assert [json.loads(m)["content"] for m in (await stored(store))[0]] == [
        "one",
        "a",
        "three",
        "a",
    ]


async def test_cancellation_rolls_back_and_propagates(
    store: BaseSessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    triage, _ = make_agents()
    entered = asyncio.Event()

    async def hang(call: RecordedCall) -> ModelResponse:
        entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    model = ScriptedModel([ScriptedModel.reply("first"), hang, ScriptedModel.reply("after")])
    runner = Runner(triage, store, model=model)
    await runner.run_async(SID, "one")
    before = await stored(store)
    contexts = capture_contexts(monkeypatch, store)
    task = asyncio.create_task(runner.run_async(SID, "two", {"x": 1}))
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert snap(contexts[0]) == before
    assert await stored(store) == before
    assert (await runner.run_async(SID, "three")).content == "after"  # the lock was released


# -- a blank final answer (B6) ----------------------------------------------------------


async def _raw_rows(path: Path) -> list[tuple[Any, ...]]:
    """Every session and message row of the database file, as stored."""

    def read() -> list[tuple[Any, ...]]:
        import sqlite3

        with contextlib.closing(sqlite3.connect(path)) as db:
            return [
                *db.execute("SELECT * FROM chatflow_sessions ORDER BY session_id"),
                *db.execute("SELECT * FROM chatflow_messages ORDER BY session_id, seq"),
            ]

    return await asyncio.to_thread(read)


@pytest.mark.parametrize(
    "blank",
    [
        pytest.param(ModelResponse(content=""), id="empty"),
        pytest.param(ModelResponse(content=" \n\t "), id="whitespace"),
        pytest.param(ModelResponse(content=None), id="none"),
    ],
)
async def test_blank_final_answer_raises_and_leaves_the_session_as_it_was(
    blank: ModelResponse,
    sqlite_store: SQLiteSessionStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    triage, _ = make_agents()
    model = ScriptedModel([ScriptedModel.reply("first answer"), blank])
    runner = Runner(triage, sqlite_store, model=model)
    await runner.run_async(SID, "hi", {"k": "v"})
    before_rows = await _raw_rows(tmp_path / "chat.db")
    before = await stored(sqlite_store)
    contexts = capture_contexts(monkeypatch, sqlite_store)
    with pytest.raises(EmptyAnswerError) as info:
        await runner.run_async(SID, "say nothing", {"k": "changed"})
    assert isinstance(info.value, ModelError)  # the gateway's rollback-and-apology path
    assert snap(contexts[0]) == before
    assert await stored(sqlite_store) == before
    assert await _raw_rows(tmp_path / "chat.db") == before_rows


async def test_blank_answer_after_a_tool_round_rolls_the_tool_round_back(
    store: BaseSessionStore,
) -> None:
    triage, _ = make_agents()
    model = ScriptedModel(
        [
            ScriptedModel.call("transfer_to_billing"),
            ScriptedModel.call("lookup_order", order_id="5"),
            ModelResponse(content="   "),
        ]
    )
    runner = Runner(triage, store, model=model)
    with pytest.raises(EmptyAnswerError):
        await runner.run_async(SID, "where is 5?")
    assert tool_log[0][1]["order_id"] == "5"  # the tool did run inside the turn
    session = await store.get(SID)
    assert session is None or (session.history == [] and session.active_agent.name == "Triage")


async def test_tool_calls_without_text_are_not_a_blank_answer(store: BaseSessionStore) -> None:
    triage, _ = make_agents()
    model = ScriptedModel(
        [
            ScriptedModel.calls(("lookup_order", {"order_id": "1"}), content=""),
            ScriptedModel.reply("ok"),
        ]
    )
    result = await Runner(triage, store, model=model).run_async(SID, "hi")
    assert result.content == "ok"
