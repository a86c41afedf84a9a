"""Sleeping in a timer loop until a deadline, or earlier when told to (stop, new work)."""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["wait_any"]


async def wait_any(seconds: float, *events: asyncio.Event) -> None:
    """Return when one of ``events`` is set or ``seconds`` have passed."""
    waiters = {asyncio.ensure_future(event.wait()) for event in events}
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
