"""Traces through the gateway (in-process, in-memory exporter): a turn's spans in its
message's trace, and the continuation after an approval in a new trace linked to the
turn that asked."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot import Agent, Runner, tool
from bot.config import Settings
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.approvals import approval_rows
from bot.gateway.gateway import Gateway
from tests.fakes.adapter import make_event
from tests.fakes.button_adapter import ButtonAdapter
from tests.fakes.tracing import Recorded, recording_spans

SECRET = b"t" * 32


@tool(needs_approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order.

    Args:
        order_id: The order.
        amount: How much.
    """
    return f"refunded {amount} on {order_id}"


@pytest.fixture
async def traced(
    tmp_path: Path,
) -> AsyncIterator[tuple[Gateway, ButtonAdapter, ScriptedModel, SQLiteSessionStore, Recorded]]:
    with recording_spans() as recorded:
        store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
        model = ScriptedModel()
        agent = Agent(name="Billing", instructions="Bill.", tools=[refund])
        runner = Runner(agent, store, model=model)
        adapter = ButtonAdapter()
        settings = Settings(data_dir=tmp_path, approval_ttl_seconds=600)
        gateway = Gateway(runner, store, [adapter], settings, secret=SECRET)
        await gateway.start()
        await gateway.wait_ready()
        try:
            yield gateway, adapter, model, store, recorded
        finally:
            await gateway.stop(grace=1)
            await store.close()


async def test_the_continuation_after_an_approval_is_a_new_trace_linked_to_the_asking_turn(
    traced: tuple[Gateway, ButtonAdapter, ScriptedModel, SQLiteSessionStore, Recorded],
) -> None:
    gateway, adapter, model, store, recorded = traced
    model.add(ScriptedModel.call("refund", order_id="1001", amount=25))
    assert await adapter.deliver(make_event("refund 1001 please"))
    await adapter.wait_for_sent(1)
    (receipt,) = recorded.named("chatflow.receive")
    assert receipt.context is not None and receipt.parent is None
    asking = receipt.context.trace_id
    names = {s.name for s in recorded.in_trace(asking)}
    assert {
        "chatflow.tx1",
        "chatflow.queue",
        "invoke_agent Billing",
        "chatflow.approval_pause",
        "chatflow.tx2",
    } <= names
    [row] = await approval_rows(store)
    (tx2,) = [s for s in recorded.in_trace(asking) if s.name == "chatflow.tx2"]
    assert tx2.context is not None
    assert row.traceparent is not None and f"{tx2.context.span_id:016x}" in row.traceparent

    model.add(ScriptedModel.reply("Refunded 25."))
    buttons = {b.label: b.token for b in adapter.keyboards[-1]}
    await adapter.deliver(make_event("", tap_token=buttons["Approve"]))
    await adapter.wait_for_sent(2)
    await gateway._dispatcher.drain(5)
    (continuation,) = recorded.named("chatflow.approval_continuation")
    assert continuation.context is not None and continuation.parent is None
    assert continuation.context.trace_id != asking
    assert [(ln.context.trace_id, ln.context.span_id) for ln in continuation.links] == [
        (asking, tx2.context.span_id)
    ]
    later = {s.name for s in recorded.in_trace(continuation.context.trace_id)}
    assert {"invoke_agent Billing", "execute_tool refund", "chatflow.tx2", "chatflow.send"} <= later
    # Nothing of the conversation in any attribute.
    values = [str(v) for s in recorded.spans for v in (s.attributes or {}).values()]
    assert not [v for v in values if "1001" in v or "Refunded" in v or "user-1" in v]
