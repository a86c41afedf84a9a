"""Taps on PostgreSQL: two gateways (two store instances, as two processes) take two taps
on one keyboard at once, and exactly one turn runs."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from bot import Agent, Runner, ToolOutput, tool
from bot.config import Settings
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.postgres import PostgresSessionStore
from bot.gateway.gateway import Gateway
from bot.gateway.instances import InstanceRegistry, Owner
from bot.gateway.ledger.keyboards import TABLE as BUTTONS_TABLE
from bot.gateway.taps import EXPIRED_NOTICE
from tests.fakes.adapter import make_event
from tests.fakes.button_adapter import ButtonAdapter
from tests.gateway.test_reply_context import check_sent_ids_by_chat
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]

SECRET = b"k" * 32


@tool
def offer() -> ToolOutput:
    """Offer two choices."""
    return ToolOutput("offered", buttons=["Red", "Blue"])


@pytest.fixture
async def nodes(
    pg_dsn: str, tmp_path: Path
) -> AsyncIterator[list[tuple[Gateway, ButtonAdapter, ScriptedModel]]]:
    async with AsyncExitStack() as stack:
        made: list[tuple[Gateway, ButtonAdapter, ScriptedModel]] = []
        for name, pid in (("a", os.getppid()), ("b", os.getpid())):
            store = PostgresSessionStore(pg_dsn)
            await stack.enter_async_context(store)
            registry = InstanceRegistry(store, owner=Owner(pid, f"{name}-instance"))
            await registry.start()
            stack.push_async_callback(registry.stop)
            model = ScriptedModel()
            adapter = ButtonAdapter()
            agent = Agent(name="Paint", instructions="x", tools=[offer])
            gateway = Gateway(
                Runner(agent, store, model=model),
                store,
                [adapter],
                Settings(data_dir=tmp_path / name),
                secret=SECRET,
                instances=registry,
            )
            await gateway.start()
            await gateway.wait_ready()
            stack.push_async_callback(gateway.stop, 1)
            made.append((gateway, adapter, model))
        yield made


async def test_two_processes_racing_taps_start_one_turn(
    nodes: list[tuple[Gateway, ButtonAdapter, ScriptedModel]],
) -> None:
    (gw_a, a, model_a), (_, b, model_b) = nodes
    model_a.add(ScriptedModel.call("offer"), ScriptedModel.reply("Which colour?"))
    assert await a.deliver(make_event("paint it"))
    await a.wait_for_sent(1)
    red, blue = a.keyboards[-1]
    model_a.add(ScriptedModel.reply("Red it is."))
    model_b.add(ScriptedModel.reply("Blue it is."))
    results = await asyncio.gather(
        a.deliver(make_event("", message_id="fake:tap:a", tap_token=red.token)),
        b.deliver(make_event("", message_id="fake:tap:b", tap_token=blue.token)),
    )
    assert sorted(results) == [False, True]
    winner, loser = (a, b) if results[0] else (b, a)
    await winner.wait_for_sent(1 + (winner is a))
    assert [n for _, n in loser.answers] == [EXPIRED_NOTICE]
    assert [n for _, n in winner.answers] == [None]
    assert model_a.remaining + model_b.remaining == 1  # one turn ran, in one process
    async with gw_a.store.transaction() as tx:
        used = await tx.fetchall(f"SELECT used_at FROM {BUTTONS_TABLE}")
    assert len(used) == 2 and all(u[0] is not None for u in used)


async def test_sent_ids_are_found_by_chat_and_thread(pg_dsn: str) -> None:
    """R1 on PostgreSQL: the ledger's sent ids are keyed by chat (schema 4)."""
    async with PostgresSessionStore(pg_dsn) as store:
        await check_sent_ids_by_chat(store)
