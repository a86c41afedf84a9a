"""Streamed replies: time to first visible text (first draft) against time to the final
reply, for a 2,000-character answer written at a given token rate, streamed and not.

A real gateway as ``bot/app.py`` builds it on SQLite, an in-process adapter that shows
drafts the way Telegram private chats do (one per second), and a model that writes
``--chars`` characters in 4-character tokens at ``--rate`` tokens per second (the LLM's
pace simulated, its cost otherwise taken out). Each mode answers ``--runs`` messages
one after another. ``python -m bench.streaming [--rate 100 --chars 2000 --runs 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import bench_tmpdir, median, print_table, write_result
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.messages import Message
from bot.core.models.base import ModelResponse, OnText, ToolSpec
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.contract import EventHandler, PlatformAdapter, SendResult
from bot.gateway.events import MessageEvent, SessionSource
from bot.gateway.gateway import Gateway

NAME = "streaming"
TOKEN_CHARS = 4
DRAFT_SECONDS = 1.0
"""Telegram's pace (``bot.platforms.telegram.drafts.DRAFT_INTERVAL``)."""


class PacedModel:
    """Writes a fixed answer token by token at ``rate`` tokens per second."""

    def __init__(self, chars: int, rate: float) -> None:
        words = ("Your order is on its way and will arrive soon. " * (chars // 40 + 1))[:chars]
        self.tokens = [words[i : i + TOKEN_CHARS] for i in range(0, chars, TOKEN_CHARS)]
        self.rate = rate

    async def complete(
        self, *, model: str, system: str, messages: Sequence[Message], tools: Sequence[ToolSpec]
    ) -> ModelResponse:
        """The whole answer after the time it takes to write it."""
        await asyncio.sleep(len(self.tokens) / self.rate)
        return ModelResponse(content="".join(self.tokens))

    async def stream(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText,
    ) -> ModelResponse:
        """The answer, one token every ``1 / rate`` s (paced against a start time)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        for index, token in enumerate(self.tokens):
            await asyncio.sleep(max(0.0, started + (index + 1) / self.rate - loop.time()))
            on_text(token)
        return ModelResponse(content="".join(self.tokens))


@dataclass
class DraftAdapter(PlatformAdapter):
    """Records when the first draft and the final reply of each message arrive."""

    name: str = "bench"
    max_text_len: int = 4096
    first_draft: dict[str, float] = field(default_factory=dict)
    drafts: int = 0
    finals: dict[str, asyncio.Future[float]] = field(default_factory=dict)
    _connected: bool = False

    @property
    def is_connected(self) -> bool:
        """Always, once started."""
        return self._connected

    async def start(self, on_event: EventHandler) -> None:
        """Keep the gateway's entry point."""
        self.on_event = on_event
        self._connected = True

    async def stop(self) -> None:
        """Disconnect."""
        self._connected = False

    async def send(
        self, chat_id: str, text: str, *, thread_id: str | None = None, reply_to: str | None = None
    ) -> SendResult:
        """The final reply: resolve its waiter."""
        waiter = self.finals.get(reply_to or "")
        if waiter is not None and not waiter.done():
            waiter.set_result(time.perf_counter())
        return SendResult(message_ids=["out"])

    def draft_interval(self, event: MessageEvent) -> float | None:
        """Telegram's pace."""
        return DRAFT_SECONDS

    async def send_draft(self, event: MessageEvent, draft_id: int, text: str) -> None:
        """Note the first draft of each answer."""
        self.drafts += 1
        self.first_draft.setdefault(event.platform_message_id or "", time.perf_counter())


async def measure(
    directory: Path, *, streamed: bool, chars: int, rate: float, runs: int
) -> dict[str, Any]:
    """Answer ``runs`` messages one by one; the medians of first-visible and final times."""
    settings = Settings(_env_file=None, data_dir=directory, stream_replies=streamed)
    store = SQLiteSessionStore(str(settings.database_path))
    agent = Agent(name="Support", instructions="Answer.")
    runner = Runner(agent, store, model=PacedModel(chars, rate), stream_replies=streamed)
    adapter = DraftAdapter()
    gateway = Gateway(runner, store, [adapter], settings, secret=b"bench-installation-secret")
    await gateway.start()
    await gateway.wait_ready()
    firsts: list[float] = []
    finals: list[float] = []
    try:
        for n in range(runs):
            ref = f"m{n}"
            waiter: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            adapter.finals[ref] = waiter
            event = MessageEvent(
                platform="bench",
                message_id=f"bench:1:{n}",
                platform_message_id=ref,
                source=SessionSource("bench", "chat-1", "dm", "user-1"),
                text="Where is my order?",
            )
            started = time.perf_counter()
            await adapter.on_event(event)
            final = await asyncio.wait_for(waiter, 120) - started
            first = adapter.first_draft.get(ref)
            finals.append(final)
            firsts.append(final if first is None else first - started)
    finally:
        await gateway.stop(grace=10)
        await store.close()
    return {
        "streamed": streamed,
        "first_visible_s": median(firsts),
        "final_s": median(finals),
        "drafts_per_answer": adapter.drafts / runs,
    }


async def run(chars: int, rate: float, runs: int) -> dict[str, Any]:
    """Both modes, their table, and ``results/streaming.json``."""
    modes = []
    for streamed in (False, True):
        with bench_tmpdir(NAME) as directory:
            modes.append(
                await measure(directory, streamed=streamed, chars=chars, rate=rate, runs=runs)
            )
    print_table(
        f"Streaming: a {chars:,}-character answer at {rate:g} tokens/s "
        f"({TOKEN_CHARS} characters each), median of {runs}",
        ["mode", "first visible text s", "final reply s", "drafts per answer"],
        [
            [
                "STREAM_REPLIES=true (drafts)" if m["streamed"] else "STREAM_REPLIES=false",
                f"{m['first_visible_s']:.2f}",
                f"{m['final_s']:.2f}",
                f"{m['drafts_per_answer']:.1f}",
            ]
            for m in modes
        ],
    )
    payload = {"chars": chars, "tokens_per_s": rate, "runs": runs, "modes": modes}
    write_result(NAME, payload)
    return payload


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m bench.streaming``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chars", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=100.0, help="tokens per second")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    asyncio.run(run(args.chars, args.rate, args.runs))


if __name__ == "__main__":
    main()
