"""``python -m bot run`` against the fakes: buttons out, taps in, on Telegram and WhatsApp.

The fake OpenAI server is scripted to call the test agent's tools
(``tests.fakes.button_agents``); the fake Bot API checks the inline keyboard
and pushes the ``callback_query`` of a tap; the fake Graph API checks the
interactive message and the webhook sender posts the ``button_reply`` /
``list_reply`` a tap produces.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bot.gateway.taps import EXPIRED_NOTICE, NOT_YOURS
from tests.e2e.botprocess import BotProcess
from tests.e2e.test_media_bots import telegram_update
from tests.fakes.button_agents import FLAVOURS
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, USER_WA_ID, WebhookSender

APP_SECRET = "e2e-buttons-secret"
QUESTION = "Which size would you like?"
CHAT = 111111111
GROUP = -1001234567890
BOB = 222222222


def env(openai: FakeOpenAIServer, **more: str) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": openai.api_key,
        "OPENAI_BASE_URL": openai.base_url,
        "DEFAULT_MODEL": "gpt-test",
        "AGENTS_MODULE": "tests.fakes.button_agents",
        **more,
    }


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


def last_user_text(openai: FakeOpenAIServer) -> str:
    message = openai.chat_requests[-1].messages[-1]
    assert message["role"] == "user"
    content = message["content"]
    return content if isinstance(content, str) else json.dumps(content)


def keyboard_of(telegram: FakeTelegramServer) -> list[dict[str, Any]]:
    (request,) = [r for r in telegram.requests if r.method == "sendMessage"][:1]
    markup = request.params["reply_markup"]
    markup = json.loads(markup) if isinstance(markup, str) else markup
    return [button for row in markup["inline_keyboard"] for button in row]


async def test_telegram_keyboard_tap_duplicate_and_used(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    openai.add(openai.call("offer_sizes"), openai.reply(QUESTION), openai.reply("Large, noted."))
    async with FakeTelegramServer() as telegram:
        bot = BotProcess(
            tmp_path / "data",
            env(openai, TELEGRAM_BOT_TOKEN=telegram.token, TELEGRAM_API_BASE_URL=telegram.base_url),
        )
        await bot.start()
        try:
            telegram.push_update(telegram_update("private_text", 1, text="ice cream please"))
            (question,) = await telegram.wait_for_sent(1, within=20)
            buttons = keyboard_of(telegram)
            # The tap: answered, the label reaches the model, the keyboard is removed.
            query = telegram.buttons.tap(CHAT, question.message_id, "Large")
            await telegram.buttons.wait_for_answers(1, within=20)
            await telegram.wait_for_sent(2, within=20)
            await telegram.buttons.wait_for_edits(1, within=20)
            # The same callback again (a redelivery), then another button of the used keyboard.
            telegram.buttons.tap(CHAT, question.message_id, "Large", query_id=query)
            telegram.buttons.tap(CHAT, question.message_id, "Small *S*")
            answers = await telegram.buttons.wait_for_answers(2, within=20)
        finally:
            await bot.kill()
    assert question.text == QUESTION
    assert [b["text"] for b in buttons] == ["Small *S*", "Large"]  # labels as typed
    assert all(len(b["callback_data"].encode()) <= 64 for b in buttons)
    assert "size:L" not in json.dumps(buttons)  # the value never reaches Telegram
    said = last_user_text(openai).splitlines()
    assert said[0] == f'[Replying to your earlier message: "{QUESTION}"]'
    assert said[1] == "Large" and "size:L" in said[2]
    assert answers[0]["callback_query_id"] == query and not answers[0].get("text")
    # Telegram refuses a second answer to one query: the redelivery's answer was tried
    # and refused, the other button's tap got the notice.
    assert answers[1]["text"] == EXPIRED_NOTICE
    edit = telegram.buttons.edits[0]
    assert edit["message_id"] == question.message_id
    assert telegram.buttons.keyboards[(str(CHAT), question.message_id)] == []
    assert len(openai.chat_requests) == 3  # no second turn for the duplicate or used tap
    assert len(telegram.sent) == 2
    log = "\n".join(bot.log)
    assert "Large" not in log and "size:L" not in log and "Small" not in log


async def test_telegram_expired_and_forged_taps_start_no_turn(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    openai.add(openai.call("offer_sizes"), openai.reply(QUESTION))
    async with FakeTelegramServer() as telegram:
        bot = BotProcess(
            tmp_path / "data",
            env(
                openai,
                TELEGRAM_BOT_TOKEN=telegram.token,
                TELEGRAM_API_BASE_URL=telegram.base_url,
                BUTTON_TTL_SECONDS="0.001",
            ),
        )
        await bot.start()
        try:
            telegram.push_update(telegram_update("private_text", 1, text="ice cream please"))
            (question,) = await telegram.wait_for_sent(1, within=20)
            telegram.buttons.tap(CHAT, question.message_id, "Large")
            telegram.buttons.push_callback(CHAT, question.message_id, "forged-token")
            answers = await telegram.buttons.wait_for_answers(2, within=20)
        finally:
            await bot.kill()
    assert [a["text"] for a in answers] == [EXPIRED_NOTICE, EXPIRED_NOTICE]
    assert len(openai.chat_requests) == 2 and len(telegram.sent) == 1
    assert telegram.buttons.edits == []


def in_group(update_id: int, text: str) -> dict[str, Any]:
    """Alice's message in the group, addressed to the bot by a mention."""
    update = telegram_update(
        "group_mention", update_id, text=f"🙂 @chatflow_test_bot {text}", message_id=update_id
    )
    del update["update_id"]  # numbered by the fake, after the taps it pushed
    return update


