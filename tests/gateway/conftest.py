"""Fixtures for the gateway reliability tests: a hand-moved clock, a file store, events."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.core.sqlite_store import SQLiteSessionStore
from bot.gateway.events import MessageEvent, SessionSource


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


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
    """A DM text event; keyword arguments override event fields (``source`` too)."""
    source = kwargs.pop(
        "source",
        SessionSource(
            platform="telegram",
            chat_id="42",
            chat_type="dm",
            sender_id="42",
            sender_name="Ana",
        ),
    )
    kwargs.setdefault("text", "hola")
    kwargs.setdefault("timestamp", datetime(2025, 1, 1, 11, 59, tzinfo=UTC))
    return MessageEvent(
        platform=kwargs.pop("platform", source.platform),
        message_id=message_id,
        source=source,
        **kwargs,
    )


@pytest.fixture
def make_event() -> EventFactory:
    return build_event
