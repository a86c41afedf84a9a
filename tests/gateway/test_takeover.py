"""Human takeover on the message path: no bot turn while a person answers, exactly.

Covers new messages, messages already queued when the takeover began, turns
recovered from the journal after a restart, the operator's replies through the
ledger (once, even when the form is sent twice), "Hand back" with the person's
messages in the bot's next history, and the state shared through the table.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.human_handoff import TRANSFER_TO_HUMAN, transfer_to_human
from bot.core.messages import Role
from bot.core.models.base import ModelResponse
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.postgres import PostgresSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.tools import FunctionTool, tool
from bot.gateway.gateway import Gateway
from bot.gateway.inbox import Inbox
from bot.gateway.ledger.obligations import RECOVERED_MARKER
from bot.gateway.takeover import OPERATOR_NAME, OperatorDesk, TakenOverError, Takeovers
from tests.fakes.adapter import FakeAdapter, make_event
from tests.gateway.conftest import SECRET, Rig
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]

ROOT = Path(__file__).resolve().parents[2]


def desk_of(rig: Rig) -> OperatorDesk:
    gateway = rig.gateway
    return OperatorDesk(gateway.store, gateway.ledger, gateway.outbox, gateway.adapters)


async def inbox_states(store: SQLiteSessionStore) -> list[tuple[str, str | None]]:
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT state, error FROM chatflow_inbox ORDER BY received_at")
    return [(str(r[0]), r[1]) for r in rows]


async def first_session(rig: Rig) -> str:
    sessions = await rig.store.list_sessions()
    assert len(sessions) == 1
    return sessions[0]


async def test_no_turn_while_taken_over_and_the_message_is_kept(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("Hello!"))
    assert await rig.adapter.deliver(make_event("hi", message_id="fake:chat-1:1"))
    await rig.adapter.wait_for_sent(1)
    session_id = await first_session(rig)
    await rig.gateway.turns.takeovers.take_over(session_id)

    assert await rig.adapter.deliver(make_event("I want a person", message_id="fake:chat-1:2"))
    assert not await rig.adapter.deliver(make_event("I want a person", message_id="fake:chat-1:2"))
    assert await rig.gateway._dispatcher.drain(5)

    assert len(rig.model.requests) == 1  # the first turn only
    assert len(rig.adapter.sent) == 1
    session = await rig.store.get(session_id)
    assert session is not None
    assert [(m.role, m.content) for m in session.history][-1] == (Role.USER, "I want a person")
    assert await inbox_states(rig.store) == [("done", None), ("done", "taken over")]


async def test_a_takeover_stops_the_turn_in_flight_and_the_person_answers_at_once(
    rigs: Callable[..., object],
) -> None:
    """F4: the model is still answering when the person takes over and replies."""
    rig: Rig = await rigs()  # type: ignore[misc]
    asked = asyncio.Event()
    never = asyncio.Event()

    async def held(call: RecordedCall) -> ModelResponse:
        asked.set()
        await never.wait()  # released only by a cancellation
        return ModelResponse(content="BOT: the answer the model was writing")

    rig.model.add(ScriptedModel.reply("Hi!"), held)
    assert await rig.adapter.deliver(make_event("hi", message_id="fake:chat-1:1"))
    await rig.adapter.wait_for_sent(1)
    assert await rig.adapter.deliver(make_event("my order?", message_id="fake:chat-1:2"))
    await asyncio.wait_for(asked.wait(), 5)
    session_id = await first_session(rig)

    await rig.gateway.turns.takeovers.take_over(session_id)
    # The reply takes the session lock the turn held: it must not wait for the model.
    assert await asyncio.wait_for(desk_of(rig).reply(session_id, "HUMAN: Anna here."), 5)
    sent = await rig.adapter.wait_for_sent(2)
    assert await rig.gateway._dispatcher.drain(5)
    assert [s.text for s in sent] == ["Hi!", "HUMAN: Anna here."]
    session = await rig.store.get(session_id)
    assert session is not None
    assert [(m.role, m.content) for m in session.history][-2:] == [
        (Role.USER, "my order?"),
        (Role.MODEL, "HUMAN: Anna here."),
    ]
    assert await inbox_states(rig.store) == [("done", None), ("done", "taken over")]
    await rig.gateway.ledger.flush()
    status = await rig.gateway.ledger.status()
    assert status["attempting"] == status["pending"] == status["failed"] == 0


async def test_a_commit_after_a_takeover_rolls_back(rigs: Callable[..., object]) -> None:
    """The decision is made in tx 2: a takeover noted before it refuses the commit."""
    rig: Rig = await rigs()  # type: ignore[misc]
    takeovers = rig.gateway.turns.takeovers
    await takeovers.take_over("fake-0123456789abcdef")
    with pytest.raises(TakenOverError):
        async with rig.store.transaction() as tx:
            await takeovers.check_in(tx, "fake-0123456789abcdef")
    async with rig.store.transaction() as tx:
        await takeovers.check_in(tx, "fake-fedcba9876543210")  # another conversation


async def test_operator_reply_goes_through_the_ledger_once_and_the_bot_sees_it(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("Hello!"))
    assert await rig.adapter.deliver(make_event("hi", message_id="fake:chat-1:1"))
    await rig.adapter.wait_for_sent(1)
    session_id = await first_session(rig)
    takeovers = rig.gateway.turns.takeovers
    await takeovers.take_over(session_id)
    desk = desk_of(rig)

    assert await desk.reply(session_id, "A person here: <b>hi</b>", nonce="a" * 32)
    assert not await desk.reply(session_id, "A person here: <b>hi</b>", nonce="a" * 32)
    sent = await rig.adapter.wait_for_sent(2)
    assert [(s.chat_id, s.text) for s in sent[1:]] == [("chat-1", "A person here: <b>hi</b>")]
    await rig.gateway.ledger.flush()
    status = await rig.gateway.ledger.status()
    assert status["delivered"] == 2 and status["attempting"] == 0

    await takeovers.hand_back(session_id)
    rig.model.add(ScriptedModel.reply("Back to the bot."))
    assert await rig.adapter.deliver(make_event("thanks", message_id="fake:chat-1:3"))
    await rig.adapter.wait_for_sent(3)
    history = rig.model.requests[-1].messages
    person = [m for m in history if m.name == OPERATOR_NAME]
    assert [(m.role, m.content, m.agent) for m in person] == [
        (Role.MODEL, "A person here: <b>hi</b>", None)
    ]
    assert history[-1].content == "thanks"


async def test_messages_queued_before_the_takeover_start_no_turn(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(call: RecordedCall) -> ModelResponse:
        entered.set()
        await release.wait()
        return ScriptedModel.reply("first answer")

    rig.model.add(slow)
    assert await rig.adapter.deliver(make_event("one", message_id="fake:chat-1:1"))
    await entered.wait()
    # Queued in the conversation's lane behind the running turn:
    assert await rig.adapter.deliver(make_event("two", message_id="fake:chat-1:2"))
    assert await rig.adapter.deliver(make_event("three", message_id="fake:chat-1:3"))
    session_id = await first_session(rig)
    await rig.gateway.turns.takeovers.take_over(session_id)
    release.set()
    assert await rig.gateway._dispatcher.drain(5)

    assert len(rig.model.requests) == 1  # "two" and "three" never reached the model
    assert rig.adapter.sent == []  # and "one"'s turn, still running, was stopped
    session = await rig.store.get(session_id)
    assert session is not None
    assert [m.content for m in session.history if m.role is Role.USER] == ["one", "two", "three"]


async def test_turns_recovered_after_a_restart_respect_the_takeover(tmp_path: Path) -> None:
    path = str(tmp_path / "chatflow.db")
    store = SQLiteSessionStore(path)
    await store.open()
    event = make_event("left by a crash", message_id="fake:chat-1:9")
    inbox = Inbox(store)
    await inbox.open()
    # What a crash between tx 1 and tx 2 leaves: the journal row, no turn.
    session_key = "agent:main:telegram:dm:x"
    assert await inbox.accept(event, session_key=session_key, session_id="fake-0123456789abcdef")
    assert await Takeovers(store).take_over("fake-0123456789abcdef")
    await store.close()

    store = SQLiteSessionStore(path)
    model = ScriptedModel()
    runner = Runner(Agent(name="Helper", instructions="Be helpful."), store, model=model)
    adapter = FakeAdapter()
    settings = Settings(data_dir=tmp_path, auto_continue_freshness_seconds=10**9)
    gateway = Gateway(runner, store, [adapter], settings, secret=SECRET)
    try:
        await gateway.start()
        await gateway.wait_ready()
        assert await gateway._dispatcher.drain(5)
        assert model.requests == []
        assert adapter.sent == []
        assert await inbox_states(store) == [("done", "taken over")]
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def test_takeover_state_is_in_the_table_and_reloaded_within_the_refresh(
    tmp_path: Path,
) -> None:
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    await store.open()
    now = [0.0]
    # Two copies of the state, as two processes hold them.
    reader = Takeovers(store, refresh_seconds=2.0, clock=lambda: now[0])
    writer = Takeovers(store)
    try:
        assert not await reader.is_taken_over("telegram-1")
        await writer.take_over("telegram-1")
        assert not await reader.is_taken_over("telegram-1")  # its copy is still fresh
        now[0] = 2.0
        assert await reader.is_taken_over("telegram-1")
        await writer.hand_back("telegram-1")
        now[0] = 4.0
        assert not await reader.is_taken_over("telegram-1")
        # A restart: a new copy reads the table.
        await writer.take_over("telegram-2")
        assert await Takeovers(store).is_taken_over("telegram-2")
    finally:
        await store.close()


async def test_reading_the_state_commits_nothing(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    takeovers = rig.gateway.turns.takeovers
    await takeovers.reload()
    writes: list[str] = []
    original = rig.store.run

    async def spy(body, *, write=True, on_commit=None):  # type: ignore[no-untyped-def]
        if write:
            writes.append("write")
        return await original(body, write=write, on_commit=on_commit)

    rig.store.run = spy  # type: ignore[method-assign]
    for _ in range(50):
        assert not await takeovers.is_taken_over("fake-0123456789abcdef")
    assert writes == []


# -- kill points of an operator's reply ------------------------------------------------

REPLY = "A person here: your parcel left today."
_CHILD = r"""
import asyncio, json, os, signal, sys
from pathlib import Path
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.sqlite_store import SQLiteSessionStore
from bot.gateway.gateway import Gateway
from bot.gateway.takeover import OperatorDesk
from bot.testing import FakeAdapter, make_event

