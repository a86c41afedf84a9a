"""``python -m bot run`` against the fakes: a tool that waits for the person's yes.

The fake OpenAI server is scripted to call ``refund`` (``tests.fakes.approval_agents``,
``needs_approval=True``); the question goes out with Approve / Deny (an inline
keyboard on Telegram, reply buttons on WhatsApp), the fake pushes the tap, and the
tool's runs are counted in ``DATA_DIR/refunds.log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.core.approvals import DECLINED_RESULT, EXPIRED_RESULT
from bot.gateway.approvals import NOT_YOURS, TABLE
from bot.gateway.taps import EXPIRED_NOTICE
from tests.e2e.botprocess import BotProcess
from tests.e2e.telegram_bot_fixtures import telegram
from tests.e2e.test_media_bots import telegram_update
from tests.fakes.approval_agents import runs
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender

__all__ = ["telegram"]  # the fixture, imported for this module's tests

APP_SECRET = "e2e-approvals-secret"
ALICE = 111111111
GROUP = -1001234567890
QUESTION = "May I refund order 1001 for 25.00?"


def env(openai: FakeOpenAIServer, **more: str) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": openai.api_key,
        "OPENAI_BASE_URL": openai.base_url,
        "DEFAULT_MODEL": "gpt-test",
        "AGENTS_MODULE": "tests.fakes.approval_agents",
        "STREAM_REPLIES": "false",
        **more,
    }


def telegram_env(
    openai: FakeOpenAIServer, telegram: FakeTelegramServer, **more: str
) -> dict[str, str]:
    return env(
        openai, TELEGRAM_BOT_TOKEN=telegram.token, TELEGRAM_API_BASE_URL=telegram.base_url, **more
    )


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path, openai: FakeOpenAIServer, telegram: FakeTelegramServer, **more: str
) -> AsyncIterator[BotProcess]:
    """The approvals bot polling ``telegram``, started; SIGKILLed afterwards."""
    bot = BotProcess(tmp_path / "data", telegram_env(openai, telegram, **more))
    await bot.start()
    try:
        yield bot
    finally:
        await bot.kill()


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


def tool_results(openai: FakeOpenAIServer) -> list[Any]:
    """The tool results the model read in its last request."""
    return [m["content"] for m in openai.chat_requests[-1].messages if m["role"] == "tool"]


def labels(telegram: FakeTelegramServer, chat: int, message_id: int) -> list[str]:
    rows = telegram.buttons.keyboards[(str(chat), message_id)]
    return [button["text"] for row in rows for button in row]


def approval_ids(data_dir: Path) -> list[str]:
    """Every approval's id in the bot's database (the operator's `approvals show` needs one)."""
    with contextlib.closing(sqlite3.connect(data_dir / "chatflow.db")) as db:
        return [str(row[0]) for row in db.execute(f"SELECT id FROM {TABLE}")]


def ask(openai: FakeOpenAIServer, *then: str) -> None:
    """Script the model: call refund, then answer each of ``then`` in turn."""
    openai.add(openai.call("refund", order_id="1001", amount=25), *(openai.reply(t) for t in then))


async def test_telegram_approve_runs_the_tool_once_and_the_answer_arrives(
    tmp_path: Path, openai: FakeOpenAIServer, telegram: FakeTelegramServer
) -> None:
    ask(openai, "Refunded 25 on order 1001.")
    async with running(tmp_path, openai, telegram) as bot:
        telegram.push_update(telegram_update("private_text", 1, text="refund order 1001"))
        (question,) = await telegram.wait_for_sent(1, within=20)
        keyboard = labels(telegram, ALICE, question.message_id)
        assert runs(bot.data_dir) == []
        telegram.buttons.tap(ALICE, question.message_id, "Approve")
        await telegram.buttons.wait_for_answers(1, within=20)
        (_, answer) = await telegram.wait_for_sent(2, within=20)
        # A second tap on the used keyboard (a double tap) changes nothing.
        telegram.buttons.tap(ALICE, question.message_id, "Deny")
        answers = await telegram.buttons.wait_for_answers(2, within=20)
    assert question.text == QUESTION
    assert keyboard == ["Approve", "Deny"]
    assert [a.get("text") for a in answers] == ["Approved.", EXPIRED_NOTICE]
    assert answer.text == "Refunded 25 on order 1001."
    assert tool_results(openai) == ["refunded 25.0 on order 1001"]
    [run] = runs(bot.data_dir)
    assert run.startswith("1001 25.0 approval:")
    assert len(openai.chat_requests) == 2 and len(telegram.sent) == 2


async def test_telegram_a_failed_answer_after_the_approved_refund_keeps_that_it_ran(
    tmp_path: Path, openai: FakeOpenAIServer, telegram: FakeTelegramServer
) -> None:
    """G6: the model fails after the approved tool ran; the approval is done with the
    result kept, and the retry's model reads it: the refund runs once."""
    openai.add(
        openai.call("refund", order_id="1001", amount=25),
        openai.error(400, "scripted failure after the tool"),
        openai.reply("Yes: 25 were refunded on order 1001."),
    )
    async with running(tmp_path, openai, telegram) as bot:
        telegram.push_update(telegram_update("private_text", 1, text="refund order 1001"))
        (question,) = await telegram.wait_for_sent(1, within=20)
        telegram.buttons.tap(ALICE, question.message_id, "Approve")
        (_, apology) = await telegram.wait_for_sent(2, within=20)
        [approval_id] = await asyncio.to_thread(approval_ids, bot.data_dir)
        code, shown, err = await bot.command("approvals", "show", approval_id)
        retry = telegram_update("private_text", 2, text="did it work?", message_id=2)
        del retry["update_id"]  # numbered by the fake, after the tap it pushed
        telegram.push_update(retry)
        (*_, answer) = await telegram.wait_for_sent(3, within=20)
    assert "try again" in apology.text
    assert code == 0, err
    assert shown.splitlines()[0] == f"approval {approval_id}: done (by the user)"
    assert "result:\nrefunded 25.0 on order 1001" in shown
    assert answer.text == "Yes: 25 were refunded on order 1001."
    assert tool_results(openai) == ["refunded 25.0 on order 1001"]
    assert len(runs(bot.data_dir)) == 1


async def test_telegram_deny_tells_the_model_the_user_declined(
    tmp_path: Path, openai: FakeOpenAIServer, telegram: FakeTelegramServer
) -> None:
    ask(openai, "OK, I did not refund it.")
    async with running(tmp_path, openai, telegram) as bot:
        telegram.push_update(telegram_update("private_text", 1, text="refund order 1001"))
        (question,) = await telegram.wait_for_sent(1, within=20)
        telegram.buttons.tap(ALICE, question.message_id, "Deny")
        (answer,) = await telegram.buttons.wait_for_answers(1, within=20)
        await telegram.wait_for_sent(2, within=20)
    assert answer.get("text") == "Denied."
    assert tool_results(openai) == [DECLINED_RESULT]
    assert runs(bot.data_dir) == []


async def test_telegram_another_group_member_is_refused_and_nothing_runs(
    tmp_path: Path, openai: FakeOpenAIServer, telegram: FakeTelegramServer
) -> None:
    ask(openai, "Refunded.")
    async with running(tmp_path, openai, telegram) as bot:
        telegram.push_update(
            telegram_update("group_mention", 1, text="🙂 @chatflow_test_bot refund 1001")
        )
        (question,) = await telegram.wait_for_sent(1, within=20)
        telegram.buttons.tap(GROUP, question.message_id, "Approve", from_id=222222222)
        (refusal,) = await telegram.buttons.wait_for_answers(1, within=20)
        requests_after_refusal = len(openai.chat_requests)
        runs_after_refusal = runs(bot.data_dir)
        keyboard_after_refusal = labels(telegram, GROUP, question.message_id)
        # The keyboard stayed usable: the person who asked approves.
        telegram.buttons.tap(GROUP, question.message_id, "Approve", from_id=ALICE)
        await telegram.buttons.wait_for_answers(2, within=20)
        await telegram.wait_for_sent(2, within=20)
    assert refusal.get("text") == NOT_YOURS
    assert requests_after_refusal == 1 and runs_after_refusal == []
    assert keyboard_after_refusal == ["Approve", "Deny"]  # not removed, still usable
    assert len(runs(bot.data_dir)) == 1


async def test_telegram_unanswered_approval_expires_and_the_model_hears_it(
    tmp_path: Path, openai: FakeOpenAIServer, telegram: FakeTelegramServer
) -> None:
    ask(openai, "No answer, so nothing was refunded.")
    async with running(tmp_path, openai, telegram, APPROVAL_TTL_SECONDS="1") as bot:
        telegram.push_update(telegram_update("private_text", 1, text="refund order 1001"))
        (question,) = await telegram.wait_for_sent(1, within=20)
        (_, answer) = await telegram.wait_for_sent(2, within=30)
        telegram.buttons.tap(ALICE, question.message_id, "Approve")
        (late,) = await telegram.buttons.wait_for_answers(1, within=20)
    assert answer.text == "No answer, so nothing was refunded."
    assert tool_results(openai) == [EXPIRED_RESULT]
    assert late.get("text") in ("This request has expired.", EXPIRED_NOTICE)  # either refusal
    assert runs(bot.data_dir) == [] and len(openai.chat_requests) == 2


async def test_telegram_approved_after_a_sigkill_and_restart(
    tmp_path: Path, openai: FakeOpenAIServer, telegram: FakeTelegramServer
) -> None:
    ask(openai, "Refunded after all.")
    async with running(tmp_path, openai, telegram) as bot:
        telegram.push_update(telegram_update("private_text", 1, text="refund order 1001"))
        (question,) = await telegram.wait_for_sent(1, within=20)
        await bot.kill()  # SIGKILL: the approval lives only in the database now
        await bot.start()
        telegram.buttons.tap(ALICE, question.message_id, "Approve")
        (approved,) = await telegram.buttons.wait_for_answers(1, within=20)
        # The question may be resent once (with the marker) if the kill came before
        # its delivery was recorded; the answer follows either way.
        sent = await telegram.wait_for_sent(2, within=20)
        if sent[-1].text != "Refunded after all.":
            sent = await telegram.wait_for_sent(3, within=20)
        answer = sent[-1]
    assert approved.get("text") == "Approved."
    assert answer.text == "Refunded after all."
    assert len(runs(bot.data_dir)) == 1


async def test_whatsapp_approval_with_reply_buttons(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    ask(openai, "Refunded 25.", "You're welcome.")
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as graph:
        bot = BotProcess(
            tmp_path / "data",
            env(
                openai,
                WHATSAPP_PHONE_ID=PHONE_NUMBER_ID,
                WHATSAPP_TOKEN="e2e-token",
                WHATSAPP_VERIFY_TOKEN="verify-me",
                WHATSAPP_APP_SECRET=APP_SECRET,
                WHATSAPP_API_BASE_URL=graph.base_url,
            ),
        )
        await bot.start()
        sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
        try:
            assert (await sender.post_one(sender.text("refund order 1001"))).status_code == 200
            (question,) = await graph.wait_for_sent(1, within=20)
            interactive = question.json["interactive"]
            replies = [b["reply"] for b in interactive["action"]["buttons"]]
            (approve,) = [r for r in replies if r["title"] == "Approve"]
            tap = sender.button_reply(
                approve["id"], approve["title"], context_id=graph.sent_wamids[0]
            )
            assert (await sender.post_one(tap)).status_code == 200
            sent = await graph.wait_for_sent(2, within=20)
            if "Refunded 25." not in json.dumps(sent[-1].json):
                sent = await graph.wait_for_sent(3, within=20)  # after the tap's notice
            # Redelivered by Meta: a duplicate, the tool does not run again.
            assert (await sender.post_one(tap)).status_code == 200
            assert (await sender.post_one(sender.text("thanks"))).status_code == 200
            while "You're welcome." not in json.dumps(sent[-1].json):
                sent = await graph.wait_for_sent(len(sent) + 1, within=20)
        finally:
            await bot.kill()
    assert question.json["type"] == "interactive" and interactive["type"] == "button"
    assert interactive["body"]["text"] == QUESTION
    assert [r["title"] for r in replies] == ["Approve", "Deny"]
    assert json.dumps([s.json for s in sent]).count("Refunded 25.") == 1
    assert len(runs(bot.data_dir)) == 1
