"""Compaction (issue #30): the trigger, the summary at the head, the recent turns kept whole,
failures that leave the session byte for byte, a turn arriving meanwhile, every store kind."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from bot import Compaction
from bot.core.agent import Agent
from bot.core.compaction import (
    SUMMARY_INSTRUCTIONS,
    estimate_tokens,
    is_summary,
    summary_message,
    summary_request,
)
from bot.core.compactor import BASE_DELAY, CompactionOutcome, Compactor
from bot.core.messages import Message, Role, ToolCall
from bot.core.models.base import ModelResponse, ToolSpec, Usage
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.core.runner import Runner
from bot.core.sql import Transaction
from bot.core.stores.base import BaseSessionStore, TransactionalStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.tools import tool
from bot.core.usage import CallUsage, record_usage_in
from bot.errors import ModelError, StorageError
from tests.core.conftest import StoreFactory

ORDER = "ORD-4471"


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


class FactModel(ScriptedModel):
    """A model that answers every turn, and summarises by keeping the lines with digits.

    ``hold`` (if set) keeps a summary request waiting until it is set; ``fail`` makes
    summary requests raise it; ``tool_on`` calls ``lookup_order`` on that user text.
    """

    def __init__(self) -> None:
        super().__init__()
        self.hold: asyncio.Event | None = None
        self.summarising = asyncio.Event()
        self.fail: BaseException | None = None
        self.tool_on: str | None = None

    @property
    def summaries(self) -> list[RecordedCall]:
        return [r for r in self.requests if r.system == SUMMARY_INSTRUCTIONS]

    @property
    def turns(self) -> list[RecordedCall]:
        return [r for r in self.requests if r.system != SUMMARY_INSTRUCTIONS]

    async def _answer(self, record: RecordedCall) -> ModelResponse:
        if record.system == SUMMARY_INSTRUCTIONS:
            self.summarising.set()
            if self.hold is not None:
                await self.hold.wait()
            if self.fail is not None:
                raise self.fail
            text = record.messages[-1].content or ""
            kept = [line for line in text.splitlines() if re.search(r"\d", line)]
            return ModelResponse(content="\n".join(kept), usage=Usage(input_tokens=50))
        # No usage reported: the estimate stays uncalibrated (bytes / 4).
        last = record.messages[-1]
        if last.role is Role.USER and last.content == self.tool_on:
            call = ScriptedModel.tool_call("lookup_order", order_id=ORDER)
            return ModelResponse(content=None, tool_calls=[call])
        return ModelResponse(content=f"answer to: {record.messages[-1].content}")

    async def _play(self, model, system, messages, tools, on_text):  # type: ignore[no-untyped-def]
        self.add(self._answer)
        return await super()._play(model, system, messages, tools, on_text)


def _agent(trigger_tokens: int = 200, keep_recent_turns: int = 2) -> Agent:
    return Agent(
        name="Support",
        instructions="Help the user.",
        tools=[lookup_order],
        compaction=Compaction(trigger_tokens, keep_recent_turns),
    )


async def _turns(runner: Runner, count: int, start: int = 0, sid: str = "s1") -> None:
    for index in range(start, start + count):
        text = f"My order is {ORDER}" if index == 1 else f"Question {'x' * 40} number {index}"
        await runner.run_async(sid, text)
        await runner.compactor.wait_idle()


async def _state(store: BaseSessionStore, sid: str = "s1") -> tuple[str, str]:
    """Everything the store holds of the session: the conversation and the loaded window."""
    conversation = await store.conversation(sid)
    session = await store.get(sid)
    assert conversation is not None and session is not None
    rows = json.dumps([(m.model_dump(mode="json"), c) for m, c in conversation])
    window = json.dumps([m.model_dump(mode="json") for m in session.history])
    return rows, window


# -- configuration and prompt --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"trigger_tokens": 0}, ValueError),
        ({"trigger_tokens": True}, TypeError),
        ({"trigger_tokens": 100, "keep_recent_turns": 0}, ValueError),
        ({"trigger_tokens": 100, "model": ""}, ValueError),
        ({"trigger_tokens": 100, "model": 42}, TypeError),
    ],
)
def test_wrong_compaction_settings_are_refused(kwargs: dict[str, object], error: type) -> None:
    with pytest.raises(error):
        Compaction(**kwargs)  # type: ignore[arg-type]


def test_an_agent_takes_only_a_compaction() -> None:
    with pytest.raises(TypeError, match="compaction must be a Compaction"):
        Agent(name="A", instructions="", compaction=1000)  # type: ignore[arg-type]


def test_the_prompt_says_what_the_summary_must_keep() -> None:
    prompt = SUMMARY_INSTRUCTIONS.lower()
    for needed in (
        "names",
        "ids",
        "order numbers",
        "amounts",
        "currency",
        "dates",
        "decisions",
        "open questions",
        "language the user writes in",
        "earlier summary",
        "merge",
        "do not invent",
    ):
        assert needed in prompt, needed


def test_the_request_holds_the_earlier_summary_then_the_transcript_with_tool_calls() -> None:
    call = ToolCall(id="c1", name="lookup_order", arguments={"order_id": ORDER})
    older = [
        Message(role=Role.USER, content="where is my parcel?"),
        Message(role=Role.MODEL, tool_calls=[call], agent="Support"),
        Message(role=Role.TOOL, content="shipped on 3 May", tool_call_id="c1", name="lookup_order"),
        Message(role=Role.MODEL, content="It shipped.", agent="Support"),
    ]
    (request,) = summary_request(summary_message("Customer: Ana Diaz"), older)
    text = request.content or ""
    assert request.role is Role.USER
    assert text.index("Earlier summary:\nCustomer: Ana Diaz") < text.index("Transcript:")
    assert "User: where is my parcel?" in text
    assert f'lookup_order({{"order_id": "{ORDER}"}})' in text
    assert "Tool lookup_order result: shipped on 3 May" in text
    assert "Assistant (Support): It shipped." in text


def test_the_estimate_is_bytes_over_four() -> None:
    spec = ToolSpec(name="t", description="d", parameters={})
    messages = [Message(role=Role.USER, content="é" * 100)]  # 200 bytes
    # 40 + (16 overhead + 200) + (1 + 1 + 2 for "{}") = 260 bytes
    assert estimate_tokens("x" * 40, messages, [spec]) == 65


async def test_the_estimate_is_calibrated_by_what_the_provider_reported() -> None:
    model = FactModel()
    async with Runner(_agent(trigger_tokens=10_000), model=model) as runner:
        session = await runner.store.get_or_create("s1", runner.starting_agent)
        plan = runner._plans(runner.starting_agent)
        assert plan is not None
        raw = runner.compactor.estimate(session, plan)
        runner.compactor.observe("s1", raw, raw * 2)
        assert runner.compactor.estimate(session, plan) == raw * 2
        runner.compactor.observe("s1", raw, raw * 100)  # nonsense is bounded
        assert runner.compactor.estimate(session, plan) == raw * 4


# -- compaction through the runner, on every store kind ---------------------------------


async def test_past_the_trigger_the_summary_heads_the_recent_turns_kept_whole(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    model = FactModel()
    model.tool_on = "Question " + "x" * 40 + " number 5"
    async with Runner(_agent(), store, model=model) as runner:
        await _turns(runner, 6)
        assert model.summaries, "no summary was asked for"
        await runner.compact("s1")  # whatever the trigger did last: the two last turns stay
        session = await store.get("s1")
        assert session is not None
        history = session.history
        assert is_summary(history[0]) and ORDER in (history[0].content or "")
        roles = [m.role for m in history[1:]]
        assert roles.count(Role.USER) == 2  # keep_recent_turns
        # The tool call of turn 5 and its result stay together, in order.
        assert roles == [Role.USER, Role.MODEL, Role.USER, Role.MODEL, Role.TOOL, Role.MODEL]
        conversation = await store.conversation("s1")
        assert conversation is not None
        assert sum(1 for _, compacted in conversation if not compacted) == len(history)
        first = next(m.content for m, c in conversation if c)
        assert first == "Question " + "x" * 40 + " number 0"
        # The next request sees the summary and the recent turns only.
        await runner.run_async("s1", "and now?")
        last = model.turns[-1]
        assert is_summary(last.messages[0])
        assert not any(m.content == f"My order is {ORDER}" for m in last.messages)


async def test_below_the_trigger_the_model_is_never_asked_for_a_summary(
    store: BaseSessionStore,
) -> None:
    model = FactModel()
    async with Runner(_agent(trigger_tokens=100_000), store, model=model) as runner:
        await _turns(runner, 5)
    assert model.summaries == []
    session = await store.get("s1")
    assert session is not None and not any(is_summary(m) for m in session.history)


async def test_a_fact_of_turn_2_is_in_the_request_of_turn_30_through_merged_summaries(
    store: BaseSessionStore,
) -> None:
    model = FactModel()
    async with Runner(_agent(), store, model=model) as runner:
        await _turns(runner, 30)
        await runner.run_async("s1", "what was my order id?")
    assert len(model.summaries) >= 3
    # Later summaries were asked to merge the earlier one, which carried the fact.
    later = model.summaries[-1].messages[-1].content or ""
    assert later.startswith("Earlier summary:") and ORDER in later
    final = model.turns[-1]
    assert ORDER in (final.messages[0].content or "")
    assert sum(1 for m in final.messages if m.role is Role.USER) <= 3


async def test_a_failed_compaction_leaves_the_session_byte_for_byte_and_backs_off(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    model = FactModel()
    now = [0.0]
    async with Runner(_agent(trigger_tokens=100_000), store, model=model) as runner:
        runner.compactor.clock = lambda: now[0]
        await _turns(runner, 5)
        before = await _state(store)
        model.fail = ModelError("provider down", retryable=True)
        assert await runner.compact("s1") is CompactionOutcome.FAILED
        assert await _state(store) == before
        # An empty summary is a failure too: nothing written.
        model.fail = None
        model.add(lambda record: ModelResponse(content="  "))
        assert await runner.compact("s1") is CompactionOutcome.FAILED
        assert await _state(store) == before
        # Automatic attempts wait out the backoff (doubled: two failures) without the model.
        asked = len(model.summaries)
        now[0] += BASE_DELAY
        assert await runner.compactor.compact("s1") is CompactionOutcome.DEFERRED
        assert len(model.summaries) == asked
        now[0] += BASE_DELAY
        assert await runner.compactor.compact("s1") is CompactionOutcome.NOTHING  # not due
        assert await _state(store) == before
        # /compact tries at once, and success clears the backoff.
        assert await runner.compact("s1") is CompactionOutcome.COMPACTED
        assert await _state(store) != before


async def test_the_backoff_doubles_while_the_model_keeps_failing() -> None:
    model = FactModel()
    model.fail = ModelError("down", retryable=True)
    now = [0.0]
    async with Runner(_agent(trigger_tokens=1), model=model) as runner:
        runner.compactor.clock = lambda: now[0]
        await runner.run_async("s1", "turn 1")
        await runner.run_async("s1", "turn 2")
        await runner.run_async("s1", "turn 3")
        await runner.compactor.wait_idle()
        failures = len(model.summaries)
        assert failures == 1  # the turns after the first failure did not ask again
        now[0] += BASE_DELAY
        assert await runner.compactor.compact("s1") is CompactionOutcome.FAILED
        now[0] += BASE_DELAY  # the second wait is twice as long
        assert await runner.compactor.compact("s1") is CompactionOutcome.DEFERRED
        now[0] += BASE_DELAY
        model.fail = None
        assert await runner.compactor.compact("s1") is CompactionOutcome.COMPACTED


async def test_a_turn_arriving_during_compaction_runs_on_the_old_history_and_is_kept(
    store_factory: StoreFactory,
) -> None:
    store = store_factory()
    model = FactModel()
    async with Runner(_agent(trigger_tokens=100_000), store, model=model) as runner:
        await _turns(runner, 5)
        model.hold = asyncio.Event()
        compaction = asyncio.create_task(runner.compact("s1"))
        await model.summarising.wait()
        # The summary is being written: a turn goes ahead, on the uncompacted history.
        await runner.run_async("s1", "meanwhile")
        during = model.turns[-1]
        assert not any(is_summary(m) for m in during.messages)
        assert any(m.content == f"My order is {ORDER}" for m in during.messages)
        model.hold.set()
        assert await compaction is CompactionOutcome.COMPACTED
        session = await store.get("s1")
        assert session is not None
        users = [m.content for m in session.history if m.role is Role.USER]
        # The two kept turns were those before the summary began; the new turn follows.
        assert users == [
            f"Question {'x' * 40} number 3",
            f"Question {'x' * 40} number 4",
            "meanwhile",
        ]


async def test_a_reset_during_compaction_wins(store: BaseSessionStore) -> None:
    model = FactModel()
    async with Runner(_agent(trigger_tokens=100_000), store, model=model) as runner:
        await _turns(runner, 4)
        model.hold = asyncio.Event()
        compaction = asyncio.create_task(runner.compact("s1"))
        await model.summarising.wait()
        await store.delete("s1")
        await runner.run_async("s1", "hello again")
        model.hold.set()
        assert await compaction is CompactionOutcome.NOTHING
        session = await store.get("s1")
        assert session is not None
        assert session.history[0].content == "hello again"


async def test_at_max_turns_it_compacts_before_pruning_would_drop_a_turn(
    store_factory: StoreFactory,
) -> None:
    store = store_factory(default_max_turns=6, prune_to_turns=4)
    model = FactModel()
    async with Runner(_agent(trigger_tokens=100_000), store, model=model) as runner:
        await _turns(runner, 12)
        await runner.run_async("s1", "what was my order id?")
    assert model.summaries
    assert ORDER in (model.turns[-1].messages[0].content or "")


async def test_without_compaction_pruning_loses_the_fact(store: BaseSessionStore) -> None:
    model = FactModel()
    plain = Agent(name="Support", instructions="Help the user.", tools=[lookup_order])
    async with Runner(plain, store, model=model) as runner:
        await _turns(runner, 45)
        await runner.run_async("s1", "what was my order id?")
    assert model.summaries == []
    assert not any(ORDER in (m.content or "") for m in model.turns[-1].messages)


async def test_compact_now_works_for_an_agent_without_compaction_settings() -> None:
    model = FactModel()
    plain = Agent(name="Support", instructions="Help the user.")
    async with Runner(plain, model=model) as runner:
        await _turns(runner, 3)
        assert model.summaries == []  # nothing automatic
        assert await runner.compact("s1") is CompactionOutcome.NOTHING  # 3 turns, 6 kept
        await _turns(runner, 5, start=3)
        assert await runner.compact("s1") is CompactionOutcome.COMPACTED
        session = await runner.store.get("s1")
        assert session is not None and is_summary(session.history[0])


async def test_a_named_compaction_model_is_routed_at_start_up() -> None:
    from bot.core.models.routing import ModelSettings
    from bot.errors import ConfigurationError

    agent = Agent(
        name="A", instructions="", compaction=Compaction(trigger_tokens=10, model="nowhere/x")
    )
    with pytest.raises(ConfigurationError):
        Runner(agent, model_settings=ModelSettings(default_model="offline"))


async def test_compacted_rows_survive_a_reopen_and_are_not_loaded(tmp_path: object) -> None:
    path = f"{tmp_path}/chatflow.db"
    model = FactModel()
    store = SQLiteSessionStore(path)
    async with Runner(_agent(), store, model=model) as runner:
        await _turns(runner, 8)
        session = await store.get("s1")
        assert session is not None
        window = [m.id for m in session.history]
    await store.close()
    reopened = SQLiteSessionStore(path)
    try:
        session = await reopened.get("s1")
        assert session is not None and [m.id for m in session.history] == window
        conversation = await reopened.conversation("s1")
        assert conversation is not None and any(c for _, c in conversation)
        assert len(conversation) > len(window)
    finally:
        await reopened.close()


async def test_the_scheduled_compaction_is_stopped_by_aclose() -> None:
    model = FactModel()
    model.hold = asyncio.Event()
    runner = Runner(_agent(trigger_tokens=1), model=model)
    await runner.run_async("s1", "turn 1")
    await runner.run_async("s1", "turn 2")
    await runner.run_async("s1", "turn 3")
    await model.summarising.wait()
    before = await _state(runner.store)
    store = runner.store
    runner._owns_store = False
    await runner.aclose()
    assert await _state(store) == before


def test_compactor_is_built_per_runner() -> None:
    runner = Runner(_agent(), model=FactModel())
    assert isinstance(runner.compactor, Compactor)
    assert runner.compactor.store is runner.store


async def test_a_save_that_fails_rolls_the_whole_compaction_back(
    store_factory: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = store_factory()
    if not isinstance(store, TransactionalStore):
        pytest.skip("the usage row rides only on a SQL store's transaction")
    model = FactModel()

    async def broken(tx: object, **usage: object) -> None:
        raise StorageError("disk full")

    monkeypatch.setattr("bot.core.compactor.record_usage_in", broken)
    async with Runner(_agent(trigger_tokens=100_000), store, model=model) as runner:
        await _turns(runner, 5)
        before = await _state(store)
        assert await runner.compact("s1") is CompactionOutcome.FAILED
        assert model.summaries  # the summary was written, then its save failed
        assert await _state(store) == before
        await runner.run_async("s1", "still here?")  # the session goes on as it was
        session = await store.get("s1")
        assert session is not None and not any(is_summary(m) for m in session.history)


async def test_the_summary_call_is_recorded_as_compaction_usage(tmp_path: object) -> None:
    store = SQLiteSessionStore(f"{tmp_path}/usage.db")
    model = FactModel()
    try:
        async with Runner(_agent(trigger_tokens=100_000), store, model=model) as runner:
            await _turns(runner, 4)
            assert await runner.compact("s1") is CompactionOutcome.COMPACTED

        async def body(tx: Transaction) -> list[tuple[object, ...]]:
            return await tx.fetchall(
                "SELECT session_id, agent, kind, model, prompt_tokens FROM chatflow_usage"
            )

        rows = await store.run(body, write=False)
        assert rows == [("s1", "Support", "compaction", "offline", 50)]
    finally:
        await store.close()


async def test_a_compaction_model_of_its_own_writes_the_summaries() -> None:
    summariser = FactModel()
    model = FactModel()
    agent = Agent(
        name="Support",
        instructions="Help.",
        compaction=Compaction(trigger_tokens=100_000, keep_recent_turns=2, model=summariser),
    )
    async with Runner(agent, model=model) as runner:
        await _turns(runner, 4)
        assert await runner.compact("s1") is CompactionOutcome.COMPACTED
    assert model.summaries == [] and len(summariser.summaries) == 1
    assert summariser.turns == []


async def test_a_thrown_away_summary_is_still_recorded_and_charged_to_the_sender(
    store_factory: StoreFactory,
) -> None:
    # G10: an empty summary is thrown away, but the provider billed the call.
    store = store_factory()
    if not isinstance(store, TransactionalStore):
        pytest.skip("usage rows are kept by SQL stores")
    replies = [ScriptedModel.reply(f"answer {n}") for n in range(4)]
    model = ScriptedModel([*replies, ScriptedModel.reply("", usage=Usage(5000, 300))])
    counted: list[CallUsage] = []
    async with Runner(_agent(trigger_tokens=100_000), store, model=model) as runner:
        runner.compactor.on_usage = counted.append
        await _turns(runner, 4)

        async def chat_row(tx: Transaction) -> None:  # as the gateway records a turn
            await record_usage_in(
                tx,
                session_id="s1",
                agent="Support",
                kind="chat",
                model="m",
                usage=Usage(1, 1),
                sender="sender-digest",
            )

        await store.run(chat_row)
        assert await runner.compact("s1") is CompactionOutcome.FAILED

    async def body(tx: Transaction) -> list[tuple[object, ...]]:
        return await tx.fetchall(
            "SELECT kind, sender, prompt_tokens, completion_tokens FROM chatflow_usage "
            "WHERE kind = 'compaction'"
        )

    assert await store.run(body, write=False) == [("compaction", "sender-digest", 5000, 300)]
    assert [(c.kind, c.agent, c.usage.input_tokens) for c in counted] == [
        ("compaction", "Support", 5000)
    ]
