"""The real bot against the fake Graph API and a signing webhook sender."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.e2e.botprocess import BotProcess
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import GROUP_ID, PHONE_NUMBER_ID, USER_WA_ID, WebhookSender

APP_SECRET = "e2e-app-secret"


@pytest.fixture
async def graph() -> AsyncIterator[FakeWhatsAppServer]:
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as server:
        yield server


@pytest.fixture
async def bot(tmp_path: Path, graph: FakeWhatsAppServer) -> AsyncIterator[BotProcess]:
    process = BotProcess(
        tmp_path / "data",
        {
            "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
            "WHATSAPP_TOKEN": "e2e-token",
            "WHATSAPP_VERIFY_TOKEN": "verify-me",
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "WHATSAPP_API_BASE_URL": graph.base_url,
        },
    )
    await process.start()
    yield process
    await process.kill()


def sender_for(bot: BotProcess) -> WebhookSender:
    return WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)


async def test_signed_text_is_answered_quoting_it(
    bot: BotProcess, graph: FakeWhatsAppServer
) -> None:
    sender = sender_for(bot)
    payload = sender.text("hello")
    wamid = payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
    response = await sender.post_one(payload)
    assert response.status_code == 200
    (sent,) = await graph.wait_for_sent(1, within=20)
    assert sent.json["to"] == USER_WA_ID
    assert sent.json["context"]["message_id"] == wamid
    assert "Triage" in sent.json["text"]["body"]
    log = "\n".join(bot.log)
    assert USER_WA_ID not in log and "hello" not in log


async def test_same_webhook_five_times_concurrently_gets_one_reply(
    bot: BotProcess, graph: FakeWhatsAppServer
) -> None:
    sender = sender_for(bot)
    responses = await sender.post(sender.text("hi once"), times=5, concurrent=True)
    assert [r.status_code for r in responses] == [200] * 5
    await graph.wait_for_sent(1, within=20)
    # a second, later message is answered after the first: so nothing else was queued before it
    await sender.post_one(sender.text("and now?"))
    sent = await graph.wait_for_sent(2, within=20)
    assert len(sent) == 2
    assert "and now?" in sent[1].json["text"]["body"]


async def test_bad_signature_is_refused_and_changes_nothing(
    bot: BotProcess, graph: FakeWhatsAppServer, tmp_path: Path
) -> None:
    sender = sender_for(bot)
    bad = await sender.post_one(sender.text("forged"), signature="bad")
    missing = await sender.post_one(sender.text("forged"), signature="missing")
    assert (bad.status_code, missing.status_code) == (403, 401)
    await sender.post_one(sender.text("genuine"))
    sent = await graph.wait_for_sent(1, within=20)
    assert len(sent) == 1 and "genuine" in sent[0].json["text"]["body"]


async def test_batched_payload_answers_every_message_and_groups_in_the_group(
    bot: BotProcess, graph: FakeWhatsAppServer
) -> None:
    sender = sender_for(bot)
    await sender.post_one(sender.batched([[["one", "two"]], [["three"]]]))
    sent = await graph.wait_for_sent(3, within=20)
    bodies = " ".join(s.json["text"]["body"] for s in sent)
    assert all(word in bodies for word in ("one", "two", "three"))
    await sender.post_one(sender.group_text(f"@{sender.display_phone_number} hi group"))
    sent = await graph.wait_for_sent(4, within=20)
    assert sent[3].json["to"] == GROUP_ID
    assert sent[3].json.get("recipient_type") == "group"


async def test_reply_lost_to_a_kill_during_send_is_resent_with_the_marker(
    bot: BotProcess, graph: FakeWhatsAppServer
) -> None:
    sender = sender_for(bot)
    graph.inject_hang(1)
    await sender.post_one(sender.text("where is my order #1001?"))
    await graph.wait_for_hung(1, within=20)  # the send reached the platform, no answer yet
    await bot.kill()
    await bot.start()
    sent = await graph.wait_for_sent(1, within=20)
    body = sent[-1].json["text"]["body"]
    assert body.startswith(RECOVERED_MARKER)
    assert "1001" in body


async def test_healthz_and_metrics_report_the_running_bot(
    bot: BotProcess, graph: FakeWhatsAppServer
) -> None:
    sender = sender_for(bot)
    await sender.post(sender.text("count me"), times=2)
    await graph.wait_for_sent(1, within=20)
    async with httpx.AsyncClient(base_url=bot.url) as client:
        health = (await client.get("/healthz")).json()
        metrics = (await client.get("/metrics")).text
        handshake = {"hub.mode": "subscribe", "hub.challenge": "42"}
        verify = await client.get(
            "/webhooks/whatsapp", params={**handshake, "hub.verify_token": "verify-me"}
        )
        wrong = await client.get(
            "/webhooks/whatsapp", params={**handshake, "hub.verify_token": "nope"}
        )
    assert health == {
        "ok": True,
        "ready": True,
        "database": "ok",
        "platforms": {"whatsapp": True},
    }
    assert 'chatflow_messages_in_total{platform="whatsapp"} 1.0' in metrics
    assert 'chatflow_dedup_hits_total{platform="whatsapp"} 1.0' in metrics
    assert "chatflow_turn_seconds_bucket" in metrics
    assert (verify.status_code, verify.text) == (200, "42")
    assert wrong.status_code == 403
