"""SessionContext, path safety and the in-memory store's specifics."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

import bot.core.memory as memory
from bot.core.agent import Agent
from bot.core.ids import set_log_safe_session_ids
from bot.core.messages import Message, Role, ToolCall
from bot.core.models.scripted import ScriptedModel
from bot.core.paths import is_path_unsafe, is_session_key_unsafe
from bot.core.runner import Runner
from bot.core.session import SessionContext, seq_runs
from bot.core.stores._locks import KeyedLocks
from bot.core.stores.base import (
    DEFAULT_DEDUP_TTL_HOURS,
    NotTransactionalError,
    SessionDeletedError,
    TransactionalStore,
    require_transactional,
)
from bot.core.stores.in_memory import SessionStore
from bot.errors import StorageError


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def model(text: str | None = None, *calls: str) -> Message:
    return Message(
        role=Role.MODEL, content=text, tool_calls=[ToolCall(id=c, name="lookup") for c in calls]
    )


def tool(call_id: str | None) -> Message:
    return Message(role=Role.TOOL, content="result", tool_call_id=call_id, name="lookup")


def system(text: str) -> Message:
    return Message(role=Role.SYSTEM, content=text)


def contents(session: SessionContext) -> list[str | None]:
    return [m.content if m.role != Role.TOOL else f"tool:{m.tool_call_id}" for m in session.history]


@pytest.fixture
def session(agent: Agent) -> SessionContext:
    return SessionContext("s-1", agent, max_turns=2)


# -- constants and error family ----------------------------------------------------------


def test_dedup_ttl_is_eight_days() -> None:
    assert DEFAULT_DEDUP_TTL_HOURS == 192


def test_session_deleted_error_is_a_storage_error() -> None:
    assert issubclass(SessionDeletedError, StorageError)


# -- path safety -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["", "..", "a..b", "a/b", "a\\b", "C:", "c:session", "a\x00b", "a\nb", "tab\there", "\x7f"],
    ids=[
        "empty",
        "dotdot",
        "dotdot-inside",
        "slash",
        "backslash",
        "drive",
        "drive-lower",
        "nul",
        "newline",
        "tab",
        "del",
    ],
)
def test_path_unsafe_values(value: str) -> None:
    assert is_path_unsafe(value)


@pytest.mark.parametrize(
    "value",
    ["telegram-0123456789abcdef", "user-session-1001", "a.b", "agent:main:dm", "ñandú"],
    ids=["gateway-id", "seed-id", "single-dot", "colons-not-leading-drive", "unicode"],
)
def test_path_safe_values(value: str) -> None:
    assert not is_path_unsafe(value)


def test_path_unsafe_none() -> None:
    assert is_path_unsafe(None)


@pytest.mark.parametrize(
    ("value", "unsafe"),
    [
        ("agent:main:google_chat:group:spaces/AAA/threads/BBB", False),
        ("agent:main:telegram:dm:chat_0123456789ab", False),
        ("agent:main:x:a..b", False),
        ("spaces/../etc", True),
        ("spaces/..", True),
        ("../x", True),
        ("/abs", True),
        ("\\abs", True),
        ("C:key", True),
        ("key\x00", True),
        ("key\r", True),
        ("", True),
    ],
    ids=[
        "google-chat-thread",
        "dm",
        "dots-inside-segment",
        "dotdot-segment",
        "dotdot-last",
        "dotdot-first",
        "leading-slash",
        "leading-backslash",
        "drive",
        "nul",
        "control",
        "empty",
    ],
)
def test_session_key_safety(value: str, unsafe: bool) -> None:
    assert is_session_key_unsafe(value) is unsafe


# -- construction ------------------------------------------------------------------------


def test_seed_example(agent: Agent) -> None:
    session = SessionContext(
        session_id="user-session-1001",
        initial_agent=agent,
        max_turns=40,
        metadata={"user_id": "cust_882", "channel": "whatsapp"},
    )
    assert session.active_agent is agent
    assert session.metadata["channel"] == "whatsapp"
    assert session.session_id == "user-session-1001"
    assert session.max_turns == 40
    assert session.history == []
    assert not session.deleted


@pytest.mark.parametrize("max_turns", [0, -1], ids=["zero", "negative"])
def test_max_turns_must_be_positive(agent: Agent, max_turns: int) -> None:
    with pytest.raises(ValueError, match="max_turns"):
        SessionContext("s", agent, max_turns=max_turns)


@pytest.mark.parametrize(
    "session_id",
    ["", "../etc", "a/b", "a\\b", "C:x", "a\x00", "a\x1b"],
    ids=["empty", "traversal", "slash", "backslash", "drive", "nul", "escape"],
)
def test_unsafe_session_id_rejected(agent: Agent, session_id: str) -> None:
    with pytest.raises(ValueError, match="session_id"):
        SessionContext(session_id, agent)


def test_metadata_is_copied_from_the_caller(agent: Agent) -> None:
    given = {"channel": "whatsapp"}
    session = SessionContext("s", agent, metadata=given)
    session.metadata["channel"] = "telegram"
    assert given == {"channel": "whatsapp"}


def test_active_agent_setter_requires_agent(session: SessionContext) -> None:
    other = Agent(name="Billing", instructions="")
    session.active_agent = other
    assert session.active_agent is other
    with pytest.raises(TypeError):
        session.active_agent = "Billing"  # type: ignore[assignment]


def test_history_is_a_copy(session: SessionContext) -> None:
    session.add_message(user("hi"))
    session.history.append(user("sneaky"))
    session.history.clear()
    assert contents(session) == ["hi"]


def test_add_message_requires_message(session: SessionContext) -> None:
    with pytest.raises(TypeError):
        session.add_message("hello")  # type: ignore[arg-type]


# -- pruning -----------------------------------------------------------------------------


def test_keeps_last_turns_and_systems_in_front(session: SessionContext) -> None:
    session.add_message(system("rules-1"))
    for i in range(3):
        session.add_message(user(f"u{i}"))
        session.add_message(model(f"m{i}"))
    session.add_message(system("rules-2"))
    assert contents(session) == ["rules-1", "rules-2", "u1", "m1", "u2", "m2"]


def test_drops_messages_before_first_user(session: SessionContext) -> None:
    session.add_message(model("welcome!"))
    session.add_message(tool("c1"))
    session.add_message(user("hi"))
    assert contents(session) == ["hi"]


def test_tool_pairs_kept_within_turn(session: SessionContext) -> None:
    session.add_message(user("u0"))
    session.add_message(model(None, "c1", "c2"))
    session.add_message(tool("c1"))
    session.add_message(tool("c2"))
    session.add_message(model("done"))
    assert contents(session) == ["u0", None, "tool:c1", "tool:c2", "done"]


def test_orphan_tool_results_dropped(session: SessionContext) -> None:
    session.add_message(user("u0"))
    session.add_message(model(None, "c1"))
    session.add_message(user("u1"))
    # Its call is in the turn that stays for now; the next turn pushes that turn out.
    session.add_message(tool("c1"))
    session.add_message(tool("unknown"))
    session.add_message(tool(None))
    assert contents(session) == ["u0", None, "u1", "tool:c1"]
    session.add_message(user("u2"))
    assert contents(session) == ["u1", "u2"]


def test_tool_before_its_call_is_dropped(session: SessionContext) -> None:
    session.add_message(user("u0"))
    session.add_message(tool("c9"))
    session.add_message(model(None, "c9"))
    assert contents(session) == ["u0", None]


def test_prune_history_alias(session: SessionContext) -> None:
    assert SessionContext._prune_history is SessionContext.prune_history
    session.add_message(user("u0"))
    session._prune_history()
    assert contents(session) == ["u0"]


# -- checkpoint and rollback -------------------------------------------------------------


def test_rollback_restores_pruned_turns_agent_and_metadata(session: SessionContext) -> None:
    session.metadata["profile"] = {"tier": "gold", "tags": ["a"]}
    session.add_message(user("u0"))
    session.add_message(model("m0"))
    session.add_message(user("u1"))
    session.add_message(model("m1"))
    token = session.checkpoint()
    before_agent = session.active_agent

    session.add_message(user("u2"))  # window full: u0's turn is pruned
    session.active_agent = Agent(name="Billing", instructions="")
    session.metadata["profile"]["tags"].append("b")
    session.metadata["new"] = 1
    assert contents(session) == ["u1", "m1", "u2"]

    session.rollback_to(token)
    assert contents(session) == ["u0", "m0", "u1", "m1"]
    assert session.active_agent is before_agent
    assert session.metadata == {"profile": {"tier": "gold", "tags": ["a"]}}

    # The token stays valid and is not aliased by the restored metadata.
    session.metadata["profile"]["tier"] = "silver"
    session.rollback_to(token)
    assert session.metadata["profile"]["tier"] == "gold"


def test_rollback_rejects_foreign_tokens(agent: Agent, session: SessionContext) -> None:
    other = SessionContext("s-2", agent)
    with pytest.raises(ValueError):
        session.rollback_to(other.checkpoint())
    with pytest.raises(TypeError):
        session.rollback_to(3)  # type: ignore[arg-type]


# -- helpers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seqs", "runs"),
    [([], []), ([4], [(4, 4)]), ([1, 2, 3, 7, 8, 10], [(1, 3), (7, 8), (10, 10)])],
    ids=["empty", "single", "mixed"],
)
def test_seq_runs(seqs: list[int], runs: list[tuple[int, int]]) -> None:
    assert seq_runs(seqs) == runs


async def test_keyed_locks_forget_unused_keys_even_after_cancellation() -> None:
    locks = KeyedLocks()
    holding = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with locks.hold("k"):
            holding.set()
            await release.wait()

    async def waiter() -> None:
        async with locks.hold("k"):
            pass

    held = asyncio.create_task(holder())
    await holding.wait()
    waiting = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    assert len(locks) == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    release.set()
    await held
    assert len(locks) == 0


@pytest.fixture
def gateway_ids_log_safe() -> Iterator[None]:
    """The predicate ``bot.gateway.keys`` registers, for this test only."""
    from bot.gateway.keys import is_gateway_session_id

    previous = set_log_safe_session_ids(is_gateway_session_id)
    yield
    set_log_safe_session_ids(previous)


@pytest.mark.usefixtures("gateway_ids_log_safe")
def test_log_session_id_hides_free_form_ids() -> None:
    assert memory.log_session_id("telegram-0123456789abcdef") == "telegram-0123456789abcdef"
    hidden = memory.log_session_id("+15550199")
    assert "15550199" not in hidden and hidden.startswith("sid#")


def test_core_alone_hashes_every_session_id_in_logs() -> None:
    previous = set_log_safe_session_ids(None)
    try:
        hidden = memory.log_session_id("telegram-0123456789abcdef")
    finally:
        set_log_safe_session_ids(previous)
    assert hidden.startswith("sid#") and "0123456789abcdef" not in hidden


def test_the_gateway_registers_its_ids_as_log_safe() -> None:
    import bot.gateway.keys  # registers its predicate at import

    session_id = bot.gateway.keys.session_id_for("agent:main:telegram:dm:chat_0123456789ab")
    assert memory.log_session_id(session_id) == session_id
    assert memory.log_session_id("telegram-not-hex-at-all!").startswith("sid#")


# -- in-memory store specifics -----------------------------------------------------------


async def test_memory_store_cannot_run_sql(agent: Agent) -> None:
    store = SessionStore()
    session = await store.get_or_create("s", agent)
    # Not a TransactionalStore: no transaction(), claim_in() or save(also=...) at all.
    assert not isinstance(store, TransactionalStore)
    assert not hasattr(store, "transaction") and not hasattr(store, "claim_in")
    with pytest.raises(StorageError, match="in-memory store cannot run SQL") as info:
        require_transactional(store, "the inbox")
    assert isinstance(info.value, NotTransactionalError) and isinstance(info.value, TypeError)
    assert "the inbox" in str(info.value)

    async def hook(tx: object) -> None:
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="also"):
        await store.save(session, also=hook)  # type: ignore[call-arg]


async def test_on_commit_with_the_memory_store_fails_before_the_model_runs(agent: Agent) -> None:
    async def on_commit(result: object, tx: object) -> None:
        raise AssertionError("never called")

    model = ScriptedModel([ScriptedModel.reply("never sent")])
    runner = Runner(agent, SessionStore(), model=model)
    with pytest.raises(NotTransactionalError, match="on_commit"):
        await runner.run_async("s", "hi", on_commit=on_commit)
    assert model.requests == []
    loaded = await runner.store.get("s")
    assert loaded is not None and loaded.history == []


async def test_memory_store_placeholder_is_not_needed(
    agent: Agent, caplog: pytest.LogCaptureFixture
) -> None:
    store = SessionStore()
    session = await store.get_or_create("s", agent)
    session.active_agent = Agent(name="Billing", instructions="bills")
    await store.save(session)
    with caplog.at_level(logging.WARNING):
        loaded = await store.get("s")
    assert loaded is not None
    assert loaded.active_agent is session.active_agent
    assert not caplog.records


async def test_purge_backlog_spreads_over_claims(agent: Agent) -> None:
    from tests.fakes.clock import FakeClock

    clock = FakeClock()
    store = SessionStore(clock=clock, dedup_ttl_hours=1)
    for i in range(memory.PURGE_BATCH_SIZE + 5):
        await store.mark_message_processed(f"m{i}")
    clock.advance(hours=2)
    await store.claim_message("fresh-1")  # purges one full batch
    assert len(store._processed) == 6
    await store.claim_message("fresh-2")  # backlog left: purges again at once
    assert len(store._processed) == 2
