"""Records the child processes the code under test starts (``asyncio.create_subprocess_exec``).

The PDF reader runs pypdf in a child process; tests use this to wait until one
runs and to check that none outlives its read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

__all__ = ["Children"]


class Children:
    """The child processes started since ``record``, in order."""

    def __init__(self) -> None:
        self.processes: list[asyncio.subprocess.Process] = []
        self._changed = asyncio.Condition()

    @classmethod
    def record(cls, monkeypatch: pytest.MonkeyPatch) -> Children:
        """Start recording (until ``monkeypatch`` undoes it at the test's end)."""
        seen = cls()
        real = asyncio.create_subprocess_exec

        async def recording(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
            process = await real(*args, **kwargs)
            async with seen._changed:
                seen.processes.append(process)
                seen._changed.notify_all()
            return process

        monkeypatch.setattr(asyncio, "create_subprocess_exec", recording)
        return seen

    async def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Wait until ``count`` processes were started; ``TimeoutError`` after ``timeout``."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.processes) >= count), timeout
            )

    def running(self) -> list[asyncio.subprocess.Process]:
        """The processes that have not ended (or were not reaped yet)."""
        return [p for p in self.processes if p.returncode is None]