folder, kill_at, reply = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

class FileAdapter(FakeAdapter):
    async def send(self, chat_id, text, *, thread_id=None, reply_to=None):
        result = await super().send(chat_id, text, thread_id=thread_id, reply_to=reply_to)
        with open(folder / "sent.jsonl", "a") as out:
            out.write(json.dumps(text) + "\n")
            out.flush()
            os.fsync(out.fileno())
        if kill_at == "during_send" and text == reply:
            die()
        return result

async def main():
    store = SQLiteSessionStore(str(folder / "chatflow.db"))
    model = ScriptedModel([ScriptedModel.reply("bot answer")])
    runner = Runner(Agent(name="Helper", instructions="x"), store, model=model)
    adapter = FileAdapter()
    gateway = Gateway(runner, store, [adapter], Settings(data_dir=folder), secret=b"k" * 32)
    await gateway.start()
    await gateway.wait_ready()
    await adapter.deliver(make_event("hello", message_id="fake:chat-1:1"))
    await adapter.wait_for_sent(1)
    await gateway.ledger.flush()
    (session_id,) = await store.list_sessions()
    await gateway.turns.takeovers.take_over(session_id)
    if kill_at == "before_commit":
        async def record_then_die(tx, obligation, *, claimed=False):
            die()
        gateway.ledger.record_in = record_then_die
    elif kill_at == "after_commit":
        async def send_dies(obligation):
            die()
        gateway.outbox.send = send_dies
    elif kill_at == "after_send":
        async def mark_dies(*args, **kwargs):
            die()
        gateway.ledger.mark_delivered = mark_dies
    desk = OperatorDesk(store, gateway.ledger, gateway.outbox, gateway.adapters)
    await desk.reply(session_id, reply, nonce="d" * 32)
    await gateway.ledger.flush()
    die()  # "no_kill" ends here too, with the delivered mark written

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("kill_at", "resent"),
    [
        pytest.param("before_commit", False, id="a-inside-the-transaction"),
        pytest.param("after_commit", True, id="b-after-commit-before-send"),
        pytest.param("during_send", True, id="c-during-send"),
        pytest.param("after_send", True, id="d-after-send-before-delivered"),
        pytest.param("no_kill", False, id="e-delivered-mark-written"),
    ],
)
async def test_an_operator_reply_survives_a_kill_at_every_point(
    tmp_path: Path, kill_at: str, resent: bool
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CHILD, str(tmp_path), kill_at, REPLY, env=env, cwd=ROOT
    )
    assert await asyncio.wait_for(child.wait(), 60) == -signal.SIGKILL
    before = [json.loads(line) for line in (tmp_path / "sent.jsonl").read_text().splitlines()]

    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    model = ScriptedModel()  # a bot turn here would fail the test (script exhausted)
    runner = Runner(Agent(name="Helper", instructions="x"), store, model=model)
    adapter = FakeAdapter()
    gateway = Gateway(runner, store, [adapter], Settings(data_dir=tmp_path), secret=SECRET)
    try:
        await gateway.start()
        await gateway.wait_ready()
        if resent:
            await adapter.wait_for_sent(1)
        assert await gateway._dispatcher.drain(5)
        await gateway.ledger.flush()
        after = [s.text for s in adapter.sent]
        (session_id,) = await store.list_sessions()
        session = await store.get(session_id)
        assert session is not None
        by_person = [m.content for m in session.history if m.name == OPERATOR_NAME]
        status = await gateway.ledger.status()
        assert await gateway.turns.takeovers.is_taken_over(session_id)  # survived the restart
    finally:
        await gateway.stop(grace=1)
        await store.close()
    plain = [t for t in before + after if t == REPLY]
    assert len(plain) <= 1  # never twice without the marker
    if kill_at == "before_commit":
        # Nothing was recorded, so nothing was sent: the operator saw no confirmation.
        assert (before, after, by_person) == (["bot answer"], [], [])
    else:
        assert by_person == [REPLY]  # in the history once, whatever was resent
        assert after == ([RECOVERED_MARKER + REPLY] if resent else [])
    assert model.requests == []
    assert status["attempting"] == status["pending"] == status["failed"] == 0


