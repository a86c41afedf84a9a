"""SessionLeases without a server: the statements it sends, in order, and its gauges."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bot.core.stores.pglease import SessionLeases


class FakeServer:
    """Answers the lease statements from a script; records what was sent."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.sent: list[str] = []
        self.block = asyncio.Event()
        self.blocked = asyncio.Event()

    async def run(self, sql: str, *args: Any) -> Any:
        self.sent.append(sql.split()[0])
        answer = self.answers.pop(0) if self.answers else None
        if answer == "block":
            self.blocked.set()
            await self.block.wait()
            return 1
        return answer


async def test_a_held_session_is_polled_until_free_and_counted_as_waiting() -> None:
    server = FakeServer([None, 41, None, 7])
    leases = SessionLeases("me", 15.0, server.run)
    seen: list[int] = []
    original = server.run

    async def run(sql: str, *args: Any) -> Any:
        seen.append(leases.waiting)
        return await original(sql, *args)

    leases._run = run
    assert await leases.take("s") == 7
    # The take, the ticket, then takes in turn until the ticket is served.
    assert server.sent == ["INSERT", "INSERT", "WITH", "WITH"]
    assert seen == [0, 1, 1, 1] and leases.waiting == 0
    assert len(leases) == 1 and leases.queued == 0
    await leases.give_back("s", 7)
    assert server.sent[-1] == "UPDATE" and len(leases) == 0
    await leases.close()


async def test_a_take_cancelled_mid_statement_frees_the_row_before_it_returns() -> None:
    server = FakeServer(["block", None])
    leases = SessionLeases("me", 15.0, server.run)
    task = asyncio.create_task(leases.take("s"))
    await server.blocked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The free went out before take() gave up the caller's in-process lock.
    assert server.sent == ["INSERT", "UPDATE"]
    assert len(leases) == 0


def test_the_fence_needs_a_lease_of_the_current_task() -> None:
    leases = SessionLeases("me", 15.0, FakeServer([]).run)
    assert leases.fence("s") is None
    token = leases.enter("s", 3)
    fence = leases.fence("s")
    assert fence is not None and fence[1] == ("s", "me", 3) and "FOR SHARE" in fence[0]
    leases.leave(token)
    assert leases.fence("s") is None


async def test_a_waiter_cancelled_while_queued_deletes_its_ticket() -> None:
    server = FakeServer([None, 41, "block"])
    leases = SessionLeases("me", 15.0, server.run)
    task = asyncio.create_task(leases.take("s"))
    await server.blocked.wait()
    assert leases.queued == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The take in turn may have won: freed; the ticket: deleted; both before returning.
    assert server.sent == ["INSERT", "INSERT", "WITH", "UPDATE", "DELETE"]
    assert leases.queued == 0 and leases.waiting == 0
