"""Approvals with two ``python -m bot run`` processes on one PostgreSQL database.

Each process has its own data directory and fake Graph API (as in
``test_multiprocess_pg``); they share one schema and one scripted fake model that
calls the gated ``refund`` of ``tests.fakes.approval_agents``. Taps delivered to
both processes at once, or two operators' ``python -m bot approvals approve``,
decide once: the tool runs once and its answer reaches WhatsApp once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tests.e2e.botprocess import BotProcess
from tests.e2e.test_multiprocess_pg import APP_SECRET, Fleet, started_fleet
from tests.e2e.test_scheduled_pg import model_env, settled, wait_for_text
from tests.fakes.approval_agents import runs
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.whatsapp_webhook import WebhookSender
from tests.pgtest import wait_until

pytestmark = pytest.mark.e2e

TOKEN = "e2e-token"
ANSWER = "Refunded 25 on order 1001."


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as server:
        yield server


@pytest.fixture
async def fleet(tmp_path: Path, openai: FakeOpenAIServer) -> AsyncIterator[Fleet]:
    """Two bots on one fresh schema, started; killed afterwards."""
    async with started_fleet(
        tmp_path,
        2,
        {
            **model_env(openai),
            "AGENTS_MODULE": "tests.fakes.approval_agents",
            "STREAM_REPLIES": "false",
        },
    ) as made:
        yield made


def sender(bot: BotProcess) -> WebhookSender:
    return WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)


async def ask(fleet: Fleet, openai: FakeOpenAIServer) -> dict[str, str]:
    """The user's request on process 0: the question's reply buttons, title -> id."""
    openai.add(openai.call("refund", order_id="1001", amount=25), openai.reply(ANSWER))
    first = sender(fleet.bots[0])
    assert (await first.post_one(first.text("refund order 1001"))).status_code == 200
    (question,) = await fleet.graphs[0].wait_for_sent(1, within=20)
    buttons = question.json["interactive"]["action"]["buttons"]
    return {b["reply"]["title"]: b["reply"]["id"] for b in buttons}


async def refunded_once(fleet: Fleet) -> None:
    await wait_for_text(fleet, ANSWER, within=20)
    await wait_until(lambda: settled(fleet.dsn), within=15)
    sent = json.dumps([s.json for s in fleet.sends()])
    assert sent.count(ANSWER) == 1
    assert sum(len(runs(bot.data_dir)) for bot in fleet.bots) == 1
    conn = await asyncpg.connect(fleet.dsn)
    try:
        states = [r[0] for r in await conn.fetch("SELECT state FROM chatflow_approvals")]
    finally:
        await conn.close()
    assert states == ["done"]


async def test_taps_delivered_to_both_processes_at_once_run_the_tool_once(
    fleet: Fleet, openai: FakeOpenAIServer
) -> None:
    buttons = await ask(fleet, openai)
    wamid = fleet.graphs[0].sent_wamids[0]
    # Two deliveries of a tap (two wamids), one to each process, at the same moment.
    taps = [sender(bot) for bot in fleet.bots]
    answers = await asyncio.gather(
        *(s.post_one(s.button_reply(buttons["Approve"], "Approve", context_id=wamid)) for s in taps)
    )
    assert [a.status_code for a in answers] == [200, 200]
    await refunded_once(fleet)


async def test_two_operators_approving_at_once_run_the_tool_once(
    fleet: Fleet, openai: FakeOpenAIServer
) -> None:
    await ask(fleet, openai)
    conn = await asyncpg.connect(fleet.dsn)
    try:
        (approval_id,) = [r[0] for r in await conn.fetch("SELECT id FROM chatflow_approvals")]
    finally:
        await conn.close()
    results = await asyncio.gather(
        *(bot.command("approvals", "approve", approval_id) for bot in fleet.bots)
    )
    assert sorted(code for code, _, _ in results) == [0, 2]
    assert any(out == f"approved {approval_id}\n" for _, out, _ in results)
    assert any("already decided" in err for _, _, err in results)
    await refunded_once(fleet)
