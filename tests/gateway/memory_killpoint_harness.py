"""A gateway process for the memory kill-point tests: a model that always calls ``remember``.

Run as ``python tests/gateway/memory_killpoint_harness.py DIR [KILL_AT]``, with
the file adapter of ``killpoint_harness`` (inbound from ``DIR/inbound.jsonl``,
sends appended to ``DIR/sent.jsonl``). Every message's turn calls
``remember(fact=<the text>)`` and answers ``remembered: <the text>``. With
``KILL_AT`` the process SIGKILLs itself, the first time it gets there:

- ``after_tool``: the tool ran (its request waits on the turn), before tx 2;
- ``in_commit``: inside tx 2, the memory row written, before the commit;
- ``after_commit``: after tx 2, before the send;
- ``during_send``: the reply reached the "platform", before send returns.

Without ``KILL_AT`` it runs until every message's reply is delivered, then exits 0.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.long_memory import memory_tools
from bot.core.messages import Message, Role, ToolCall
from bot.core.models.base import ModelResponse, ToolSpec
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.gateway import Gateway
from tests.gateway.killpoint_harness import EchoModel, FileAdapter, die


class RememberModel(EchoModel):
    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        last = messages[-1]
        fact = str([m for m in messages if m.role is Role.USER][-1].content)
        if last.role is Role.USER:
            return ModelResponse(
                tool_calls=[
                    ToolCall(id=f"c-{len(messages)}", name="remember", arguments={"fact": fact})
                ]
            )
        if self.kill:
            die()
        return ModelResponse(content=f"remembered: {fact}")


async def main(root: Path, kill_at: str | None) -> None:
    store = SQLiteSessionStore(str(root / "chatflow.db"))
    model = RememberModel(kill_at == "after_tool")
    agent = Agent(name="Keeper", instructions="keep facts", tools=[*memory_tools])
    runner = Runner(agent, store, model=model)
    adapter = FileAdapter(root, kill_at, model)
    gateway = Gateway(runner, store, [adapter], Settings(data_dir=root), secret=b"s" * 32)
    if kill_at == "in_commit":
        turns = importlib.import_module("bot.gateway.turns")  # after the gateway: no cycle
        original = turns.apply_memory_in

        async def apply_then_die(*args: Any, **kwargs: Any) -> tuple[int, int]:
            written: tuple[int, int] = await original(*args, **kwargs)
            assert written[0] == 1
            die()
            return written

        setattr(turns, "apply_memory_in", apply_then_die)  # noqa: B010
    await gateway.start()
    await gateway.wait_ready()
    await adapter.offer_all()
    while True:
        await gateway._dispatcher.drain(30)
        status = await gateway.ledger.status()
        if status.get("delivered", 0) >= adapter.expected:
            break
        await asyncio.sleep(0.05)
    await gateway.stop(grace=5)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
