"""Scheduled messages with several ``python -m bot run`` processes on one PostgreSQL database.

Each process has its own data directory and fake Graph API server (as in
``test_multiprocess_pg``), they share one schema and one scripted fake model
that calls ``schedule_message(delay_seconds=3)`` on the example reminder agent
(``agents/reminders.py``). Whichever process claims the job, its text (or, with
``run_agent``, the scheduled turn's answer) reaches WhatsApp exactly once across
all of them, also when the process that wrote the job is SIGKILLed before it is due.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.e2e.botprocess import BotProcess
from tests.e2e.test_multiprocess_pg import APP_SECRET, Fleet, started_fleet
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer, RecordedRequest
from tests.fakes.whatsapp_webhook import USER_WA_ID, WebhookSender
from tests.pgtest import wait_until

pytestmark = pytest.mark.e2e

TOKEN = "e2e-token"
PROCESSES = 2
REMINDER = "Time to take the cake out of the oven!"
ANSWER = "Done: I will remind you in 3 seconds."
PROMPT = "Ask whether the cake came out well"
FOLLOWUP = "How did the cake turn out?"


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


def model_env(openai: FakeOpenAIServer) -> dict[str, str]:
    """The bots' settings for the shared scripted fake model."""
    return {
        "OPENAI_API_KEY": openai.api_key,
        "OPENAI_BASE_URL": openai.base_url,
        "DEFAULT_MODEL": "gpt-test",
    }


@pytest.fixture
async def fleet(tmp_path: Path, openai: FakeOpenAIServer) -> AsyncIterator[Fleet]:
    """``PROCESSES`` reminder bots on one fresh schema, started; killed afterwards."""
    env = {**model_env(openai), "AGENTS_MODULE": "agents.reminders"}
    async with started_fleet(tmp_path, PROCESSES, env) as made:
        yield made


def texts(fleet: Fleet, body: str) -> list[tuple[int, RecordedRequest]]:
    """Every accepted send with text ``body``, with the index of the graph it reached."""
    return [
        (index, sent)
        for index, graph in enumerate(fleet.graphs)
        for sent in graph.sent
        if sent.json.get("text", {}).get("body") == body
    ]


async def wait_for_text(fleet: Fleet, body: str, within: float) -> float:
    """Wait until ``body`` reached any graph; the monotonic time it was seen."""
    async with asyncio.timeout(within):
        while not texts(fleet, body):
            fleet.changed.clear()
            await fleet.changed.wait()
    return time.monotonic()