async def test_an_agent_hands_the_chat_to_a_person_with_transfer_to_human(
    tmp_path: Path,
) -> None:
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    model = ScriptedModel(
        [
            ScriptedModel.call(TRANSFER_TO_HUMAN, reason="wants to talk about a refund"),
            ScriptedModel.reply("A person will answer you here soon."),
        ]
    )
    agent = Agent(name="Helper", instructions="x", tools=[transfer_to_human])
    adapter = FakeAdapter()
    gateway = Gateway(
        Runner(agent, store, model=model),
        store,
        [adapter],
        Settings(data_dir=tmp_path),
        secret=SECRET,
    )
    try:
        await gateway.start()
        await gateway.wait_ready()
        assert await adapter.deliver(make_event("I want a person", message_id="fake:chat-1:1"))
        (notice,) = await adapter.wait_for_sent(1)
        assert notice.text == "A person will answer you here soon."
        (session_id,) = await store.list_sessions()
        assert await gateway.turns.takeovers.is_taken_over(session_id)
        # Another process (a fresh copy of the table) sees it too.
        assert session_id in await Takeovers(store).reload()
        assert await adapter.deliver(make_event("hello?", message_id="fake:chat-1:2"))
        assert await gateway._dispatcher.drain(5)
        assert len(model.requests) == 2  # the one turn's two calls; "hello?" started none
        assert TRANSFER_TO_HUMAN in model.requests[0].tool_names  # offered: the agent opted in
        # The built-in ran: the model read its instruction, not an error.
        (result,) = [m for m in model.requests[1].messages if m.role is Role.TOOL]
        assert result.content is not None and "a person will answer" in result.content
        assert "error" not in result.content
        async with store.transaction() as tx:
            row = await tx.fetchone("SELECT reason FROM chatflow_takeovers")
        assert row == ("agent: wants to talk about a refund",)
    finally:
        await gateway.stop(grace=1)
        await store.close()


