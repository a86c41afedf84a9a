"""Gauges of a runner's turns: running, and waiting for their session (``/metrics``)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Protocol

__all__ = ["CountedTurn", "TurnGauges"]


class TurnGauges(Protocol):
    """What keeps the counts (the ``Runner``)."""

    turns_running: int
    turns_waiting: int


class CountedTurn:
    """``async with`` a session lock, counted in the runner's gauges (a class, not a
    generator: one per turn, on the pipeline's hot path)."""

    __slots__ = ("_lock", "_runner")

    def __init__(self, runner: TurnGauges, lock: AbstractAsyncContextManager[None]) -> None:
        self._runner = runner
        self._lock = lock

    async def __aenter__(self) -> None:
        runner = self._runner
        runner.turns_waiting += 1
        try:
            await self._lock.__aenter__()
        finally:
            runner.turns_waiting -= 1
        runner.turns_running += 1

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._runner.turns_running -= 1
        await self._lock.__aexit__(exc_type, exc, traceback)
