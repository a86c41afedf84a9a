"""Streamed replies end to end: ``python -m bot run`` against the fake Bot API and a
fake OpenAI server that streams its answer slowly (SSE chunks ``stream_delay`` apart).

A DM shows growing drafts, then exactly one final message; a group shows typing and
one final message, never a draft; a SIGKILL mid-stream still ends with one reply.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.gateway.ledger.obligations import RECOVERED_MARKER
from bot.gateway.replies import Replies
from tests.e2e.botprocess import BotProcess
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, RecordedRequest
from tests.fakes.telegram_server import FakeTelegramServer, Fault

DATA = Path(__file__).resolve().parents[1] / "data" / "telegram"
ANSWER = (
    "Your order left our warehouse this morning. It travels with the courier today "
    "and should reach you tomorrow before noon; the tracking link follows by e-mail."
)


def update(name: str, update_id: int, **message: Any) -> dict[str, Any]:
    payload: dict[str, Any] = copy.deepcopy(json.loads((DATA / f"{name}.json").read_text()))
    payload["update_id"] = update_id
    payload["message"].update(message)
    return payload


def slow_answer(request: RecordedRequest) -> FakeResponse:
    reply = FakeOpenAIServer.reply(ANSWER)
    reply.chunk_chars = 8
    if not request.streamed:
        reply.delay = 1.0  # long enough for "typing"
    return reply


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(responder=slow_answer) as server:
        server.stream_delay = 0.12  # about 2.5 s for the whole answer
        yield server


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


@pytest.fixture
async def bot(
    tmp_path: Path, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> AsyncIterator[BotProcess]:
    process = BotProcess(
        tmp_path / "data",
        {
            "TELEGRAM_BOT_TOKEN": telegram.token,
            "TELEGRAM_API_BASE_URL": telegram.base_url,
            "OPENAI_API_KEY": openai.api_key,
            "OPENAI_BASE_URL": openai.base_url,
            "DEFAULT_MODEL": "gpt-4o-mini",
        },
    )
    await process.start()
    yield process
    await process.kill()


def assert_growing_drafts(telegram: FakeTelegramServer, final: str) -> None:
    texts = [frame.text for frame in telegram.drafts]
    assert len(set(texts)) >= 2, texts
    for earlier, later in itertools.pairwise(texts):
        assert later.startswith(earlier)
    assert all(final.startswith(text) for text in texts)
    assert len({frame.draft_id for frame in telegram.drafts}) == 1
    times = [frame.at for frame in telegram.drafts]
    assert all(b - a >= 0.9 for a, b in itertools.pairwise(times))  # throttled


async def test_a_dm_shows_growing_drafts_then_one_final_message(
    bot: BotProcess, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    telegram.push_update(update("private_text", 1, text="where is my order?"))
    (final,) = await telegram.wait_for_sent(1, within=30)
    assert final.text == ANSWER
    assert final.chat_id == 111111111
    assert_growing_drafts(telegram, ANSWER)
    assert telegram.drafts[0].at < openai.chat_requests[0].chunk_times[-1]  # before the end
    (request,) = openai.chat_requests
    assert request.streamed
    assert await bot.stop() == 0
    assert len(telegram.sent) == 1
    log = "\n".join(bot.log)
    assert ANSWER[:30] not in log and "where is my order" not in log


async def test_a_fast_short_answer_still_shows_several_growing_drafts(
    bot: BotProcess, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    """Drafts: 12 chunks over 1.8 s showed one draft, the whole answer. The typing
    action and the first draft fall due together, and the pacer dropped the draft."""

    def twelve_chunks(request: RecordedRequest) -> FakeResponse:
        reply = FakeOpenAIServer.reply(ANSWER)
        reply.chunk_chars = -(-len(ANSWER) // 12)
        return reply

    openai.responder = twelve_chunks
    openai.stream_delay = 0.15
    telegram.push_update(update("private_text", 1, text="where is my order?"))
    (final,) = await telegram.wait_for_sent(1, within=30)
    assert final.text == ANSWER
    (request,) = openai.chat_requests
    assert len(request.chunk_times) in (12, 13)  # 12 pieces (and the closing chunk)
    assert_growing_drafts(telegram, ANSWER)
    first = telegram.drafts[0].text
    assert len(first) < len(ANSWER) // 2, first  # the preview grew from early on


async def test_a_group_shows_typing_and_one_final_message(
    bot: BotProcess, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    telegram.push_update(update("group_mention", 1))
    (final,) = await telegram.wait_for_sent(1, within=30)
    assert final.text == ANSWER
    assert final.chat_id == -1001234567890
    assert telegram.drafts == []
    assert telegram.chat_actions  # typing while the model worked
    (request,) = openai.chat_requests
    assert not request.streamed  # nothing to show it to: a plain call


async def test_flood_control_on_drafts_never_delays_or_drops_the_final(
    bot: BotProcess, telegram: FakeTelegramServer
) -> None:
    telegram.inject("sendMessageDraft", Fault.flood(60))
    telegram.push_update(update("private_text", 1, text="where is my order?"))
    (final,) = await telegram.wait_for_sent(1, within=30)
    assert final.text == ANSWER
    assert telegram.drafts == []  # paused for the rest of the answer
    assert await bot.stop() == 0
    assert len(telegram.sent) == 1


async def test_a_kill_mid_stream_ends_with_exactly_one_final_reply(
    bot: BotProcess, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    telegram.push_update(update("private_text", 1, text="where is my order?"))
    await telegram.wait_for_request("sendMessageDraft", 1, within=30)
    await bot.kill()
    assert telegram.sent == []
    shown = len(telegram.drafts)
    await bot.start()
    (final,) = await telegram.wait_for_sent(1, within=30)
    assert final.text == ANSWER  # the turn re-ran from the journal: whole, not truncated
    assert not final.text.startswith(RECOVERED_MARKER)
    assert len(telegram.drafts) > shown  # streamed again after the restart
    assert await bot.stop() == 0
    assert len(telegram.sent) == 1
    assert len(openai.chat_requests) == 2


@pytest.mark.parametrize(
    ("setting", "streamed"),
    [
        pytest.param("true", True, id="stream-replies-on"),
        pytest.param("false", False, id="stream-replies-off"),
    ],
)
async def test_chat_prints_tokens_as_they_arrive_and_the_reply_once(
    tmp_path: Path, openai: FakeOpenAIServer, setting: str, streamed: bool
) -> None:
    env = {
        **BotProcess(tmp_path / "data", {}).env,
        "OPENAI_API_KEY": openai.api_key,
        "OPENAI_BASE_URL": openai.base_url,
        "DEFAULT_MODEL": "gpt-4o-mini",
        "STREAM_REPLIES": setting,
    }
    (tmp_path / "data").mkdir()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "chat",
        cwd=tmp_path,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(b"where is my order?\n")
    await proc.stdin.drain()
    # Piped stdin still works: the first bytes arrive while the model is still writing.
    first = await asyncio.wait_for(proc.stdout.read(12), 30)
    (request,) = openai.chat_requests
    assert request.streamed is streamed
    if streamed:
        assert len(request.chunk_times) < len(ANSWER) // 8  # the stream is not over yet
    proc.stdin.close()
    rest, _ = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    assert (first + rest).decode() == f"[Triage] {ANSWER}\n"


async def test_a_long_streamed_answer_ends_as_the_usual_split_messages(
    bot: BotProcess, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    long_answer = " ".join(f"Step {n}: check the parcel label and the address." for n in range(120))

    def answer(request: RecordedRequest) -> FakeResponse:
        reply = FakeOpenAIServer.reply(long_answer)
        reply.chunk_chars = 250
        return reply

    openai.responder = answer
    telegram.push_update(update("private_text", 1, text="how do I check?"))
    first, second = await telegram.wait_for_sent(2, within=30)
    assert len(long_answer) > 4096
    assert first.text + " " + second.text == long_answer  # today's split, at a word
    assert telegram.drafts
    assert all(len(frame.text) <= 4096 for frame in telegram.drafts)
    # Past 4096 characters the draft shows the part being written, the second message's start.
    assert any(frame.text.startswith(second.text[:40]) for frame in telegram.drafts)
    assert await bot.stop() == 0
    assert len(telegram.sent) == 2


async def test_a_model_failing_mid_stream_is_answered_by_one_apology(
    bot: BotProcess, telegram: FakeTelegramServer, openai: FakeOpenAIServer
) -> None:
    def broken(request: RecordedRequest) -> FakeResponse:
        reply = FakeOpenAIServer.reply(ANSWER)
        reply.chunk_chars = 8
        reply.break_after = 12  # about 1.4 s of text, then an error event
        return reply

    openai.responder = broken
    telegram.push_update(update("private_text", 1, text="where is my order?"))
    (final,) = await telegram.wait_for_sent(1, within=30)
    assert telegram.drafts  # part of the answer was on screen
    assert final.text == Replies().apology  # the half answer was not delivered
    assert all(ANSWER.startswith(frame.text) for frame in telegram.drafts)
    assert await bot.stop() == 0
    assert len(telegram.sent) == 1


async def test_a_final_refused_by_flood_control_is_resent_once_by_the_ledger(
    bot: BotProcess, telegram: FakeTelegramServer
) -> None:
    telegram.inject("sendMessage", Fault.flood(1))
    telegram.push_update(update("private_text", 1, text="where is my order?"))
    await telegram.wait_for_request("sendMessage", 1, within=30)
    (final,) = await telegram.wait_for_sent(1, within=30)
    assert final.text == ANSWER
    assert_growing_drafts(telegram, ANSWER)
    assert await bot.stop() == 0
    assert len(telegram.sent) == 1