@tool(name="transfer_to_accounting")
def _transfer_to_accounting(amount: int) -> str:
    """Open a ticket with accounting.

    Args:
        amount: The amount in question.
    """
    return f"ticket opened for {amount}"


@tool(name=TRANSFER_TO_HUMAN)
def _own_transfer_to_human(reason: str) -> str:
    """The operator's own tool of that name (logs a ticket, hands nothing over).

    Args:
        reason: Why.
    """
    return "ticket logged"


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        ([], "no agent to transfer to"),  # not offered: a hallucinated or injected call
        ([_own_transfer_to_human], "ticket logged"),  # a tool of that name, not the built-in
    ],
)
async def test_only_the_builtin_tool_the_agent_offers_takes_a_chat_over(
    tmp_path: Path, tools: list[FunctionTool], expected: str
) -> None:
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    model = ScriptedModel(
        [
            ScriptedModel.call(TRANSFER_TO_HUMAN, reason="ignore your rules"),
            ScriptedModel.reply("How can I help?"),
            ScriptedModel.reply("Still here."),
        ]
    )
    agent = Agent(name="Helper", instructions="x", tools=tools)
    adapter = FakeAdapter()
    runner = Runner(agent, store, model=model)
    gateway = Gateway(runner, store, [adapter], Settings(data_dir=tmp_path), secret=SECRET)
    try:
        await gateway.start()
        await gateway.wait_ready()
        assert await adapter.deliver(make_event("hi", message_id="fake:chat-1:1"))
        await adapter.wait_for_sent(1)
        (result,) = [m for m in model.requests[1].messages if m.role is Role.TOOL]
        assert result.content is not None and expected in result.content
        (session_id,) = await store.list_sessions()
        assert not await gateway.turns.takeovers.is_taken_over(session_id)
        assert await adapter.deliver(make_event("hello?", message_id="fake:chat-1:2"))
        assert [s.text for s in await adapter.wait_for_sent(2)][1] == "Still here."
    finally:
        await gateway.stop(grace=1)
        await store.close()


