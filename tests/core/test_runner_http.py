"""The Runner end to end: the real openai SDK over HTTP against the fake server
(routing, tool rounds, handoffs, retries, rollback and orphan-free requests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.core.messages import Message, Role, ToolCall
from bot.core.models import INVALID_JSON_ARGUMENTS, ModelSettings, OpenAICompatibleModel, Usage
from bot.core.runner import Runner, RunResult
from bot.core.stores.base import BaseSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import ModelError
from tests.core.runner_support import (
    SID,
    Sleeps,
    capture_contexts,
    clear_tool_log,
    make_agents,
    server,
    snap,
    sqlite_store,
    store,
    stored,
    tool_log,
)
from tests.fakes.openai_server import FakeOpenAIServer

# The fixtures, imported for this module's tests.
__all__ = ["clear_tool_log", "server", "sqlite_store", "store"]


async def test_plain_answer_through_routing_and_http(
    server: FakeOpenAIServer, sqlite_store: SQLiteSessionStore
) -> None:
    triage, _ = make_agents(model="gpt-test")
    settings = ModelSettings(openai_api_key=server.api_key, openai_base_url=server.base_url)
    runner = Runner(triage, sqlite_store, model_settings=settings)
    server.add(server.reply("Hello!", prompt_tokens=12, completion_tokens=3))
    try:
        result = await runner.run_async(SID, "hi", {"lang": "en"})
    finally:
        await runner.aclose()
    assert isinstance(result, RunResult)
    assert (result.content, result.agent, result.session_id) == ("Hello!", "Triage", SID)
    assert [m.role for m in result.new_messages] == [Role.USER, Role.MODEL]
    assert result.usage == Usage(input_tokens=12, output_tokens=3, total=15)
    [request] = server.chat_requests
    assert request.body["model"] == "gpt-test"
    assert request.messages[0] == {"role": "system", "content": "You are triage."}
    assert request.tool_names == ["lookup_order", "explode", "transfer_to_billing"]
    history, agent, metadata = await stored(sqlite_store)
    assert [json.loads(m)["content"] for m in history] == ["hi", "Hello!"]
    assert (agent, json.loads(metadata)) == ("Triage", {"lang": "en"})


async def test_tool_round_over_http(
    server: FakeOpenAIServer, sqlite_store: SQLiteSessionStore
) -> None:
    triage, _ = make_agents()
    model = OpenAICompatibleModel(server.api_key, server.base_url)
    runner = Runner(triage, sqlite_store, model=model)
    server.add(
        server.tool_calls(server.tool_call("lookup_order", {"order_id": "77"}, call_id="c1")),
        server.reply("Order 77 has shipped."),
    )
    try:
        result = await runner.run_async(
            SID, "where is 77?", {"channel": "test"}, inbound_message_id="wamid.1"
        )
    finally:
        await model.aclose()
    assert result.content == "Order 77 has shipped."
    assert [m.role for m in result.new_messages] == [Role.USER, Role.MODEL, Role.TOOL, Role.MODEL]
    tool_message = result.new_messages[2]
    assert tool_message.tool_call_id == "c1"
    assert json.loads(tool_message.content or "") == {"order_id": "77", "status": "shipped"}
    assert tool_log == [
        (
            "lookup_order",
            {
                "order_id": "77",
                "session_id": SID,
                "inbound": "wamid.1",
                "agent": "Triage",
                "metadata": {"channel": "test"},
            },
        )
    ]
    second = server.chat_requests[1]
    assert second.roles == ["system", "user", "assistant", "tool"]
    assert second.messages[2]["tool_calls"][0]["function"] == {
        "name": "lookup_order",
        "arguments": '{"order_id": "77"}',
    }
    assert second.messages[3]["tool_call_id"] == "c1"
    assert server.validation_errors == []


async def test_handoff_answers_in_same_turn_and_resumes_after_reopening(
    server: FakeOpenAIServer, tmp_path: Path
) -> None:
    db = tmp_path / "handoff.db"
    triage, _ = make_agents()
    store = SQLiteSessionStore(db)
    model = OpenAICompatibleModel(server.api_key, server.base_url)
    server.add(
        server.tool_calls(server.tool_call("transfer_to_billing", {}, call_id="h1")),
        server.reply("Billing here: refund started."),
    )
    try:
        result = await Runner(triage, store, model=model).run_async(SID, "I want a refund")
    finally:
        await store.close()
    assert (result.agent, result.content) == ("Billing", "Billing here: refund started.")
    handoff_result = result.new_messages[2]
    assert (handoff_result.role, handoff_result.content) == (Role.TOOL, "Transferred to Billing")
    second = server.chat_requests[1]
    assert second.messages[0]["content"] == "You are billing."  # the new agent's instructions
    assert second.tool_names == ["lookup_order", "transfer_to_triage"]
    assert second.roles == ["system", "user", "assistant", "tool"]  # the whole history

    # A new process: fresh agents, fresh store object on the same file.
    triage2, _ = make_agents()
    reopened = SQLiteSessionStore(db)
    server.add(server.reply("Still billing."))
    try:
        again = await Runner(triage2, reopened, model=model).run_async(SID, "any news?")
        history, agent, _ = await stored(reopened)
    finally:
        await reopened.close()
        await model.aclose()
    assert (again.agent, agent) == ("Billing", "Billing")
    third = server.chat_requests[2]
    assert third.messages[0]["content"] == "You are billing."
    assert third.roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert len(history) == 6
    assert server.validation_errors == []


async def test_500_then_429_then_success_through_the_runner(
    server: FakeOpenAIServer, store: BaseSessionStore
) -> None:
    triage, _ = make_agents()
    sleeps = Sleeps()
    model = OpenAICompatibleModel(server.api_key, server.base_url, sleep=sleeps)
    server.add(server.error(500), server.rate_limited(retry_after=2), server.reply("ok"))
    try:
        result = await Runner(triage, store, model=model).run_async(SID, "hi")
    finally:
        await model.aclose()
    assert result.content == "ok"
    assert [r.status for r in server.chat_requests] == [500, 429, 200]
    assert sleeps.delays[1] == 2.0


@pytest.mark.parametrize("full_window", [False, True], ids=["room-left", "window-full"])
async def test_retries_exhausted_roll_the_session_back_byte_for_byte(
    server: FakeOpenAIServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    full_window: bool,
) -> None:
    triage, _ = make_agents()
    store = SQLiteSessionStore(tmp_path / "rb.db", default_max_turns=2)
    model = OpenAICompatibleModel(server.api_key, server.base_url, max_retries=2, sleep=Sleeps())
    runner = Runner(triage, store, model=model)
    try:
        turns = 2 if full_window else 1
        for index in range(turns):
            server.add(server.reply(f"answer {index}"))
            await runner.run_async(SID, f"question {index}", {"n": index})
        before = await stored(store)
        contexts = capture_contexts(monkeypatch, store)
        server.add(*(server.error(502) for _ in range(3)))
        with pytest.raises(ModelError) as info:
            await runner.run_async(SID, "this one fails", {"n": 99, "extra": True})
        assert info.value.retryable
        assert snap(contexts[0]) == before  # the runner's own context was restored
        assert await stored(store) == before  # and nothing reached the database
        server.add(server.reply("recovered"))
        result = await runner.run_async(SID, "again")
    finally:
        await store.close()
        await model.aclose()
    assert result.content == "recovered"
    assert server.validation_errors == []


async def test_no_request_ever_carries_an_orphan(server: FakeOpenAIServer, tmp_path: Path) -> None:
    """Tools, handoffs, bad arguments, pruning and a stored orphan: the fake server
    (which answers 400 to any orphan, like OpenAI) must never object."""
    triage, _ = make_agents()
    store = SQLiteSessionStore(tmp_path / "orphans.db", default_max_turns=2)
    model = OpenAICompatibleModel(server.api_key, server.base_url, max_retries=0)
    runner = Runner(triage, store, model=model)
    # A stored history with an unanswered call and a stray result, as an older
    # version or a crash might have left it.
    session = await store.get_or_create(SID, triage)
    session.add_message(Message(role=Role.USER, content="old"))
    session.add_message(
        Message(role=Role.MODEL, tool_calls=[ToolCall(id="lost", name="lookup_order")])
    )
    await store.save(session)
    server.add(
        server.tool_calls(
            server.tool_call("lookup_order", '{"order_id": ', call_id="bad"),
            server.tool_call("lookup_order", {"order_id": "5"}, call_id="good"),
        ),
        server.tool_calls(server.tool_call("transfer_to_billing", {}, call_id="h")),
        server.reply("billing answer"),
        server.call("lookup_order", order_id="6"),
        server.reply("done"),
        server.reply("pruned"),
    )
    try:
        first = await runner.run_async(SID, "turn one")
        second = await runner.run_async(SID, "turn two")
        third = await runner.run_async(SID, "turn three")  # prunes turn one and its tools
    finally:
        await store.close()
        await model.aclose()
    assert server.validation_errors == []
    assert all(r.status == 200 for r in server.chat_requests)
    assert (first.content, second.content, third.content) == ("billing answer", "done", "pruned")
    bad_result = first.new_messages[2]
    assert bad_result.tool_call_id == "bad"
    assert json.loads(bad_result.content or "") == {"error": INVALID_JSON_ARGUMENTS}
    # The first request had the stored orphan stripped (and the user runs merged).
    assert server.chat_requests[0].roles == ["system", "user"]
    assert server.chat_requests[0].messages[1]["content"] == "old\n\nturn one"
    last = server.chat_requests[-1]
    assert last.roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert last.messages[1]["content"] == "turn two"


async def test_system_messages_follow_the_instructions(
    server: FakeOpenAIServer, store: BaseSessionStore
) -> None:
    triage, _ = make_agents()
    session = await store.get_or_create(SID, triage)
    session.add_message(Message(role=Role.SYSTEM, content="The customer is a VIP."))
    await store.save(session)
    model = OpenAICompatibleModel(server.api_key, server.base_url)
    server.add(server.reply("ok"))
    try:
        await Runner(triage, store, model=model).run_async(SID, "hi")
    finally:
        await model.aclose()
    assert server.chat_requests[0].messages[0] == {
        "role": "system",
        "content": "You are triage.\n\nThe customer is a VIP.",
    }
