"""The incremental O(turn) prune of ``SessionContext.add_message``: the cases that matter."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role, ToolCall
from bot.core.session import SessionContext


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def call(*ids: str) -> Message:
    return Message(role=Role.MODEL, tool_calls=[ToolCall(id=i, name="t") for i in ids])


def answer(text: str) -> Message:
    return Message(role=Role.MODEL, content=text)


def tool(call_id: str | None) -> Message:
    return Message(role=Role.TOOL, tool_call_id=call_id, content="ok", name="t")


def system(text: str) -> Message:
    return Message(role=Role.SYSTEM, content=text)


def shape(session: SessionContext) -> list[str]:
    out: list[str] = []
    for m in session.history:
        if m.role == Role.TOOL:
            out.append(f"tool:{m.tool_call_id}")
        elif m.tool_calls:
            out.append("call:" + ",".join(c.id for c in m.tool_calls))
        else:
            out.append(f"{m.role.value}:{m.content}")
    return out


def fill(session: SessionContext, *messages: Message) -> None:
    for message in messages:
        session.add_message(message)


def full_prune(session: SessionContext) -> list[str]:
    """The history the full pass gives for the same entries."""
    entries = [(e.seq, e.message) for e in session._entries]
    again = SessionContext._restore(
        "s", session.active_agent, session.max_turns, {}, entries, (), "x"
    )
    return shape(again)


@pytest.fixture
def agent() -> Agent:
    return Agent(name="Triage", instructions="")


def test_repeated_call_id_keeps_only_results_after_a_kept_call(agent: Agent) -> None:
    session = SessionContext("s", agent, max_turns=2)
    # Turn 2 answers turn 1's c0 first, then calls c0 again and answers that.
    fill(session, user("1"), call("c0"), user("2"), tool("c0"), call("c0"), tool("c0"))
    assert shape(session) == ["user:1", "call:c0", "user:2", "tool:c0", "call:c0", "tool:c0"]
    session.add_message(user("3"))  # turn 1 falls out, and with it the first result's call
    assert shape(session) == ["user:2", "call:c0", "tool:c0", "user:3"]
    assert shape(session) == full_prune(session)


def test_dropped_turn_orphans_a_result_in_a_middle_turn(agent: Agent) -> None:
    session = SessionContext("s", agent, max_turns=3)
    fill(session, user("1"), call("c0", "c1"), tool("c1"), user("2"), answer("a"))
    fill(session, user("3"), tool("c0"), answer("b"))
    session.add_message(user("4"))
    assert shape(session) == ["user:2", "model:a", "user:3", "model:b", "user:4"]
    assert session._calls == {} and session._tools == {}


def test_a_call_id_twice_in_one_message_counts_once(agent: Agent) -> None:
    session = SessionContext("s", agent, max_turns=2)
    fill(session, user("1"), call("c0", "c0"), tool("c0"), user("2"), call("c0"), tool("c0"))
    session.add_message(user("3"))
    assert shape(session) == ["user:2", "call:c0", "tool:c0", "user:3"]
    assert {k: list(v) for k, v in session._calls.items()} == {"c0": [4]}


def test_system_goes_front_and_nothing_before_the_first_user_stays(agent: Agent) -> None:
    session = SessionContext("s", agent, max_turns=1)
    fill(session, answer("early"), tool("c0"), system("s1"), call("c0"), tool(None))
    assert shape(session) == ["system:s1"]
    fill(session, user("1"), call("c0"), system("s2"), tool("c0"), tool("c9"), tool(None))
    assert shape(session) == ["system:s1", "system:s2", "user:1", "call:c0", "tool:c0"]
    session.add_message(user("2"))
    assert shape(session) == ["system:s1", "system:s2", "user:2"]
    # Dropped messages still used up their seqs: seqs never repeat.
    assert [e.seq for e in session._entries] == [2, 7, 11]


def test_appends_never_run_the_full_pass(agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    session = SessionContext("s", agent, max_turns=2)

    def refuse(*args: Any) -> None:
        raise AssertionError("the full prune ran on an append")

    monkeypatch.setattr(session, "_prune_entries", refuse)
    for i in range(6):
        fill(session, user(str(i)), call(f"c{i % 2}"), tool(f"c{i % 2}"), answer("a"), system("s"))
    turns = ["user:4", "call:c0", "tool:c0", "model:a", "user:5", "call:c1", "tool:c1"]
    assert shape(session) == ["system:s"] * 6 + [*turns, "model:a"]


def test_pending_changes_after_an_incremental_drop(agent: Agent) -> None:
    session = SessionContext("s", agent, max_turns=2)
    fill(session, user("1"), call("c0"), user("2"), tool("c0"), answer("a"))
    session._mark_saved(session._pending_changes(), "inc")
    session.add_message(user("3"))
    changes = session._pending_changes()
    assert [e.seq for e in changes.inserts] == [5]
    assert changes.deletes == (0, 1, 3)  # turn 1 and the result it orphaned


def test_rollback_brings_back_pruned_turns_and_their_indices(agent: Agent) -> None:
    session = SessionContext("s", agent, max_turns=2)
    fill(session, user("1"), call("c0"), user("2"), tool("c0"))
    token = session.checkpoint()
    fill(session, user("3"), user("4"))
    assert shape(session) == ["user:3", "user:4"]
    session.rollback_to(token)
    assert shape(session) == ["user:1", "call:c0", "user:2", "tool:c0"]
    session.add_message(tool("c0"))  # c0 is a kept call again
    session.add_message(user("3"))
    assert shape(session) == ["user:2", "user:3"]
    assert shape(session) == full_prune(session)


def test_restore_with_fewer_turns_prunes_in_full(agent: Agent) -> None:
    rows = [(4, user("3")), (0, user("1")), (1, call("c0")), (3, tool("c0")), (2, user("2"))]
    session = SessionContext._restore("s", agent, 2, {}, rows, [0, 1, 2, 3, 4], "inc")
    assert shape(session) == ["user:2", "user:3"]
    assert session._pending_changes().deletes == (0, 1, 3)
    session.add_message(user("4"))
    assert shape(session) == ["user:3", "user:4"]


@pytest.mark.parametrize(
    "metadata",
    [{}, {"a": 1, "b": "x", "c": None, "d": 1.5, "e": True}, {"n": {"tags": ["a"]}, "a": 1}],
    ids=["empty", "flat", "nested"],
)
def test_checkpoint_metadata_is_a_snapshot(agent: Agent, metadata: dict[str, Any]) -> None:
    expected = copy.deepcopy(metadata)
    session = SessionContext("s", agent, metadata=copy.deepcopy(metadata))
    token = session.checkpoint()
    session.metadata["a"] = 2
    if "n" in session.metadata:
        session.metadata["n"]["tags"].append("b")
    session.rollback_to(token)
    assert session.metadata == expected
    session.metadata["z"] = 0  # the restored dict is not the token's
    if "n" in session.metadata:
        session.metadata["n"]["tags"].append("c")
    session.rollback_to(token)
    assert session.metadata == expected
