"""A gateway process for the kill-point tests: file-backed adapter, echo model.

Run as ``python tests/gateway/killpoint_harness.py DIR [KILL_AT]``. It reads
inbound messages from ``DIR/inbound.jsonl`` (offered again on every start, as a
platform redelivers unconfirmed updates), appends every send to
``DIR/sent.jsonl`` (fsynced), and with ``KILL_AT`` SIGKILLs itself at that
point the first time it gets there:

- ``after_accept``: inside the model call, after tx 1, before tx 2;
- ``after_commit``: after tx 2 (the obligation written already claimed), before the send;
- ``during_send``: after the message reached the "platform", before send returns;
- ``after_send``: after send returned, before ``mark_delivered``;
- ``before_group_commit``: every reply sent and its delivered mark buffered,
  before the group commit that would write them;
- ``mid_stream``: the answer half streamed, right after its first draft was shown.

With ``HARNESS_STREAM=1`` in the environment the adapter shows drafts (appended
to ``DIR/drafts.jsonl``) and the model streams its answer in two pieces, the
second only once a draft of the first was shown.

Without ``KILL_AT`` it runs until every inbound message has its reply recorded
as delivered, then exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from starlette.routing import BaseRoute

from bot.config import Settings
from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.models.base import ModelResponse, OnText, ToolSpec
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.contract import EventHandler, PlatformAdapter, SendResult
from bot.gateway.events import MessageEvent, SessionSource
from bot.gateway.gateway import Gateway
from bot.gateway.ledger.core import DeliveredMark


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


STREAM = os.environ.get("HARNESS_STREAM") == "1"


class EchoModel:
    def __init__(self, kill: bool) -> None:
        self.kill = kill
        self.draft_shown = asyncio.Event()

    async def stream(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        on_text: OnText,
    ) -> ModelResponse:
        response = await self.complete(model=model, system=system, messages=messages, tools=tools)
        text = response.content or ""
        self.draft_shown.clear()
        on_text(text[:6])
        await self.draft_shown.wait()
        on_text(text[6:])
        return response

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        if self.kill:
            die()
        last = [m for m in messages if m.role is Role.USER][-1]
        return ModelResponse(content=f"echo: {last.content}")


class FileAdapter(PlatformAdapter):
    name = "fake"
    max_text_len = 4096

    def __init__(self, root: Path, kill_at: str | None, model: EchoModel) -> None:
        self.root = root
        self.model = model
        self.kill_mid_stream = kill_at == "mid_stream"
        self.kill_before_send = kill_at == "after_commit"
        self.kill_during_send = kill_at == "during_send"
        self._connected = False
        self.expected = len((root / "inbound.jsonl").read_text().splitlines())
        self.sends = 0
        self.all_sent = asyncio.Event()

    @property
    def is_connected(self) -> bool:
        return self._connected

    async def start(self, on_event: EventHandler) -> None:
        self._connected = True
        self._on_event = on_event

    async def offer_all(self) -> None:
        for line in (self.root / "inbound.jsonl").read_text().splitlines():
            item = json.loads(line)
            await self._on_event(
                MessageEvent(
                    platform="fake",
                    message_id=item["id"],
                    platform_message_id=item["id"],
                    source=SessionSource("fake", item["chat"], "dm", item["chat"]),
                    text=item["text"],
                )
            )

    async def stop(self) -> None:
        self._connected = False

    async def send(
        self, chat_id: str, text: str, *, thread_id: str | None = None, reply_to: str | None = None
    ) -> SendResult:
        if self.kill_before_send:
            die()
        record = json.dumps({"chat": chat_id, "text": text, "reply_to": reply_to})
        # Blocking on purpose: the record must be on disk before a SIGKILL can land.
        with open(self.root / "sent.jsonl", "a") as f:  # noqa: ASYNC230
            f.write(record + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.kill_during_send:
            die()
        self.sends += 1
        if self.sends >= self.expected:
            self.all_sent.set()
        return SendResult(message_ids=[reply_to or "x"])

    async def indicate_typing(self, event: MessageEvent) -> None:
        return None

    def draft_interval(self, event: MessageEvent) -> float | None:
        return 0.01 if STREAM else None

    async def send_draft(self, event: MessageEvent, draft_id: int, text: str) -> None:
        record = json.dumps({"chat": event.source.chat_id, "draft_id": draft_id, "text": text})
        with open(self.root / "drafts.jsonl", "a") as f:  # noqa: ASYNC230
            f.write(record + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self.kill_mid_stream:
            die()
        self.model.draft_shown.set()

    def format_reply(self, text: str, agent_name: str) -> str:
        return text

    def routes(self) -> Sequence[BaseRoute]:
        return []


async def main(root: Path, kill_at: str | None) -> None:
    store = SQLiteSessionStore(str(root / "chatflow.db"))
    model = EchoModel(kill_at == "after_accept")
    runner = Runner(Agent(name="Echo", instructions="echo"), store, model=model)
    adapter = FileAdapter(root, kill_at, model)
    gateway = Gateway(runner, store, [adapter], Settings(data_dir=root), secret=b"s" * 32)
    if kill_at == "after_send":

        async def kill_delivered(*args: Any, **kwargs: Any) -> bool:
            die()
            return False

        gateway.ledger.mark_delivered = kill_delivered  # type: ignore[method-assign]
    if kill_at == "before_group_commit":

        async def kill_before_commit(marks: Sequence[DeliveredMark]) -> set[str]:
            # Hold the first commit until every reply left, so all their marks are buffered.
            await adapter.all_sent.wait()
            die()
            return set()

        gateway.ledger._write_delivered = kill_before_commit  # type: ignore[method-assign]
    await gateway.start()
    await gateway.wait_ready()
    await adapter.offer_all()
    expected = adapter.expected
    while True:
        await gateway._dispatcher.drain(30)
        status = await gateway.ledger.status()
        if status.get("delivered", 0) >= expected:
            break
        await asyncio.sleep(0.05)
    await gateway.stop(grace=5)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