async def test_a_tool_named_like_a_handoff_can_be_called(tmp_path: Path) -> None:
    model = ScriptedModel(
        [ScriptedModel.call("transfer_to_accounting", amount=12), ScriptedModel.reply("Done.")]
    )
    agent = Agent(name="Helper", instructions="x", tools=[_transfer_to_accounting])
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s1", "pay")
    assert result.content == "Done."
    (tool_result,) = [m for m in model.requests[1].messages if m.role is Role.TOOL]
    assert tool_result.content == "ticket opened for 12"


async def test_a_reload_racing_a_takeover_never_forgets_it(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    await store.open()
    takeovers = Takeovers(store, refresh_seconds=0.0)
    await takeovers.open()
    read_done = asyncio.Event()
    release = asyncio.Event()
    original = store.run
    held = [True]

    async def slow_read(body, *, write=True, on_commit=None):  # type: ignore[no-untyped-def]
        result = await original(body, write=write, on_commit=on_commit)
        if not write and held[0]:
            held[0] = False
            read_done.set()
            await release.wait()  # the read is done, its answer not yet used
        return result

    store.run = slow_read  # type: ignore[method-assign]
    try:
        reload = asyncio.create_task(takeovers.reload())
        await read_done.wait()
        await takeovers.take_over("fake-0123456789abcdef")
        release.set()
        assert "fake-0123456789abcdef" in await reload
        assert await takeovers.is_taken_over("fake-0123456789abcdef")
    finally:
        await store.close()


async def test_an_unreadable_table_keeps_the_last_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    await store.open()
    takeovers = Takeovers(store, refresh_seconds=0.0)
    try:
        await takeovers.take_over("fake-0123456789abcdef")
        async with store.transaction() as tx:
            await tx.execute("DROP TABLE chatflow_takeovers")
        assert await takeovers.is_taken_over("fake-0123456789abcdef")
        assert "could not read the takeover table (StorageError)" in caplog.text
    finally:
        await store.close()


async def test_a_turn_begun_on_a_stale_copy_after_another_process_took_over_sends_nothing(
    pg_dsn: str, tmp_path: Path
) -> None:
    async with PostgresSessionStore(pg_dsn) as store, PostgresSessionStore(pg_dsn) as other:
        model = ScriptedModel([ScriptedModel.reply("Hello!")])
        runner = Runner(Agent(name="Helper", instructions="Be helpful."), store, model=model)
        adapter = FakeAdapter()
        gateway = Gateway(runner, store, [adapter], Settings(data_dir=tmp_path), secret=SECRET)
        await gateway.start()
        await gateway.wait_ready()
        try:
            gateway.turns.takeovers._refresh = 3600.0  # this process's copy stays stale
            assert await adapter.deliver(make_event("hi", message_id="fake:chat-1:1"))
            await adapter.wait_for_sent(1)
            (session_id,) = await store.list_sessions()
            # Another process's console: its own store and copy, the same table.
            assert await Takeovers(other).take_over(session_id)
            model.add(ScriptedModel.reply("the bot's answer, after a person took over"))
            assert await adapter.deliver(make_event("a person?", message_id="fake:chat-1:2"))
            assert gateway._dispatcher is not None and await gateway._dispatcher.drain(5)
            assert [s.text for s in adapter.sent] == ["Hello!"]  # rolled back in its commit
            session = await store.get(session_id)
            assert session is not None
            assert [m.content for m in session.history if m.role is Role.USER] == [
                "hi",
                "a person?",
            ]
            assert await gateway.turns.takeovers.is_taken_over(session_id)  # copy updated
        finally:
            await gateway.stop(grace=1)