async def test_telegram_group_keyboards_belong_to_their_person_and_quote_their_own_chat(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    """G2 and R1 of the 2026-12-07 review, in one bot: Bob's tap on Alice's keyboard is
    refused and runs nothing; Alice's tap quotes the group's message, never her private
    chat's message of the same id; a poll takes Bob's tap."""
    openai.add(
        openai.reply("Your one-time code is 4242."),
        openai.call("offer_sizes"),
        openai.reply(QUESTION),
        openai.reply("Large, noted."),
        openai.call("offer_days"),
        openai.reply("Which day suits everyone?"),
        openai.reply("Tuesday it is."),
    )
    async with FakeTelegramServer() as telegram:
        bot = BotProcess(
            tmp_path / "data",
            env(openai, TELEGRAM_BOT_TOKEN=telegram.token, TELEGRAM_API_BASE_URL=telegram.base_url),
        )
        await bot.start()
        try:
            telegram.push_update(telegram_update("private_text", 1, text="my code please"))
            (private,) = await telegram.wait_for_sent(1, within=20)
            telegram.push_update(in_group(2, "ice cream"))
            (_, question) = await telegram.wait_for_sent(2, within=20)
            telegram.buttons.tap(GROUP, question.message_id, "Large", from_id=BOB, first_name="Bob")
            (refusal,) = await telegram.buttons.wait_for_answers(1, within=20)
            requests_after_refusal = len(openai.chat_requests)
            keyboard_after_refusal = list(
                telegram.buttons.keyboards[(str(GROUP), question.message_id)]
            )
            telegram.buttons.tap(GROUP, question.message_id, "Large", from_id=CHAT)
            await telegram.wait_for_sent(3, within=20)
            said = last_user_text(openai)
            telegram.push_update(in_group(90, "when do we meet?"))
            poll = (await telegram.wait_for_sent(4, within=20))[-1]
            telegram.buttons.tap(GROUP, poll.message_id, "Tuesday", from_id=BOB, first_name="Bob")
            sent = await telegram.wait_for_sent(5, within=20)
            answers = await telegram.buttons.wait_for_answers(3, within=20)
        finally:
            await bot.kill()
    assert private.message_id == question.message_id  # Telegram numbers per chat
    assert refusal["text"] == NOT_YOURS
    assert requests_after_refusal == 3 and keyboard_after_refusal  # nothing ran; still open
    assert said.splitlines()[0] == f'[Replying to your earlier message: "{QUESTION}"]'
    assert "4242" not in json.dumps([r.messages for r in openai.chat_requests[1:]])
    assert sent[-1].text == "Tuesday it is." and not answers[2].get("text")
    assert last_user_text(openai).splitlines()[-1] == "Tuesday"


def whatsapp_bot(tmp_path: Path, graph: FakeWhatsAppServer, openai: FakeOpenAIServer) -> BotProcess:
    return BotProcess(
        tmp_path / "data",
        env(
            openai,
            WHATSAPP_PHONE_ID=PHONE_NUMBER_ID,
            WHATSAPP_TOKEN="e2e-token",
            WHATSAPP_VERIFY_TOKEN="verify-me",
            WHATSAPP_APP_SECRET=APP_SECRET,
            WHATSAPP_API_BASE_URL=graph.base_url,
            WHATSAPP_TEMPLATE_NAME="order_update",
        ),
    )


async def test_whatsapp_reply_buttons_and_a_button_reply(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    openai.add(openai.call("offer_sizes"), openai.reply(QUESTION), openai.reply("Large, noted."))
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as graph:
        bot = whatsapp_bot(tmp_path, graph, openai)
        await bot.start()
        sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
        try:
            assert (await sender.post_one(sender.text("ice cream please"))).status_code == 200
            (question,) = await graph.wait_for_sent(1, within=20)
            interactive = question.json["interactive"]
            (large,) = [
                b["reply"]
                for b in interactive["action"]["buttons"]
                if b["reply"]["title"] == "Large"
            ]
            tap = sender.button_reply(large["id"], large["title"], context_id=graph.sent_wamids[0])
            assert (await sender.post_one(tap)).status_code == 200
            await graph.wait_for_sent(2, within=20)
            # Redelivered: a duplicate, no second turn.
            assert (await sender.post_one(tap)).status_code == 200
            # The person's window closed (on Meta's clock): a tap on the used keyboard is
            # refused without a word, never with a paid template (G9).
            graph.close_window(USER_WA_ID)
            (small,) = [
                b["reply"]
                for b in interactive["action"]["buttons"]
                if b["reply"]["title"] != "Large"
            ]
            late = sender.button_reply(small["id"], small["title"], context_id=graph.sent_wamids[0])
            assert (await sender.post_one(late)).status_code == 200
        finally:
            await bot.kill()
    assert graph.templates == [] and "refused" in "\n".join(bot.log)
    assert question.json["type"] == "interactive" and interactive["type"] == "button"
    assert interactive["body"]["text"] == QUESTION
    assert [b["reply"]["title"] for b in interactive["action"]["buttons"]] == ["Small *S*", "Large"]
    assert last_user_text(openai).splitlines()[1:] == [
        "Large",
        "[tapped the button 'Large', value: 'size:L']",
    ]
    assert len(openai.chat_requests) == 3 and len(graph.sent) == 2


async def test_whatsapp_five_choices_are_a_list_message(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    openai.add(
        openai.call("offer_flavours"), openai.reply("Which flavour?"), openai.reply("Lemon it is.")
    )
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as graph:
        bot = whatsapp_bot(tmp_path, graph, openai)
        await bot.start()
        sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
        try:
            assert (await sender.post_one(sender.text("ice cream please"))).status_code == 200
            (question,) = await graph.wait_for_sent(1, within=20)
            interactive = question.json["interactive"]
            rows = interactive["action"]["sections"][0]["rows"]
            tap = sender.list_reply(
                rows[4]["id"], rows[4]["title"], context_id=graph.sent_wamids[0]
            )
            assert (await sender.post_one(tap)).status_code == 200
            await graph.wait_for_sent(2, within=20)
        finally:
            await bot.kill()
    assert interactive["type"] == "list"
    assert [r["title"] for r in rows] == list(FLAVOURS)
    assert last_user_text(openai).splitlines()[1:] == ["Lemon <sorbet>"]
