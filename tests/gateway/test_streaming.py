"""Drafts through the gateway: previews while the answer grows, one final through the ledger."""

from __future__ import annotations

import asyncio
import logging
import operator
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.messages import Message, ToolCall
from bot.core.models.base import ModelResponse, OnText, ToolSpec, Usage
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.tools import tool
from bot.errors import ModelError
from bot.gateway.contract import MessageEvent
from bot.gateway.gateway import Gateway
from bot.gateway.streaming import DraftStream, draft_id_for
from bot.testing import FakeAdapter, make_event, transient

SECRET = b"k" * 32


@dataclass
class Step:
    pieces: list[str]
    calls: list[ToolCall] = field(default_factory=list)
    error: Exception | None = None


class PacedModel:
    """Streams each answer piece by piece; a piece waits until the adapter showed a
    draft of all the text before it (``wait_drafts``), or at least tried once."""

    def __init__(self, adapter: FakeAdapter, *steps: Step, wait_drafts: bool = True) -> None:
        self.adapter = adapter
        self.steps = list(steps)
        self.wait_drafts = wait_drafts
        self.streamed = 0
        self.completed = 0

    async def complete(
        self, *, model: str, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        self.completed += 1
        step = self.steps.pop(0)
        if step.error is not None:
            raise step.error
        return ModelResponse(content="".join(step.pieces) or None, tool_calls=step.calls)

    async def stream(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText,
    ) -> ModelResponse:
        self.streamed += 1
        step = self.steps.pop(0)
        text = ""
        for piece in step.pieces:
            on_text(piece)
            text += piece
            if self.wait_drafts:
                await self.adapter.wait_for(partial(operator.contains, self.adapter.drafts, text))
            else:
                await self.adapter.wait_for(lambda: self.adapter.draft_attempts > 0)
        if step.error is not None:
            raise step.error
        return ModelResponse(
            content=text or None, tool_calls=step.calls, usage=Usage(input_tokens=1)
        )


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


@dataclass
class Rig:
    gateway: Gateway
    adapter: FakeAdapter
    model: PacedModel


@pytest.fixture
async def rig_for(tmp_path: Path) -> AsyncIterator[object]:
    made: list[tuple[Gateway, SQLiteSessionStore]] = []

    async def make(
        *steps: Step, drafts: float | None = 0.01, stream_replies: bool = True, **options: bool
    ) -> Rig:
        store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
        adapter = FakeAdapter(draft_seconds=drafts)
        model = PacedModel(adapter, *steps, **options)
        agent = Agent(name="Helper", instructions="Help.", tools=[lookup_order])
        runner = Runner(agent, store, model=model, stream_replies=stream_replies)
        gateway = Gateway(runner, store, [adapter], Settings(data_dir=tmp_path), secret=SECRET)
        await gateway.start()
        await gateway.wait_ready()
        made.append((gateway, store))
        return Rig(gateway, adapter, model)

    yield make
    for gateway, store in made:
        await gateway.stop(grace=1)
        await store.close()


async def test_a_dm_shows_growing_drafts_then_one_final_reply(rig_for: object) -> None:
    rig: Rig = await rig_for(Step(["Hello ", "there, ", "friend."]))  # type: ignore[operator]
    await rig.adapter.deliver(make_event("hi"))
    (final,) = await rig.adapter.wait_for_sent(1)
    assert await rig.gateway._dispatcher.drain(5)
    assert final.text == "Hello there, friend."
    assert rig.adapter.drafts == ["Hello ", "Hello there, ", "Hello there, friend."]
    assert len(rig.adapter.sent) == 1
    # One ledger row for the answer, delivered: the drafts wrote nothing.
    status = await rig.gateway.ledger.status()
    assert status["delivered"] == 1 and sum(status.values()) == 1


async def test_a_model_error_mid_stream_is_answered_by_one_apology(rig_for: object) -> None:
    failing = Step(["Half ", "an "], error=ModelError("stream broke", retryable=True))
    rig: Rig = await rig_for(failing)  # type: ignore[operator]
    await rig.adapter.deliver(make_event("hi"))
    (apology,) = await rig.adapter.wait_for_sent(1)
    assert await rig.gateway._dispatcher.drain(5)
    assert apology.text == rig.gateway.replies.apology
    assert rig.adapter.drafts == ["Half ", "Half an "]  # superseded by the apology
    status = await rig.gateway.ledger.status()
    assert status["delivered"] == 1 and sum(status.values()) == 1


async def test_flood_control_on_a_draft_never_delays_the_final(
    rig_for: object, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    rig: Rig = await rig_for(Step(["One ", "two ", "three."]), wait_drafts=False)  # type: ignore[operator]
    rig.adapter.fail_drafts.append(transient("Too Many Requests", retry_after=30))
    await rig.adapter.deliver(make_event("hi"))
    (final,) = await rig.adapter.wait_for_sent(1, timeout=5)  # far sooner than the 30 s pause
    assert final.text == "One two three."
    assert rig.adapter.drafts == []  # paused by the 429 for the rest of this answer
    assert rig.adapter.draft_attempts == 1
    assert "draft refused by flood control" in caplog.text
    assert "One two" not in caplog.text and "hi" not in caplog.messages  # no text logged


async def test_a_failed_final_is_retried_by_the_ledger_without_new_drafts(
    rig_for: object,
) -> None:
    rig: Rig = await rig_for(Step(["Second ", "time ", "lucky."]))  # type: ignore[operator]
    rig.adapter.fail_next.append(transient("connection reset"))
    await rig.adapter.deliver(make_event("hi"))
    assert await rig.gateway._dispatcher.drain(5)
    assert rig.adapter.sent == []
    shown = list(rig.adapter.drafts)
    assert shown[-1] == "Second time lucky."  # the draft is on screen, yet nothing is delivered
    async with rig.gateway.store.transaction() as tx:
        await tx.execute("UPDATE chatflow_delivery_obligations SET next_attempt_at = 0")
    assert await rig.gateway.retry_due() == 1
    assert [s.text for s in rig.adapter.sent] == ["Second time lucky."]
    assert rig.adapter.drafts == shown


async def test_only_the_final_round_of_a_turn_with_tools_is_the_answer(rig_for: object) -> None:
    call = ToolCall(id="call_1", name="lookup_order", arguments={"order_id": "7"})
    rig: Rig = await rig_for(  # type: ignore[operator]
        Step(["Let me check."], calls=[call]), Step(["It ", "shipped."])
    )
    await rig.adapter.deliver(make_event("where is 7?"))
    (final,) = await rig.adapter.wait_for_sent(1)
    assert final.text == "It shipped."
    assert rig.adapter.drafts[0] == "Let me check."
    after = rig.adapter.drafts[1:]
    assert after[-1] == "It shipped."
    assert all("Let me check." not in draft for draft in after)


@pytest.mark.parametrize(
    ("drafts", "stream_replies"),
    [
        pytest.param(None, True, id="adapter-without-drafts"),
        pytest.param(0.01, False, id="stream-replies-off"),
    ],
)
async def test_no_drafts_means_no_streaming_at_all(
    rig_for: object, drafts: float | None, stream_replies: bool
) -> None:
    rig: Rig = await rig_for(  # type: ignore[operator]
        Step(["whole answer"]), drafts=drafts, stream_replies=stream_replies
    )
    await rig.adapter.deliver(make_event("hi"))
    (final,) = await rig.adapter.wait_for_sent(1)
    assert final.text == "whole answer"
    assert (rig.model.streamed, rig.model.completed) == (0, 1)
    assert rig.adapter.draft_attempts == 0


@dataclass(eq=False)
class TimedAdapter(FakeAdapter):
    sent_at: list[float] = field(default_factory=list)

    async def send_draft(self, event: MessageEvent, draft_id: int, text: str) -> None:
        self.sent_at.append(asyncio.get_running_loop().time())
        assert draft_id == draft_id_for(event.message_id)
        await super().send_draft(event, draft_id, text)


async def test_draft_stream_sends_at_most_one_draft_per_interval() -> None:
    adapter = TimedAdapter(draft_seconds=0.2)
    event = make_event("hi")
    drafts = DraftStream(adapter, event, 0.2)
    drafts.begin("Helper")
    for n in range(200):  # a burst of tokens: one draft, not 200
        drafts.delta(f"{n} ")
    await adapter.wait_for(lambda: len(adapter.drafts) == 1)
    drafts.delta("more")
    await adapter.wait_for(lambda: len(adapter.drafts) == 2)
    drafts.stop()
    assert adapter.drafts[1].endswith("199 more")
    assert adapter.drafts[1].startswith(adapter.drafts[0])
    assert adapter.sent_at[1] - adapter.sent_at[0] >= 0.2 - 0.01


def test_draft_ids_are_stable_and_never_zero() -> None:
    assert draft_id_for("telegram:1:2") == draft_id_for("telegram:1:2")
    assert draft_id_for("telegram:1:2") != draft_id_for("telegram:1:3")
    assert all(0 < draft_id_for(f"m{n}") < 2**31 for n in range(500))
