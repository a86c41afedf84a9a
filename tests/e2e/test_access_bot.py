"""Access control end to end: ``python -m bot run`` against the fake Graph API and model.

A flood from one WhatsApp sender costs no model call past the limit, every
webhook is answered fast and another sender is answered meanwhile; a stranger
in pairing mode gets a code, the operator approves it with the real CLI while
the bot runs, and the stranger is served from then on. On PostgreSQL two
processes share one count and one approval list.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from tests.e2e.botprocess import BotProcess
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, RecordedRequest
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_server import RecordedRequest as GraphRequest
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender
from tests.pgtest import fresh_schema, wait_until

pytestmark = pytest.mark.e2e

APP_SECRET = "e2e-app-secret"
FLOODER = "16505550001"
CALM = "16505550002"
STRANGER = "16505550003"
CODE = re.compile(r"\b[A-Z0-9]{6,12}\b")

BotFactory = Callable[..., BotProcess]


def answer(record: RecordedRequest) -> FakeResponse:
    return FakeOpenAIServer.reply(f"answer to {record.messages[-1]['content']}")


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(responder=answer) as server:
        yield server


@pytest.fixture
async def graph() -> AsyncIterator[FakeWhatsAppServer]:
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as server:
        yield server


@pytest.fixture
async def bots(
    tmp_path: Path, graph: FakeWhatsAppServer, openai: FakeOpenAIServer
) -> AsyncIterator[BotFactory]:
    made: list[BotProcess] = []

    def make(name: str = "bot", **env: str) -> BotProcess:
        (tmp_path / name).mkdir()
        bot = BotProcess(
            tmp_path / name / "data",
            {
                "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
                "WHATSAPP_TOKEN": "e2e-token",
                "WHATSAPP_VERIFY_TOKEN": "verify-me",
                "WHATSAPP_APP_SECRET": APP_SECRET,
                "WHATSAPP_API_BASE_URL": graph.base_url,
                "OPENAI_API_KEY": openai.api_key,
                "OPENAI_BASE_URL": openai.base_url,
                "DEFAULT_MODEL": "gpt-4o-mini",
                "AGENTS_MODULE": "tests.e2e.proof_agents",
                **env,
            },
        )
        made.append(bot)
        return bot

    yield make
    for bot in made:
        await bot.kill()


async def fetch_metrics(bot: BotProcess) -> str:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{bot.url}/metrics")).text


def sent_to(graph: FakeWhatsAppServer, wa_id: str) -> list[str]:
    return [str(r.json["text"]["body"]) for r in graph.sent if r.json.get("to") == wa_id]


async def test_a_flood_of_1000_messages_costs_no_model_call_past_the_limit(
    bots: BotFactory, graph: FakeWhatsAppServer, openai: FakeOpenAIServer
) -> None:
    # The window outlasts the test, so the flood (well under a minute) meets one window.
    bot = bots(RATE_LIMIT_MESSAGES="5", RATE_LIMIT_WINDOW_SECONDS="600")
    await bot.start()
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    calm_answered: dict[str, asyncio.Event] = {}
    loop = asyncio.get_running_loop()

    def on_send(record: GraphRequest) -> None:
        body = record.json
        if body.get("to") == CALM:
            for text, event in calm_answered.items():
                if text in body["text"]["body"]:
                    event.set()

    graph.on_send = on_send
    slowest = 0.0
    calm_waits: list[float] = []

    async with httpx.AsyncClient(timeout=10.0) as client:

        async def post(payload: dict[str, object]) -> float:
            body = sender.encode(payload)
            started = loop.time()
            response = await client.post(sender.url, content=body, headers=sender.headers(body))
            assert response.status_code == 200, response.text
            return loop.time() - started

        async def calm_message(n: int) -> None:
            text = f"calm question {n}"
            calm_answered[text] = asyncio.Event()
            started = loop.time()
            await post(sender.text(text, wa_id=CALM, name="Calm"))
            await asyncio.wait_for(calm_answered[text].wait(), 10)
            calm_waits.append(loop.time() - started)

        calm_tasks = []
        began = time.monotonic()
        for batch in range(100):
            times = await asyncio.gather(
                *(
                    post(sender.text(f"spam {batch * 10 + i}", wa_id=FLOODER, name="Flood"))
                    for i in range(10)
                )
            )
            slowest = max(slowest, *times)
            if batch in (20, 50, 80):
                calm_tasks.append(asyncio.create_task(calm_message(batch)))
        flood_seconds = time.monotonic() - began
        await asyncio.gather(*calm_tasks)

    assert flood_seconds < 60, f"the flood took {flood_seconds:.0f} s, more than a minute"
    assert slowest < 1.0, f"a webhook took {slowest:.2f} s"
    assert max(calm_waits) < 5.0, f"the other sender waited {max(calm_waits):.1f} s"
    await graph.wait_for_sent(5 + 1 + 3, within=20)
    metrics = await fetch_metrics(bot)
    assert await bot.stop() == 0  # drains every lane: anything else owed would be sent now
    flooder = sent_to(graph, FLOODER)
    assert len([t for t in flooder if t.startswith("answer to")]) == 5
    notices = [t for t in flooder if "faster than I can answer" in t]
    assert len(notices) == 1 and "spam" not in notices[0]
    assert len(openai.chat_requests) == 5 + 3  # the limit, plus the calm sender's three
    assert 'chatflow_messages_rate_limited_total{platform="whatsapp"} 995.0' in metrics
    log = "\n".join(bot.log)
    assert FLOODER not in log and "spam" not in log
    assert len(graph.sent) == 5 + 1 + 3


async def test_pairing_flow_through_the_cli_while_the_bot_runs(
    bots: BotFactory, graph: FakeWhatsAppServer, openai: FakeOpenAIServer
) -> None:
    bot = bots(ACCESS_MODE="pairing")
    await bot.start()
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    await sender.post_one(sender.text("hello, who are you?", wa_id=STRANGER))
    (first,) = await graph.wait_for_sent(1, within=20)
    (code,) = CODE.findall(first.json["text"]["body"])
    await sender.post_one(sender.text("please let me in", wa_id=STRANGER))
    # Judged (counted as a pairing request) but not answered: the code was told once.
    pairing_requests = 'chatflow_pairing_requests_total{platform="whatsapp"} 2.0'

    async def judged() -> bool:
        return pairing_requests in await fetch_metrics(bot)

    await wait_until(judged, within=20)
    assert len(sent_to(graph, STRANGER)) == 1
    assert openai.chat_requests == []

    # The approval is the real CLI in a process of its own; the other commands, whose
    # subject is what they print, run in the test process (no interpreter start each).
    assert (await bot.command_in_process("pairing", "approve", "NOPE2345"))[0] == 2
    status, out, _ = await bot.command("pairing", "approve", code)
    assert status == 0 and "approved whatsapp:user_" in out
    assert (await bot.command_in_process("pairing", "approve", code))[0] == 2  # used up
    status, out, _ = await bot.command_in_process("pairing", "list")
    assert status == 0 and "approved  whatsapp:user_" in out and STRANGER not in out

    # served from now on, within seconds and without a restart
    await sender.post_one(sender.text("thanks! where is order 1001?", wa_id=STRANGER))
    await graph.wait_for_sent(2, within=20)
    assert sent_to(graph, STRANGER)[1].startswith("answer to")
    assert len(openai.chat_requests) == 1

    assert (await bot.command_in_process("pairing", "revoke", f"whatsapp:{STRANGER}"))[0] == 0
    assert "whatsapp:user_" not in (await bot.command_in_process("pairing", "list"))[1]
    log = "\n".join(bot.log)
    assert code not in log and STRANGER not in log


async def test_processes_on_postgresql_share_counts_and_approvals(
    bots: BotFactory, graph: FakeWhatsAppServer, openai: FakeOpenAIServer
) -> None:
    async with fresh_schema() as dsn:
        env = {"DATABASE_URL": dsn, "RATE_LIMIT_MESSAGES": "5", "ACCESS_MODE": "pairing"}
        one, two = bots("one", **env), bots("two", **env)
        await asyncio.gather(one.start(), two.start())
        senders = [WebhookSender(f"{b.url}/webhooks/whatsapp", APP_SECRET) for b in (one, two)]
        await senders[0].post_one(senders[0].text("let me in", wa_id=STRANGER))
        (first,) = await graph.wait_for_sent(1, within=20)
        (code,) = CODE.findall(first.json["text"]["body"])
        assert (await two.command("pairing", "approve", code))[0] == 0
        # the flood alternates between the processes, as a load balancer would send it
        for n in range(30):
            sender = senders[n % 2]
            response = await sender.post_one(sender.text(f"spam {n}", wa_id=STRANGER))
            assert response.status_code == 200
        await graph.wait_for_sent(1 + 4 + 1, within=30)
        # a clean stop drains every lane: whatever else was owed would be sent by now
        assert list(await asyncio.gather(one.stop(), two.stop())) == [0, 0]
        answers = [t for t in sent_to(graph, STRANGER) if t.startswith("answer to")]
        assert len(answers) == 4  # the code request counted as the first of five
        assert len([t for t in sent_to(graph, STRANGER) if "faster" in t]) == 1
        assert len(openai.chat_requests) == 4