async def jobs_and_obligations(dsn: str) -> tuple[list[Any], list[Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        jobs = await conn.fetch("SELECT state, fired_count FROM chatflow_scheduled_jobs")
        owed = await conn.fetch(
            "SELECT state FROM chatflow_delivery_obligations WHERE message_ref LIKE 'schedule:%'"
        )
        turns = await conn.fetch("SELECT state FROM chatflow_inbox")
    finally:
        await conn.close()
    return [tuple(r) for r in jobs], [r[0] for r in owed] + [f"turn:{r[0]}" for r in turns]


async def settled(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        open_work = await conn.fetchval(
            "SELECT (SELECT count(*) FROM chatflow_inbox WHERE state <> 'done') + "
            "(SELECT count(*) FROM chatflow_delivery_obligations WHERE state <> 'delivered') + "
            "(SELECT count(*) FROM chatflow_scheduled_jobs WHERE state = 'scheduled')"
        )
    finally:
        await conn.close()
    return int(open_work) == 0


async def ask(fleet: Fleet, bot: BotProcess, text: str) -> float:
    """The user's message, posted to ``bot``; the monotonic time it was accepted."""
    sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
    assert (await sender.post_one(sender.text(text, wa_id=USER_WA_ID))).status_code == 200
    return time.monotonic()


async def test_two_processes_send_a_scheduled_message_once(
    fleet: Fleet, openai: FakeOpenAIServer
) -> None:
    openai.add(
        openai.call("schedule_message", text=REMINDER, delay_seconds=3), openai.reply(ANSWER)
    )
    asked = await ask(fleet, fleet.bots[0], "remind me in 3 s about the cake")
    await wait_for_text(fleet, ANSWER, within=40)  # not what is timed: room for a busy CI
    arrived = await wait_for_text(fleet, REMINDER, within=15)
    assert 3.0 <= arrived - asked <= 15.0, arrived - asked
    await wait_until(lambda: settled(fleet.dsn), within=15)
    jobs, owed = await jobs_and_obligations(fleet.dsn)
    assert jobs == [("fired", 1)]
    assert owed.count("delivered") == 1  # the reminder's one obligation (the answer has none)
    (reminder,) = texts(fleet, REMINDER)
    assert reminder[1].json["to"] == USER_WA_ID
    log = "\n".join(line for bot in fleet.bots for line in bot.log)
    assert log.count("scheduled job job_") == 1 and REMINDER not in log and USER_WA_ID not in log


async def test_two_processes_run_a_scheduled_turn_once(
    fleet: Fleet, openai: FakeOpenAIServer
) -> None:
    openai.add(
        openai.call("schedule_message", text=PROMPT, delay_seconds=3, run_agent=True),
        openai.reply(ANSWER),
        openai.reply(FOLLOWUP),
    )
    asked = await ask(fleet, fleet.bots[0], "check on the cake in 3 s")
    await wait_for_text(fleet, ANSWER, within=40)  # not what is timed: room for a busy CI
    arrived = await wait_for_text(fleet, FOLLOWUP, within=15)
    assert 3.0 <= arrived - asked <= 15.0, arrived - asked
    await wait_until(lambda: settled(fleet.dsn), within=15)
    jobs, owed = await jobs_and_obligations(fleet.dsn)
    assert jobs == [("fired", 1)]
    # The user's turn, the scheduled one, and the scheduled turn's answer owed once.
    assert sorted(owed) == ["delivered", "turn:done", "turn:done"]
    assert len(texts(fleet, FOLLOWUP)) == 1
    assert len(openai.chat_requests) == 3  # the scheduled turn ran once, in one process
    assert openai.chat_requests[2].messages[-1]["content"] == f"[Scheduled reminder] {PROMPT}"
    assert PROMPT not in "\n".join(line for bot in fleet.bots for line in bot.log)


async def test_the_writer_killed_before_the_due_time_the_survivor_sends_it_once(
    fleet: Fleet, openai: FakeOpenAIServer
) -> None:
    openai.add(
        openai.call("schedule_message", text=REMINDER, delay_seconds=3), openai.reply(ANSWER)
    )
    asked = await ask(fleet, fleet.bots[0], "remind me in 3 s about the cake")
    await wait_for_text(fleet, ANSWER, within=40)  # not what is timed: room for a busy CI
    # The turn that wrote the job answered through its own process's graph.
    ((writer_index, _answer),) = texts(fleet, ANSWER)
    writer = fleet.bots[writer_index]
    await writer.kill()  # SIGKILL: the job exists only in the database now
    assert not texts(fleet, REMINDER), "killed too late: the job was already due"
    assert time.monotonic() - asked < 3.0
    arrived = await wait_for_text(fleet, REMINDER, within=15)
    assert 3.0 <= arrived - asked <= 15.0, arrived - asked
    await wait_until(lambda: settled(fleet.dsn), within=15)
    ((sent_by, _reminder),) = texts(fleet, REMINDER)
    assert sent_by != writer_index
    jobs, owed = await jobs_and_obligations(fleet.dsn)
    assert jobs == [("fired", 1)]
    assert owed.count("delivered") == 1


async def test_an_operator_send_reaches_the_chat_once_from_one_of_the_processes(
    fleet: Fleet, openai: FakeOpenAIServer
) -> None:
    """``python -m bot send`` against the shared database while both processes run."""
    bot = fleet.bots[0]
    message = "Your parcel left the warehouse."
    code, out, err = await bot.command("send", f"whatsapp:{USER_WA_ID}", message)
    assert code == 0, err
    assert out.startswith("sent to the running bot: ")
    await wait_for_text(fleet, message, within=15)
    await wait_until(lambda: settled(fleet.dsn), within=15)
    assert len(texts(fleet, message)) == 1
    assert openai.chat_requests == []  # an operator's message runs no turn


async def test_a_closed_window_reply_goes_out_once_as_the_template(
    tmp_path: Path, openai: FakeOpenAIServer
) -> None:
    """Meta refuses free-form text (131047): whichever process answers sends the template
    once, through the same ledger row."""
    async with started_fleet(
        tmp_path,
        PROCESSES,
        {**model_env(openai), "WHATSAPP_TEMPLATE_NAME": "order_update"},
        prepare=lambda graph: graph.close_window(USER_WA_ID),
    ) as fleet:
        openai.add(openai.reply(ANSWER))
        await ask(fleet, fleet.bots[1], "where is my parcel?")
        async with asyncio.timeout(20):
            while not any(graph.templates for graph in fleet.graphs):
                fleet.changed.clear()
                await fleet.changed.wait()
        await wait_until(lambda: settled(fleet.dsn), within=15)
        templates = [t for graph in fleet.graphs for t in graph.templates]
        assert [FakeWhatsAppServer.template_texts(t) for t in templates] == [[ANSWER]]
        assert texts(fleet, ANSWER) == []  # never accepted as free-form text
