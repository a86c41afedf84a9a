"""``python -m bot run`` against the fakes: a 60-turn WhatsApp conversation with compaction on
keeps the order id of turn 2 in the model's request at turn 60, with every request under the
trigger plus one turn; with compaction off, pruning has lost it by then.

(WhatsApp: Telegram's one-message-a-second pacing per chat would make it a minute long.)
The fake OpenAI server plays a model that answers with the order ids it can see in its
request and summarises compaction requests (``tests.fakes.openai_summariser``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.e2e.botprocess import READY_LINE, BotProcess
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.openai_summariser import ANSWER_PREFIX, Summariser
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender

TURNS = 60
ORDER = "ORD-4471"
TRIGGER = 1500
COMPACTED_LINE = "compacted:"  # the compactor's INFO line, once per compaction
WORDS = ("parcel", "courier", "delivery", "address", "invoice", "refund", "package", "weekend")


class WatchedBot(BotProcess):
    """The bot, with an event for each compaction its log reports."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        super().__init__(data_dir, env)
        self.compactions = 0
        self._changed = asyncio.Condition()

    async def _read(self, ready: asyncio.Future[None]) -> None:
        # BotProcess._read, counting the compactions as their lines arrive.
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.log.append(text)
            if READY_LINE in text and not ready.done():
                ready.set_result(None)
            if COMPACTED_LINE in text:
                async with self._changed:
                    self.compactions += 1
                    self._changed.notify_all()
        if not ready.done():
            ready.set_exception(AssertionError("bot exited:\n" + "\n".join(self.log)))

    async def wait_compactions(self, count: int, within: float = 20.0) -> None:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self.compactions >= count), within
            )


APP_SECRET = "e2e-app-secret"


@pytest.fixture
async def graph() -> AsyncIterator[FakeWhatsAppServer]:
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as server:
        yield server


async def _converse(
    tmp_path: Path, graph: FakeWhatsAppServer, compaction: dict[str, str]
) -> tuple[Summariser, list[str], WatchedBot]:
    summariser = Summariser()
    async with FakeOpenAIServer(responder=summariser) as openai:
        bot = WatchedBot(
            tmp_path / "data",
            {
                "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
                "WHATSAPP_TOKEN": "e2e-token",
                "WHATSAPP_VERIFY_TOKEN": "verify-me",
                "WHATSAPP_APP_SECRET": APP_SECRET,
                "WHATSAPP_API_BASE_URL": graph.base_url,
                "OPENAI_API_KEY": openai.api_key,
                "OPENAI_BASE_URL": openai.base_url,
                "DEFAULT_MODEL": "gpt-test",
                "STREAM_REPLIES": "false",
                **compaction,
            },
        )
        await bot.start()
        sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
        try:
            for turn in range(1, TURNS + 1):
                text = (
                    f"My order id is {ORDER}, please keep it."
                    if turn == 2
                    else f"Tell me about the {WORDS[turn % len(WORDS)]}, please."
                )
                if turn == TURNS:
                    text = "What was my order id again?"
                response = await sender.post_one(sender.text(text))
                assert response.status_code == 200
                await graph.wait_for_sent(turn, within=30)
                # The next message waits for a compaction the reply set off: it runs after
                # the reply is sent, and this test measures each request against the trigger.
                await bot.wait_compactions(len(summariser.summary_requests))
        finally:
            await bot.stop()
        sent = await graph.wait_for_sent(TURNS)
        return summariser, [str(s.json["text"]["body"]) for s in sent], bot


def _prompt_tokens(body: object) -> int:
    return len(json.dumps(body, ensure_ascii=False).encode()) // 4


async def test_sixty_turns_with_compaction_keep_the_order_id_of_turn_2(
    tmp_path: Path, graph: FakeWhatsAppServer
) -> None:
    summariser, replies, bot = await _converse(
        tmp_path,
        graph,
        {"COMPACTION_TRIGGER_TOKENS": str(TRIGGER), "COMPACTION_KEEP_RECENT_TURNS": "4"},
    )
    assert summariser.summary_requests, "no summary was asked for"
    assert bot.compactions == len(summariser.summary_requests)
    final = summariser.chat_requests[-1]
    assert ORDER in json.dumps(final.body)
    assert final.messages[0]["role"] == "system" and ORDER in final.messages[0]["content"]
    assert replies[-1].endswith(f"{ANSWER_PREFIX} {ORDER}.")
    # Every request stays under the trigger plus one turn.
    sizes = [_prompt_tokens(r.body) for r in summariser.chat_requests]
    one_turn = max(b - a for a, b in itertools.pairwise(sizes[:6]))  # before any compaction
    assert max(sizes) <= TRIGGER + one_turn, (max(sizes), one_turn)
    assert sizes[-1] < sizes[0] + TRIGGER
    log = "\n".join(bot.log)
    assert ORDER not in log


async def test_sixty_turns_without_compaction_lose_it_to_pruning(
    tmp_path: Path, graph: FakeWhatsAppServer
) -> None:
    summariser, replies, _ = await _converse(tmp_path, graph, {})
    assert summariser.summary_requests == []
    final = summariser.chat_requests[-1]
    assert ORDER not in json.dumps(final.body)
    assert replies[-1].endswith(f"{ANSWER_PREFIX} none.")
    # Turn 20 still had it in its history: pruning dropped it later.
    assert ORDER in json.dumps(summariser.chat_requests[19].body)
