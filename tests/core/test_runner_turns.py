"""Turn semantics of the Runner with the scripted model: what the model sees, usage,
tool problems returned as results, call ids, handoffs and where sessions live."""

from __future__ import annotations

import json
import logging

import pytest

from bot.core.agent import Agent
from bot.core.messages import Role, ToolCall
from bot.core.models import INVALID_JSON_ARGUMENTS, ModelResponse, ScriptedModel, Usage
from bot.core.runner import Runner
from bot.core.stores.base import BaseSessionStore
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from tests.core.runner_support import (
    SID,
    clear_tool_log,
    make_agents,
    sqlite_store,
    store,
    stored,
    tool_log,
)

# The fixtures, imported for this module's tests.
__all__ = ["clear_tool_log", "sqlite_store", "store"]


async def test_scripted_model_sees_instructions_history_and_tools(store: BaseSessionStore) -> None:
    triage, _ = make_agents()
    model = ScriptedModel([ScriptedModel.reply("one"), ScriptedModel.reply("two")])
    runner = Runner(triage, store, model=model)
    await runner.run_async(SID, "first")
    result = await runner.run_async(SID, "second")
    assert result.content == "two"
    call = model.requests[1]
    assert call.system == "You are triage."
    assert call.agent == "Triage"
    assert [(m.role, m.content) for m in call.messages] == [
        (Role.USER, "first"),
        (Role.MODEL, "one"),
        (Role.USER, "second"),
    ]
    assert call.tool_names == ["lookup_order", "explode", "transfer_to_billing"]


async def test_usage_is_summed_over_the_turn(store: BaseSessionStore) -> None:
    triage, _ = make_agents()
    call = ScriptedModel.call("lookup_order", order_id="1")
    call.usage = Usage(input_tokens=10, output_tokens=2)
    model = ScriptedModel([call, ScriptedModel.reply("x", usage=Usage(5, 1))])
    result = await Runner(triage, store, model=model).run_async(SID, "hi")
    assert result.usage == Usage(input_tokens=15, output_tokens=3, total=18)


@pytest.mark.parametrize(
    ("response", "fragment"),
    [
        (ScriptedModel.call("no_such_tool"), "unknown tool 'no_such_tool'"),
        (ScriptedModel.call("transfer_to_nobody"), "no agent to transfer to"),
        (ScriptedModel.call("explode"), "tool 'explode' failed: RuntimeError: kaput"),
        (ScriptedModel.call("lookup_order"), "order_id: Field required"),
        (
            ScriptedModel.calls(
                ToolCall(id="x1", name="lookup_order", arguments={}),
                invalid={"x1": INVALID_JSON_ARGUMENTS},
            ),
            INVALID_JSON_ARGUMENTS,
        ),
    ],
    ids=["unknown-tool", "unknown-handoff", "tool-raises", "invalid-arguments", "invalid-json"],
)
async def test_tool_problems_go_back_to_the_model_as_error_results(
    store: BaseSessionStore, response: ModelResponse, fragment: str
) -> None:
    triage, _ = make_agents()
    model = ScriptedModel([response, ScriptedModel.reply("sorry")])
    result = await Runner(triage, store, model=model).run_async(SID, "hi")
    assert result.content == "sorry"
    error = json.loads(result.new_messages[2].content or "")["error"]
    assert fragment in error
    assert tool_log == []  # the order tool never ran
    assert model.requests[1].messages[-1].role is Role.TOOL


async def test_duplicate_or_empty_call_ids_are_made_unique(store: BaseSessionStore) -> None:
    triage, _ = make_agents()
    model = ScriptedModel(
        [
            ScriptedModel.calls(
                ToolCall(id="same", name="lookup_order", arguments={"order_id": "1"}),
                ToolCall(id="same", name="lookup_order", arguments={"order_id": "2"}),
                ToolCall(id="", name="lookup_order", arguments={}),
                invalid={"": INVALID_JSON_ARGUMENTS},
            ),
            ScriptedModel.reply("done"),
        ]
    )
    result = await Runner(triage, store, model=model).run_async(SID, "hi")
    calls = result.new_messages[1].tool_calls
    ids = [c.id for c in calls]
    assert len(set(ids)) == 3 and all(ids)
    results = [m for m in result.new_messages if m.role is Role.TOOL]
    assert [m.tool_call_id for m in results] == ids
    assert [a["order_id"] for _, a in tool_log] == ["1", "2"]
    assert json.loads(results[2].content or "") == {"error": INVALID_JSON_ARGUMENTS}


async def test_only_the_first_of_two_handoffs_runs(store: BaseSessionStore) -> None:
    triage, _ = make_agents()
    model = ScriptedModel(
        [
            ScriptedModel.calls(("transfer_to_billing", {}), ("transfer_to_billing", {})),
            ScriptedModel.reply("billing"),
        ]
    )
    result = await Runner(triage, store, model=model).run_async(SID, "hi")
    assert result.agent == "Billing"
    results = [m.content for m in result.new_messages if m.role is Role.TOOL]
    assert results[0] == "Transferred to Billing"
    assert "only one handoff" in json.loads(results[1] or "")["error"]


async def test_unknown_stored_agent_falls_back_to_the_starting_agent(
    sqlite_store: SQLiteSessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    retired = Agent("Retired", "old")
    session = await sqlite_store.get_or_create(SID, retired)
    await sqlite_store.save(session)
    triage, _ = make_agents()
    model = ScriptedModel([ScriptedModel.reply("hi")])
    with caplog.at_level(logging.INFO):  # one INFO line: an expected switch (N11)
        result = await Runner(triage, sqlite_store, model=model).run_async(SID, "hello")
    assert result.agent == "Triage"
    assert model.requests[0].system == "You are triage."
    assert "Retired" in caplog.text
    assert (await stored(sqlite_store))[1] == "Triage"


async def test_without_a_store_the_runner_keeps_sessions_in_memory() -> None:
    triage, _ = make_agents()
    model = ScriptedModel([ScriptedModel.reply("a"), ScriptedModel.reply("b")])
    runner = Runner(triage, model=model)
    await runner.run_async(SID, "one")
    await runner.run_async(SID, "two")
    assert len(model.requests[1].messages) == 3
    assert isinstance(runner.store, SessionStore)
    await runner.aclose()
