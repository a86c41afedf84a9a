"""Approvals on PostgreSQL with two gateway processes (two store instances, as two
processes would be): two operators approving at once decide once, and the tool runs once."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot import Agent, Runner
from bot.config import Settings
from bot.core.messages import Role
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.postgres import PostgresSessionStore
from bot.errors import ModelError
from bot.gateway.approvals import approval_rows
from bot.gateway.gateway import Gateway
from bot.gateway.instances import InstanceRegistry, Owner
from tests.fakes.adapter import make_event
from tests.fakes.button_adapter import ButtonAdapter
from tests.gateway.test_approvals import refund, refunds
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]

SECRET = b"k" * 32


@dataclass
class Node:
    gateway: Gateway
    adapter: ButtonAdapter
    model: ScriptedModel
    registry: InstanceRegistry


@pytest.fixture
async def nodes(pg_dsn: str, tmp_path: Path) -> AsyncIterator[Callable[[], Awaitable[Node]]]:
    """Starts gateway processes on the test schema; stops them afterwards."""
    started: list[Node] = []
    async with AsyncExitStack() as stack:

        async def make() -> Node:
            store = PostgresSessionStore(pg_dsn)
            await stack.enter_async_context(store)
            name = f"node-{len(started)}"
            pid = os.getpid() if not started else os.getppid()
            registry = InstanceRegistry(store, owner=Owner(pid, name), lease_seconds=60)
            await registry.start()
            model = ScriptedModel()
            agent = Agent(name="Billing", instructions="Bill.", tools=[refund])
            adapter = ButtonAdapter()
            gateway = Gateway(
                Runner(agent, store, model=model),
                store,
                [adapter],
                Settings(data_dir=tmp_path),
                secret=SECRET,
                instances=registry,
            )
            await gateway.start()
            await gateway.wait_ready()
            node = Node(gateway, adapter, model, registry)
            started.append(node)
            return node

        try:
            yield make
        finally:
            for node in started:
                await node.gateway.stop(grace=1)
                await node.registry.stop()


async def test_two_processes_approving_at_once_run_the_tool_once(
    nodes: Callable[[], Awaitable[Node]],
) -> None:
    refunds.clear()
    a, b = await nodes(), await nodes()
    a.model.add(ScriptedModel.call("refund", order_id="1001", amount=25))
    assert await a.adapter.deliver(make_event("refund 1001"))
    await a.adapter.wait_for_sent(1)
    [row] = await approval_rows(a.gateway.store)
    for node in (a, b):
        node.model.add(ScriptedModel.reply("Refunded."))
    outcomes = await asyncio.gather(
        a.gateway.approvals.decide(row.approval_id, "approve", by="operator"),
        b.gateway.approvals.decide(row.approval_id, "approve", by="operator"),
    )
    assert sorted(outcomes) == ["approved", "decided"]
    winner = a if outcomes[0] == "approved" else b
    await winner.adapter.wait_for_sent(2 if winner is a else 1)
    for node in (a, b):
        assert await node.gateway._dispatcher.drain(5)
    assert refunds == [("1001", 25.0)]
    assert [s.text for s in (*a.adapter.sent, *b.adapter.sent)].count("Refunded.") == 1
    # Neither process adopts or expires it again.
    for node in (a, b):
        assert await node.gateway.approvals.adopt_operator_decisions() == 0
        assert await node.gateway.approvals.expire_due() == 0
    assert await approval_rows(a.gateway.store) == []


async def test_only_one_process_claims_an_approved_call_to_run_it(
    nodes: Callable[[], Awaitable[Node]],
) -> None:
    a, b = await nodes(), await nodes()
    a.model.add(ScriptedModel.call("refund", order_id="7", amount=1))
    assert await a.adapter.deliver(make_event("refund 7"))
    await a.adapter.wait_for_sent(1)
    [row] = await approval_rows(a.gateway.store)
    # Approved in the database, the continuation not yet run (a decision's own commit).
    async with a.gateway.store.transaction() as tx:
        await tx.execute(
            "UPDATE chatflow_approvals SET state = 'approved' WHERE id = ?", (row.approval_id,)
        )
    claims = await asyncio.gather(
        *(node.gateway.approvals._claim(row.approval_id) for node in (a, b, a, b))
    )
    assert sorted(decision for _, decision in claims) == [
        "approved",
        "unknown",
        "unknown",
        "unknown",
    ]


async def test_a_failed_answer_after_the_approved_tool_keeps_that_it_ran(
    nodes: Callable[[], Awaitable[Node]],
) -> None:
    """G6 on PostgreSQL: the approved call's commit of its own (history and row) holds
    when the model then fails; the retry is answered from it and nothing runs twice."""
    refunds.clear()
    node = await nodes()
    node.model.add(ScriptedModel.call("refund", order_id="1001", amount=25))
    assert await node.adapter.deliver(make_event("refund 1001"))
    await node.adapter.wait_for_sent(1)
    approve = {b.label: b.token for b in node.adapter.keyboards[-1]}["Approve"]
    node.model.add(ModelError("upstream 500"))
    assert not await node.adapter.deliver(make_event("", tap_token=approve))
    await node.adapter.wait_for_sent(2)
    [row] = await approval_rows(node.gateway.store, states=("done",))
    assert row.result == "refunded 25.0 on 1001" and refunds == [("1001", 25.0)]
    node.model.add(ScriptedModel.reply("It went through."))
    assert await node.adapter.deliver(make_event("did it work?"))
    await node.adapter.wait_for_sent(3)
    tool_results = [m.content for m in node.model.requests[-1].messages if m.role is Role.TOOL]
    assert tool_results == ["refunded 25.0 on 1001"] and refunds == [("1001", 25.0)]
