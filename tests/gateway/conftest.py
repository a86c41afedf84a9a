"""Fixtures for the gateway reliability tests: a hand-moved clock, a file store, events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bot import testing
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.events import MessageEvent, SessionSource
from bot.gateway.gateway import Gateway
from tests.fakes.adapter import FakeAdapter
from tests.fakes.clock import FakeClock

SECRET = b"k" * 32


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SQLiteSessionStore]:
    """A file-backed store on the fake clock; closed after the test."""
    made = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    await made.open()
    yield made
    await made.close()


EventFactory = Callable[..., MessageEvent]


def build_event(message_id: str = "telegram:42:1", **kwargs: Any) -> MessageEvent:
    """A Telegram DM text event; keyword arguments override event fields (``source`` too)."""
    kwargs.setdefault("text", "hola")
    kwargs.setdefault("timestamp", datetime(2025, 1, 1, 11, 59, tzinfo=UTC))
    source = kwargs.pop("source", SessionSource("telegram", "42", "dm", "42", sender_name="Ana"))
    text = kwargs.pop("text")
    platform = kwargs.pop("platform", source.platform)
    event = testing.make_event(text, message_id=message_id, platform=platform, **kwargs)
    return replace(event, source=source, platform_message_id=None)


@pytest.fixture
def make_event() -> EventFactory:
    return build_event


@dataclass
class Rig:
    gateway: Gateway
    adapter: FakeAdapter
    model: ScriptedModel
    store: SQLiteSessionStore
    agent: Agent


@pytest.fixture
async def rigs(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    made: list[Rig] = []

    async def make(
        *,
        connected: bool = True,
        start: bool = True,
        adapter: FakeAdapter | None = None,
        **settings: object,
    ) -> Rig:
        store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
        model = ScriptedModel()
        agent = Agent(name="Helper", instructions="Be helpful.")
        runner = Runner(agent, store, model=model)
        fake = adapter or FakeAdapter(connected_on_start=connected)
        cfg = Settings(data_dir=tmp_path, **settings)  # type: ignore[arg-type]
        gateway = Gateway(runner, store, [fake], cfg, secret=SECRET)
        if start:
            await gateway.start()
            await gateway.wait_ready()
        rig = Rig(gateway, fake, model, store, agent)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        await rig.gateway.stop(grace=1)
        await rig.store.close()
