"""What the Runner test modules (tests/core/test_runner_*.py) share.

Two agents that hand off to each other (``make_agents``) with a recording tool
(``tool_log``) and a failing one, the session id, snapshot helpers that compare
a session byte for byte, and the fixtures: ``sqlite_store``, ``store`` (memory
and SQLite; it overrides tests/core/conftest.py's ``store``, so a module must
import it), ``server`` (the fake OpenAI server) and the autouse
``clear_tool_log``. Import the fixtures into a test module and list them in its
``__all__``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.core.agent import Agent, tool
from bot.core.session import SessionContext
from bot.core.stores.base import BaseSessionStore
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.tools import ToolContext
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
def clear_tool_log() -> None:
    """Start every test with an empty ``tool_log`` (autouse where imported)."""
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
