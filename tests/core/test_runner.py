"""The Runner: turns end to end (real openai SDK over HTTP against the fake server),
handoffs, rollback, commit hooks, per-session serialisation and model validation."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bot.core.agent import Agent, tool
from bot.core.messages import Message, Role, ToolCall
from bot.core.models import (
    INVALID_JSON_ARGUMENTS,
    OFFLINE_PREFIX,
    ModelResponse,
    ModelSettings,
    OpenAICompatibleModel,
    ScriptedModel,
    Usage,
)
from bot.core.models.scripted import RecordedCall
from bot.core.runner import Runner, RunResult
from bot.core.session import SessionContext
from bot.core.stores.base import BaseSessionStore
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.tools import ToolContext
from bot.errors import (
    ChatflowError,
    ConfigurationError,
    EmptyAnswerError,
    MaxToolRoundsError,
    ModelError,
    StorageError,
    TurnError,
)
from tests.fakes.openai_server import FakeOpenAIServer

SID = "test-0123456789abcdef"

tool_log: list[tuple[str, dict[str, Any]]] = []


@tool
def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, str]:
    """Look up an order.

    Args:
        order_id: The order number.
    """
    tool_log.append(
        (
            "lookup_order",
            {
                "order_id": order_id,
                "session_id": ctx.session_id,
                "inbound": ctx.inbound_message_id,
                "agent": ctx.agent_name,
                "metadata": dict(ctx.metadata),
            },
        )
    )
    return {"order_id": order_id, "status": "shipped"}


@tool
async def explode() -> str:
    """Always fails."""
    raise RuntimeError("kaput")


def make_agents(model: str | None = None) -> tuple[Agent, Agent]:
    billing = Agent(
        "Billing",
        "You are billing.",
        model=model,
        tools=[lookup_order],
        handoff_description="Invoices, payments and refunds.",
    )
    triage = Agent(
        "Triage",
        "You are triage.",
        model=model,
        tools=[lookup_order, explode],
        handoffs=[billing],
    )
    billing.handoffs = (triage,)
    return triage, billing


@pytest.fixture(autouse=True)
def _clear_tool_log() -> None:
    tool_log.clear()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SQLiteSessionStore]:
    store = SQLiteSessionStore(tmp_path / "chat.db")
    yield store
    await store.close()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseSessionStore]:
    if request.param == "memory":
        yield SessionStore()
        return
    sqlite = SQLiteSessionStore(tmp_path / "param.db")
    yield sqlite
    await sqlite.close()


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as fake:
        yield fake


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


Snapshot = tuple[list[str], str, str]


def snap(session: SessionContext) -> Snapshot:
    """Everything a turn may change, as bytes-comparable text."""
    return (
        [m.model_dump_json() for m in session.history],
        session.active_agent.name,
        json.dumps(session.metadata, sort_keys=True),
    )


async def stored(store: BaseSessionStore, session_id: str = SID) -> Snapshot:
    session = await store.get(session_id)
    assert session is not None
    return snap(session)


def capture_contexts(
    monkeypatch: pytest.MonkeyPatch, store: BaseSessionStore
) -> list[SessionContext]:
    """Record the contexts the runner loads, to inspect them after a failed turn."""
    seen: list[SessionContext] = []
    original = store.get_or_create

    async def spy(*args: Any, **kwargs: Any) -> SessionContext:
        context = await original(*args, **kwargs)
        seen.append(context)
        return context

    monkeypatch.setattr(store, "get_or_create", spy)
    return seen


# -- end to end over HTTP ---------------------------------------------------------------


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


# -- turn semantics with the scripted model ---------------------------------------------


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


async def test_on_commit_writes_in_the_same_transaction(sqlite_store: SQLiteSessionStore) -> None:
    triage, _ = make_agents()
    async with sqlite_store.transaction() as tx:
        await tx.execute("CREATE TABLE outbox (session_id TEXT, content TEXT)")
    seen: list[RunResult] = []

    async def on_commit(result: RunResult, tx: Any) -> None:
        seen.append(result)
        await tx.execute("INSERT INTO outbox VALUES (?, ?)", (result.session_id, result.content))

    runner = Runner(triage, sqlite_store, model=ScriptedModel([ScriptedModel.reply("hi!")]))
    result = await runner.run_async(SID, "hello", on_commit=on_commit)
    assert seen == [result]
    async with sqlite_store.transaction() as tx:
        rows = await tx.fetchall("SELECT session_id, content FROM outbox")
    assert rows == [(SID, "hi!")]


async def test_failing_on_commit_rolls_back_everything(
    sqlite_store: SQLiteSessionStore,
) -> None:
    triage, _ = make_agents()
    async with sqlite_store.transaction() as tx:
        await tx.execute("CREATE TABLE outbox (content TEXT)")

    async def on_commit(result: RunResult, tx: Any) -> None:
        await tx.execute("INSERT INTO outbox VALUES (?)", (result.content,))
        raise RuntimeError("ledger refused")

    model = ScriptedModel([ScriptedModel.reply("lost"), ScriptedModel.reply("kept")])
    runner = Runner(triage, sqlite_store, model=model)
    with pytest.raises(ChatflowError):
        await runner.run_async(SID, "hello", on_commit=on_commit)
    async with sqlite_store.transaction() as tx:
        assert await tx.fetchall("SELECT * FROM outbox") == []
    assert await sqlite_store.get(SID) is None or (await stored(sqlite_store))[0] == []
    assert (await runner.run_async(SID, "again")).content == "kept"


async def test_cancellation_during_the_commit_keeps_the_committed_turn(
    sqlite_store: SQLiteSessionStore,
) -> None:
    """A commit in flight settles first: memory must match disk, not be rolled back."""
    triage, _ = make_agents()
    async with sqlite_store.transaction() as tx:
        await tx.execute("CREATE TABLE outbox (content TEXT)")
    loop = asyncio.get_running_loop()
    entered, release = asyncio.Event(), threading.Event()

    async def on_commit(result: RunResult, tx: Any) -> None:
        # Runs on the store's database thread (a hook never suspends): it is held
        # there, inside the commit's transaction, while the caller is cancelled.
        loop.call_soon_threadsafe(entered.set)
        release.wait(5)
        await tx.execute("INSERT INTO outbox VALUES (?)", (result.content,))

    model = ScriptedModel([ScriptedModel.reply("committed"), ScriptedModel.reply("next")])
    runner = Runner(triage, sqlite_store, model=model)
    task = asyncio.create_task(runner.run_async(SID, "hello", on_commit=on_commit))
    await entered.wait()
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    history, _, _ = await stored(sqlite_store)
    assert [json.loads(m)["content"] for m in history] == ["hello", "committed"]
    async with sqlite_store.transaction() as tx:
        assert await tx.fetchall("SELECT content FROM outbox") == [("committed",)]
    await runner.run_async(SID, "more")
    assert [m.content for m in model.requests[1].messages] == ["hello", "committed", "more"]


async def test_on_commit_with_the_memory_store_is_a_storage_error() -> None:
    triage, _ = make_agents()
    store = SessionStore()

    async def on_commit(result: RunResult, tx: Any) -> None:
        raise AssertionError("never called")

    runner = Runner(triage, store, model=ScriptedModel([ScriptedModel.reply("x")]))
    with pytest.raises(StorageError):
        await runner.run_async(SID, "hi", on_commit=on_commit)
    assert (await stored(store))[0] == []


async def test_unknown_stored_agent_falls_back_to_the_starting_agent(
    sqlite_store: SQLiteSessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    retired = Agent("Retired", "old")
    session = await sqlite_store.get_or_create(SID, retired)
    await sqlite_store.save(session)
    triage, _ = make_agents()
    model = ScriptedModel([ScriptedModel.reply("hi")])
    with caplog.at_level(logging.WARNING):
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


# -- per-session serialisation ------------------------------------------------------------


def spy_lock(
    monkeypatch: pytest.MonkeyPatch, store: BaseSessionStore, waiting: asyncio.Event, nth: int
) -> None:
    """Set ``waiting`` when the ``nth`` caller asks for a session lock (it may then block)."""
    original = store.session_lock
    count = 0

    @asynccontextmanager
    async def spy(session_id: str) -> AsyncIterator[None]:
        nonlocal count
        count += 1
        if count == nth:
            waiting.set()
        async with original(session_id):
            yield

    lock: Callable[[str], AbstractAsyncContextManager[None]] = spy
    monkeypatch.setattr(store, "session_lock", lock)


def held_reply(entered: asyncio.Event, release: asyncio.Event, text: str) -> Any:
    async def step(call: RecordedCall) -> ModelResponse:
        entered.set()
        await release.wait()
        return ScriptedModel.reply(text)

    return step


@pytest.mark.parametrize("runners", [1, 2], ids=["one-runner", "two-runners"])
async def test_turns_of_one_session_never_interleave(
    sqlite_store: SQLiteSessionStore, monkeypatch: pytest.MonkeyPatch, runners: int
) -> None:
    triage, _ = make_agents()
    entered, release, second_waiting = asyncio.Event(), asyncio.Event(), asyncio.Event()
    model = ScriptedModel(
        [
            ScriptedModel.call("lookup_order", order_id="1"),
            held_reply(entered, release, "first done"),
            ScriptedModel.reply("second done"),
        ]
    )
    runner_a = Runner(triage, sqlite_store, model=model)
    runner_b = runner_a if runners == 1 else Runner(make_agents()[0], sqlite_store, model=model)
    spy_lock(monkeypatch, sqlite_store, second_waiting, nth=2)
    async with asyncio.timeout(10):
        first = asyncio.create_task(runner_a.run_async(SID, "first"))
        await entered.wait()  # the first turn is inside its second model call
        second = asyncio.create_task(runner_b.run_async(SID, "second"))
        await second_waiting.wait()
        assert len(model.requests) == 2  # the second turn has not reached the model
        release.set()
        results = await asyncio.gather(first, second)
    assert [r.content for r in results] == ["first done", "second done"]
    seen = [(m.role, m.content) for m in model.requests[2].messages]
    assert seen[:2] == [(Role.USER, "first"), (Role.MODEL, None)]
    assert seen[2][0] is Role.TOOL
    assert seen[3:] == [(Role.MODEL, "first done"), (Role.USER, "second")]


async def test_different_sessions_run_in_parallel(sqlite_store: SQLiteSessionStore) -> None:
    triage, _ = make_agents()
    entered, release = asyncio.Event(), asyncio.Event()
    model = ScriptedModel([held_reply(entered, release, "slow"), ScriptedModel.reply("fast")])
    runner = Runner(triage, sqlite_store, model=model)
    async with asyncio.timeout(10):
        slow = asyncio.create_task(runner.run_async("test-aaaaaaaaaaaaaaaa", "slow"))
        await entered.wait()
        fast = await runner.run_async("test-bbbbbbbbbbbbbbbb", "fast")  # not blocked by slow
        assert fast.content == "fast"
        assert not slow.done()
        release.set()
        assert (await slow).content == "slow"


# -- construction and model validation ------------------------------------------------------


def test_duplicate_agent_names_are_rejected() -> None:
    a = Agent("Support", "one")
    b = Agent("Support", "two")
    root = Agent("Root", "", handoffs=[a])
    a.handoffs = (b,)
    with pytest.raises(ValueError, match="Support"):
        Runner(root, model=ScriptedModel())


def test_all_reachable_agents_are_registered_as_resolver(sqlite_store: SQLiteSessionStore) -> None:
    triage, billing = make_agents()
    runner = Runner(triage, sqlite_store, model=ScriptedModel())
    assert runner.get_agent("Billing") is billing
    assert set(runner.agents) == {"Triage", "Billing"}
    assert sqlite_store._resolve_agent("Billing") is billing


@pytest.mark.parametrize(
    ("model", "setting"),
    [("claude-3-opus", "DEFAULT_MODEL"), ("gpt-4o", "OPENAI_API_KEY")],
    ids=["unroutable", "missing-key"],
)
def test_bad_models_fail_at_construction(model: str, setting: str) -> None:
    billing = Agent("Billing", "", model=model)
    triage = Agent("Triage", "", model="offline", handoffs=[billing])
    store = SessionStore()
    with pytest.raises(ConfigurationError) as info:
        Runner(triage, store)
    assert info.value.setting == setting


def test_bad_default_model_fails_at_construction() -> None:
    with pytest.raises(ConfigurationError) as info:
        Runner(Agent("A", ""), model_settings=ModelSettings(default_model="mystery-9"))
    assert info.value.setting == "DEFAULT_MODEL"


async def test_no_key_and_no_default_model_runs_offline_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    triage, _ = make_agents()
    with caplog.at_level(logging.WARNING, logger="bot.core.runner"):
        runner = Runner(triage)
    warnings = [r for r in caplog.records if r.name == "bot.core.runner"]
    assert len(warnings) == 1
    assert "offline" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()
    result = await runner.run_async(SID, "refund for order #12 please")
    await runner.aclose()
    assert result.agent == "Billing"
    assert result.content.startswith(OFFLINE_PREFIX)
    assert "shipped" in result.content  # Billing looked the order up after the handoff
    assert tool_log[0][1]["order_id"] == "12"


async def test_default_model_from_settings_routes_agents_without_a_model(
    server: FakeOpenAIServer,
) -> None:
    triage, _ = make_agents()
    settings = ModelSettings(
        openai_api_key=server.api_key,
        openai_base_url=server.base_url,
        default_model="openai/local-model",
    )
    runner = Runner(triage, model_settings=settings)
    server.add(server.reply("from the default"))
    try:
        result = await runner.run_async(SID, "hi")
    finally:
        await runner.aclose()
    assert result.content == "from the default"
    assert server.chat_requests[0].body["model"] == "local-model"


# -- settings from the environment (B1) ---------------------------------------------------


async def test_runner_reads_openai_key_and_base_url_from_the_environment(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    triage, _ = make_agents()  # no model named: the key picks gpt-4o-mini
    server.add(server.reply("real answer"))
    async with Runner(triage) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content == "real answer"
    [request] = server.chat_requests
    assert request.body["model"] == "gpt-4o-mini"
    assert request.headers["authorization"] == f"Bearer {server.api_key}"


async def test_named_openai_model_uses_the_key_from_the_environment(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    server.add(server.reply("from gpt"))
    async with Runner(Agent("B", "", model="gpt-4o-mini")) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content == "from gpt"


async def test_default_model_and_ollama_url_come_from_the_environment(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake server stands in for Ollama, which takes the fixed key "ollama".
    server.api_key = "ollama"
    monkeypatch.setenv("DEFAULT_MODEL", "ollama/llama3.2")
    monkeypatch.setenv("OLLAMA_BASE_URL", server.base_url)
    server.add(server.reply("local answer"))
    async with Runner(Agent("A", "")) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content == "local answer"
    assert server.chat_requests[0].body["model"] == "llama3.2"


@pytest.mark.parametrize(
    ("env", "raises"),
    [({"GEMINI_API_KEY": "g-key"}, False), ({"GEMINI_API_KEY": ""}, True), ({}, True)],
    ids=["key-set", "key-empty", "key-unset"],
)
async def test_gemini_key_from_the_environment(
    env: dict[str, str], raises: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    agent = Agent("G", "", model="gemini-2.5-flash")
    if raises:
        with pytest.raises(ConfigurationError) as info:
            Runner(agent)
        assert info.value.setting == "GEMINI_API_KEY"
    else:
        async with Runner(agent):  # resolves, no network until a turn
            pass


async def test_model_timeout_comes_from_the_environment(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("MODEL_TIMEOUT_SECONDS", "0.3")
    server.add(server.held(server.reply("too late")))  # released when the server stops
    async with Runner(Agent("A", "")) as runner:
        # The outer deadline only keeps a regression from hanging the suite.
        async with asyncio.timeout(20):
            with pytest.raises(ModelError):
                await runner.run_async(SID, "hi")


def test_bad_model_timeout_in_the_environment_names_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MODEL_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ConfigurationError) as info:
        Runner(Agent("A", ""))
    assert info.value.setting == "MODEL_TIMEOUT_SECONDS"


async def test_explicit_settings_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("DEFAULT_MODEL", "gpt-4o")
    async with Runner(Agent("A", ""), model_settings=ModelSettings()) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content.startswith(OFFLINE_PREFIX)


async def test_runner_accepts_the_app_settings(server: FakeOpenAIServer) -> None:
    from bot.config import Settings

    settings = Settings(
        openai_api_key=server.api_key,
        openai_base_url=server.base_url,
        default_model="gpt-4o",
    )
    server.add(server.reply("via Settings"))
    async with Runner(Agent("A", ""), model_settings=settings) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content == "via Settings"
    assert server.chat_requests[0].body["model"] == "gpt-4o"


@pytest.mark.parametrize(
    "bad",
    [{"openai_api_key": "sk-x", "default_model": "gpt-4o"}, "gpt-4o", object()],
    ids=["dict", "str", "object"],
)
def test_model_settings_of_another_type_raise_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="ModelSettings"):
        Runner(Agent("A", ""), model_settings=bad)  # type: ignore[arg-type]


async def test_api_key_never_reaches_a_log_or_a_repr(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-very-secret-0123456789"
    server.api_key = secret
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("GEMINI_API_KEY", "g-very-secret-0123456789")
    triage, _ = make_agents()
    server.add(server.reply("fine"), server.error(400, "bad request"))
    with caplog.at_level(logging.DEBUG):
        async with Runner(triage) as runner:
            await runner.run_async(SID, "hi")
            with pytest.raises(ModelError) as info:
                await runner.run_async(SID, "again")
            texts = [
                repr(ModelSettings.from_env()),
                str(ModelSettings.from_env()),
                repr(runner),
                str(info.value),
                *(repr(model) for model, _ in runner._models.values()),
            ]
    texts.append(caplog.text)
    for text in texts:
        assert secret not in text
        assert "g-very-secret" not in text


# -- async with -------------------------------------------------------------------------


async def test_runner_is_an_async_context_manager_that_closes(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    closed: list[Runner] = []
    original = Runner.aclose

    async def spy(self: Runner) -> None:
        closed.append(self)
        await original(self)

    monkeypatch.setattr(Runner, "aclose", spy)
    server.add(server.reply("hi"))
    made = Runner(Agent("A", ""))
    async with made as runner:
        assert runner is made
        await runner.run_async(SID, "hello")
        assert closed == []
    assert closed == [made]


async def test_async_with_closes_the_runner_when_the_block_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[Runner] = []
    original = Runner.aclose

    async def spy(self: Runner) -> None:
        closed.append(self)
        await original(self)

    monkeypatch.setattr(Runner, "aclose", spy)
    with pytest.raises(LookupError):
        async with Runner(Agent("A", ""), model=ScriptedModel()) as runner:
            raise LookupError("user code failed")
    assert closed == [runner]


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
