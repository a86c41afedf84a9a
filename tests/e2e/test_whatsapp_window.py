"""WhatsApp's 24-hour window through ``python -m bot run``: the fake Graph API says the
person's window is closed (131047 to free-form text, as Meta does) and the reply goes
out once as the operator's template, or, with none configured, ends abandoned."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from bot.platforms.whatsapp.templates import (
    MAX_TEMPLATE_PARTS,
    PARAMETER_LIMIT,
    WINDOW_CLOSED_REASON,
)
from tests.e2e.botprocess import BotProcess
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, USER_WA_ID, WebhookSender

APP_SECRET = "e2e-app-secret"
TEMPLATE = "order_update"


@pytest.fixture
async def graph() -> AsyncIterator[FakeWhatsAppServer]:
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as server:
        server.close_window(USER_WA_ID)
        yield server


def bot_env(graph: FakeWhatsAppServer, **extra: str) -> dict[str, str]:
    return {
        "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
        "WHATSAPP_TOKEN": "e2e-token",
        "WHATSAPP_VERIFY_TOKEN": "verify-me",
        "WHATSAPP_APP_SECRET": APP_SECRET,
        "WHATSAPP_API_BASE_URL": graph.base_url,
        **extra,
    }


@pytest.fixture
async def start_bot(tmp_path: Path) -> AsyncIterator[Callable[[dict[str, str]], BotProcess]]:
    started: list[BotProcess] = []

    def make(env: dict[str, str]) -> BotProcess:
        process = BotProcess(tmp_path / "data", env)
        started.append(process)
        return process

    yield make
    for process in started:
        await process.kill()


async def metric_reaches(bot: BotProcess, line: str, within: float = 20.0) -> str:
    """Poll ``/metrics`` until it has ``line``; the whole page then."""
    async with httpx.AsyncClient(base_url=bot.url) as client, asyncio.timeout(within):
        while True:
            page = (await client.get("/metrics")).text
            if line in page:
                return page
            await asyncio.sleep(0.2)


async def ledger_status(bot: BotProcess) -> str:
    code, out, err = await bot.command("ledger", "status")
    assert code == 0, err
    return out


async def test_closed_window_reply_goes_out_once_as_the_template(
    start_bot: Callable[[dict[str, str]], BotProcess], graph: FakeWhatsAppServer
) -> None:
    bot = start_bot(bot_env(graph, WHATSAPP_TEMPLATE_NAME=TEMPLATE))
    await bot.start()
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    await sender.post_one(sender.text("where is my order #1001?"))
    (sent,) = await graph.wait_for_sent(1, within=20)
    await metric_reaches(bot, 'chatflow_replies_delivered_total{platform="whatsapp"} 1.0')
    (refused,) = graph.rejected  # the free-form try Meta refused with 131047
    assert refused.json["type"] == "text"
    assert graph.templates == [sent] and graph.sent == [sent]
    assert sent.json["to"] == USER_WA_ID
    assert sent.json["template"]["name"] == TEMPLATE
    assert sent.json["template"]["language"] == {"code": "en_US"}
    (parameter,) = graph.template_texts(sent)
    # The reply's text, folded onto one line: the text Meta refused as free-form.
    assert parameter == " ".join(refused.json["text"]["body"].split())
    assert "1001" in parameter
    status = await ledger_status(bot)
    assert "abandoned: 0  attempting: 0  delivered: 1  failed: 0  pending: 0" in status
    assert "attempts=1" in status
    log = "\n".join(bot.log)
    assert "sent as the template" in log
    assert USER_WA_ID not in log and "1001" not in log


async def test_closed_window_without_template_is_abandoned_with_the_reason(
    start_bot: Callable[[dict[str, str]], BotProcess], graph: FakeWhatsAppServer
) -> None:
    bot = start_bot(bot_env(graph))
    await bot.start()
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    await sender.post_one(sender.text("where is my order #1001?"))
    await metric_reaches(bot, 'chatflow_abandoned_total{platform="whatsapp"} 1.0')
    assert graph.sent == [] and len(graph.rejected) == 1
    status = await ledger_status(bot)
    assert "abandoned: 1" in status
    assert WINDOW_CLOSED_REASON in status


async def test_meta_refusing_free_form_while_our_record_says_open_sends_the_template_once(
    start_bot: Callable[[dict[str, str]], BotProcess], graph: FakeWhatsAppServer
) -> None:
    """The person just wrote (our clock: window open), yet Meta answers 131047 (its clock
    wins): one free-form try, then the template with the text, and no retry loop."""
    answer = "Order 1001 ships tomorrow morning."
    async with FakeOpenAIServer() as openai:
        openai.add(openai.reply(answer))
        bot = start_bot(
            bot_env(
                graph,
                WHATSAPP_TEMPLATE_NAME=TEMPLATE,
                OPENAI_API_KEY=openai.api_key,
                OPENAI_BASE_URL=openai.base_url,
                DEFAULT_MODEL="gpt-test",
            )
        )
        await bot.start()
        sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
        await sender.post_one(sender.text("where is my order #1001?"))
        (sent,) = await graph.wait_for_sent(1, within=20)
        await metric_reaches(bot, 'chatflow_replies_delivered_total{platform="whatsapp"} 1.0')
        status = await ledger_status(bot)
    assert "abandoned: 0  attempting: 0  delivered: 1  failed: 0  pending: 0" in status
    to_user = [r for r in graph.requests if r.json.get("to") == USER_WA_ID]
    assert [r.json["type"] for r in to_user] == ["text", "template"]  # not a retry loop
    assert to_user[0] in graph.rejected and to_user[0].json["text"]["body"] == answer
    assert graph.templates == [sent] == [to_user[1]]
    assert sent.json["template"]["name"] == TEMPLATE
    assert graph.template_texts(sent) == [answer]
    assert len(openai.chat_requests) == 1  # the turn ran once; only its delivery changed


async def test_a_long_reply_past_the_window_goes_as_numbered_templates_or_is_refused_whole(
    start_bot: Callable[[dict[str, str]], BotProcess], graph: FakeWhatsAppServer
) -> None:
    """G11: a long text was cut to 974 characters and the row marked delivered. Now it
    goes as several templates in order; one too long for MAX_TEMPLATE_PARTS is refused
    before anything is sent, and the ledger row says why."""
    steps = "\n".join(
        f"Step {i}: do the thing number {i} carefully, then check it." for i in range(1, 61)
    )
    huge = "word " * (PARAMETER_LIMIT * MAX_TEMPLATE_PARTS // 5 + 10)
    async with FakeOpenAIServer() as openai:
        openai.add(openai.reply(steps))
        openai.add(openai.reply(huge))
        bot = start_bot(
            bot_env(
                graph,
                WHATSAPP_TEMPLATE_NAME=TEMPLATE,
                OPENAI_API_KEY=openai.api_key,
                OPENAI_BASE_URL=openai.base_url,
                DEFAULT_MODEL="gpt-test",
            )
        )
        await bot.start()
        sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
        await sender.post_one(sender.text("how do I set it up?"))
        sent = await graph.wait_for_sent(4, within=20)
        await metric_reaches(bot, 'chatflow_replies_delivered_total{platform="whatsapp"} 1.0')
        await sender.post_one(sender.text("and the long version?"))
        await metric_reaches(bot, 'chatflow_abandoned_total{platform="whatsapp"} 1.0')
        status = await ledger_status(bot)
    assert graph.templates == sent == graph.sent  # the huge one sent nothing at all
    parameters = [text for request in sent for text in graph.template_texts(request)]
    assert [p.split(" ", 1)[0] for p in parameters] == ["(1/4)", "(2/4)", "(3/4)", "(4/4)"]
    assert all(len(p) <= PARAMETER_LIMIT for p in parameters)
    # Every step arrived, in order, none cut: the parts joined are the folded text.
    assert " ".join(p.split(" ", 1)[1] for p in parameters) == " ".join(steps.split())
    assert "delivered: 1" in status and "abandoned: 1" in status
    assert "too long for the WhatsApp template" in status
    assert f"would take {MAX_TEMPLATE_PARTS + 1} templates" in status
