"""The WhatsApp webhook route: verification, signatures, limits and the events it hands over.

The payload parser alone (``parse_webhook``) is tested in ``test_whatsapp_payload.py``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from bot.errors import ConfigurationError
from bot.gateway.contract import MessageEvent
from bot.logs import log_ref
from bot.platforms.base import PlatformAdapter
from bot.platforms.whatsapp.adapter import MAX_BODY_BYTES, WEBHOOK_PATH, WhatsAppAdapter
from tests.fakes.whatsapp_webhook import (
    GROUP_ID,
    PHONE_NUMBER_ID,
    USER_WA_ID,
    WebhookSender,
    sign,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "whatsapp"
APP_SECRET = "app-secret-for-tests"
VERIFY_TOKEN = "verify-me"
URL = f"http://bot.test{WEBHOOK_PATH}"


def load(name: str) -> dict[str, Any]:
    """A payload from tests/data/whatsapp."""
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


class Recorder:
    """A gateway stand-in that records what it is handed."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.events: list[MessageEvent] = []
        self.fail_on = fail_on

    async def __call__(self, event: MessageEvent) -> bool:
        if self.fail_on is not None and len(self.events) == self.fail_on:
            raise RuntimeError("inbox is down")
        self.events.append(event)
        return True


def make_adapter(**kwargs: Any) -> WhatsAppAdapter:
    options: dict[str, Any] = {
        "verify_token": VERIFY_TOKEN,
        "app_secret": APP_SECRET,
        "send_pause": 0,
    }
    options.update(kwargs)
    return WhatsAppAdapter(PHONE_NUMBER_ID, "test-token", **options)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def adapter(recorder: Recorder) -> AsyncIterator[WhatsAppAdapter]:
    wa = make_adapter()
    await wa.start(recorder)
    yield wa
    await wa.stop()


def client_for(wa: WhatsAppAdapter) -> httpx.AsyncClient:
    app = Starlette(routes=list(wa.routes()))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bot.test")


@pytest.fixture
def sender(adapter: WhatsAppAdapter) -> WebhookSender:
    app = Starlette(routes=list(adapter.routes()))
    return WebhookSender(URL, APP_SECRET, transport=httpx.ASGITransport(app=app))


# -- protocol and lifecycle ----------------------------------------------------------------


def test_adapter_satisfies_the_platform_protocol() -> None:
    wa = make_adapter()
    assert isinstance(wa, PlatformAdapter)
    assert wa.name == "whatsapp"
    assert wa.max_text_len == 4096
    assert wa.format_reply("hola", "Triage") == "hola"
    assert not wa.is_connected


async def test_start_without_app_secret_is_a_configuration_error(recorder: Recorder) -> None:
    wa = make_adapter(app_secret=None)
    with pytest.raises(ConfigurationError) as info:
        await wa.start(recorder)
    assert info.value.setting == "WHATSAPP_APP_SECRET"
    assert not wa.is_connected


@pytest.mark.parametrize(
    ("field", "setting"),
    [
        ("phone_id", "WHATSAPP_PHONE_ID"),
        ("token", "WHATSAPP_TOKEN"),
        ("verify_token", "WHATSAPP_VERIFY_TOKEN"),
    ],
    ids=["phone-id", "token", "verify-token"],
)
async def test_start_names_a_missing_setting(recorder: Recorder, field: str, setting: str) -> None:
    args: dict[str, Any] = {"phone_id": PHONE_NUMBER_ID, "token": "tok", "verify_token": "vt"}
    args[field] = ""
    wa = WhatsAppAdapter(
        args["phone_id"], args["token"], verify_token=args["verify_token"], app_secret="s"
    )
    with pytest.raises(ConfigurationError) as info:
        await wa.start(recorder)
    assert info.value.setting == setting


async def test_insecure_dev_warns_loudly_and_skips_signatures(
    recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    wa = make_adapter(app_secret=None, insecure_dev=True)
    with caplog.at_level(logging.WARNING, logger="bot.platforms.whatsapp"):
        await wa.start(recorder)
    try:
        assert any("INSECURE" in r.getMessage() for r in caplog.records)
        async with client_for(wa) as client:
            response = await client.post(WEBHOOK_PATH, content=json.dumps(load("text")))
        assert response.status_code == 200
        assert len(recorder.events) == 1
    finally:
        await wa.stop()


async def test_webhook_before_start_answers_503_so_meta_retries(recorder: Recorder) -> None:
    wa = make_adapter()
    body = json.dumps(load("text")).encode()
    async with client_for(wa) as client:
        response = await client.post(
            WEBHOOK_PATH, content=body, headers={"X-Hub-Signature-256": sign(body, APP_SECRET)}
        )
    assert response.status_code == 503
    assert recorder.events == []


async def test_stop_is_idempotent_and_disconnects(adapter: WhatsAppAdapter) -> None:
    assert adapter.is_connected
    await adapter.stop()
    await adapter.stop()
    assert not adapter.is_connected


# -- GET verification ----------------------------------------------------------------------


async def test_verify_handshake_returns_the_challenge(adapter: WhatsAppAdapter) -> None:
    params = {
        "hub.mode": "subscribe",
        "hub.verify_token": VERIFY_TOKEN,
        "hub.challenge": "1158201444",
    }
    async with client_for(adapter) as client:
        response = await client.get(WEBHOOK_PATH, params=params)
    assert response.status_code == 200
    assert response.text == "1158201444"
    assert response.headers["content-type"].startswith("text/plain")


@pytest.mark.parametrize(
    "params",
    [
        {"hub.mode": "subscribe", "hub.verify_token": "wrong", "hub.challenge": "1"},
        {"hub.mode": "unsubscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1"},
        {"hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1"},
        {"hub.mode": "subscribe", "hub.challenge": "1"},
    ],
    ids=["wrong-token", "wrong-mode", "no-mode", "no-token"],
)
async def test_verify_handshake_refuses(adapter: WhatsAppAdapter, params: dict[str, str]) -> None:
    async with client_for(adapter) as client:
        response = await client.get(WEBHOOK_PATH, params=params)
    assert response.status_code == 403
    assert response.text != "1"


# -- POST checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signature", "status"),
    [("missing", 401), ("bad", 403), ("sha256=", 403), ("md5=abc", 403), ("garbage", 403)],
    ids=["missing-401", "wrong-secret-403", "empty-hex-403", "wrong-algo-403", "no-prefix-403"],
)
async def test_bad_signature_is_refused_and_nothing_is_handed_over(
    sender: WebhookSender,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
    signature: str,
    status: int,
) -> None:
    payload = load("text")
    with caplog.at_level(logging.DEBUG):
        (response,) = await sender.post(payload, signature=signature)
    assert response.status_code == status
    assert recorder.events == []
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings, "the refusal is logged"
    text = payload["entry"][0]["changes"][0]["value"]["messages"][0]["text"]["body"]
    assert all(
        text not in r.getMessage() and USER_WA_ID not in r.getMessage() for r in caplog.records
    )


async def test_signature_of_a_different_body_is_refused(
    sender: WebhookSender, recorder: Recorder
) -> None:
    body = json.dumps(load("text")).encode()
    other = sign(body + b" ", APP_SECRET)
    (response,) = await sender.post(body, signature=other)
    assert response.status_code == 403
    assert recorder.events == []


async def test_body_over_the_limit_is_413_by_content_length(
    sender: WebhookSender, recorder: Recorder
) -> None:
    body = b"{" + b" " * MAX_BODY_BYTES + b"}"
    (response,) = await sender.post(body)
    assert response.status_code == 413
    assert recorder.events == []


async def test_streamed_body_over_the_limit_is_413_without_reading_it_all(
    recorder: Recorder,
) -> None:
    wa = make_adapter(max_body_bytes=1024)
    await wa.start(recorder)
    produced: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for index in range(100):
            produced.append(index)
            yield b" " * 512

    try:
        async with client_for(wa) as client:
            response = await client.post(
                WEBHOOK_PATH, content=chunks(), headers={"X-Hub-Signature-256": "sha256=00"}
            )
    finally:
        await wa.stop()
    assert response.status_code == 413
    assert recorder.events == []
    assert len(produced) < 100, "reading stopped at the limit"


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"\xff\xfe", b"[1, 2]", b'"text"'],
    ids=["broken", "binary", "list", "string"],
)
async def test_malformed_json_is_400(
    sender: WebhookSender, recorder: Recorder, body: bytes
) -> None:
    (response,) = await sender.post(body)
    assert response.status_code == 400
    assert recorder.events == []


async def test_other_object_is_acknowledged_and_ignored(
    sender: WebhookSender, recorder: Recorder
) -> None:
    payload = load("text")
    payload["object"] = "instagram"
    (response,) = await sender.post(payload)
    assert response.status_code == 200
    assert recorder.events == []


async def test_gateway_failure_answers_500_for_redelivery(recorder: Recorder) -> None:
    failing = Recorder(fail_on=2)
    wa = make_adapter()
    await wa.start(failing)
    try:
        app = Starlette(routes=list(wa.routes()))
        sender = WebhookSender(URL, APP_SECRET, transport=httpx.ASGITransport(app=app))
        (response,) = await sender.post(load("batched"))
    finally:
        await wa.stop()
    assert response.status_code == 500
    assert len(failing.events) == 2


# -- events handed over -------------------------------------------------------------------


async def test_dm_text_maps_to_an_event(sender: WebhookSender, recorder: Recorder) -> None:
    payload = load("text")
    message = payload["entry"][0]["changes"][0]["value"]["messages"][0]
    (response,) = await sender.post(payload)
    assert response.status_code == 200
    (event,) = recorder.events
    assert event.platform == "whatsapp"
    assert event.message_id == message["id"]
    assert event.platform_message_id == message["id"]
    assert event.reply_to_id is None
    assert event.text == "Hola, ¿a qué hora abren mañana?"
    assert event.source.chat_type == "dm"
    assert event.source.chat_id == USER_WA_ID
    assert event.source.sender_id == USER_WA_ID
    assert event.source.sender_name == "Kerry Fisher"
    assert event.raw["user_id"] == "US.13491208655302741918"
    assert event.timestamp == datetime.fromtimestamp(1749416383, UTC)
    assert event.timestamp.tzinfo is not None
    assert not event.replies_to_bot and not event.mentions_bot
    assert event.media_kind is None and event.command is None


async def test_every_message_of_a_batched_body_is_handed_over_in_order(
    sender: WebhookSender, recorder: Recorder
) -> None:
    payload = load("batched")
    expected = [
        m["id"]
        for entry in payload["entry"]
        for change in entry["changes"]
        for m in change["value"].get("messages", [])
    ]
    (response,) = await sender.post(payload)
    assert response.status_code == 200
    assert len(expected) == 5
    assert [e.message_id for e in recorder.events] == expected
    assert [e.text for e in recorder.events] == [
        "Primer mensaje",
        "Segundo mensaje",
        "Tercer mensaje",
        "Cuarto mensaje",
        "Quinto mensaje",
    ]
    names = {e.source.sender_id: e.source.sender_name for e in recorder.events}
    assert names["16505550003"] == "Marta Sanz"
    assert names["16505550001"] == "Ana Ruiz"


async def test_built_batch_across_entries_and_changes(
    sender: WebhookSender, recorder: Recorder
) -> None:
    payload = sender.batched([[["a", "b"], ["c"]], [["d"], ["e", "f", "g"]]])
    (response,) = await sender.post(payload)
    assert response.status_code == 200
    assert [e.text for e in recorder.events] == list("abcdefg")


@pytest.mark.parametrize(
    "name", ["status_sent", "status_delivered", "status_read"], ids=["sent", "delivered", "read"]
)
async def test_statuses_never_start_a_turn(
    adapter: WhatsAppAdapter, sender: WebhookSender, recorder: Recorder, name: str
) -> None:
    calls: list[tuple[str, str]] = []

    async def on_failed(wamid: str, error: str) -> None:
        calls.append((wamid, error))

    adapter.on_status_failed = on_failed
    (response,) = await sender.post(load(name))
    assert response.status_code == 200
    assert recorder.events == []
    assert calls == []


async def test_failed_status_is_logged_and_reported(
    adapter: WhatsAppAdapter,
    sender: WebhookSender,
    recorder: Recorder,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[tuple[str, str]] = []

    async def on_failed(wamid: str, error: str) -> None:
        calls.append((wamid, error))

    adapter.on_status_failed = on_failed
    payload = load("status_failed")
    wamid = payload["entry"][0]["changes"][0]["value"]["statuses"][0]["id"]
    with caplog.at_level(logging.WARNING, logger="bot.platforms.whatsapp"):
        (response,) = await sender.post(payload)
    assert response.status_code == 200
    assert recorder.events == []
    assert len(calls) == 1
    assert calls[0][0] == wamid
    assert "131047" in calls[0][1]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(log_ref(wamid) in m and "131047" in m for m in logged)
    assert not any(wamid in m for m in logged)


async def test_failing_status_callback_does_not_fail_the_webhook(
    adapter: WhatsAppAdapter, sender: WebhookSender
) -> None:
    async def on_failed(wamid: str, error: str) -> None:
        raise RuntimeError("ledger is down")

    adapter.on_status_failed = on_failed
    (response,) = await sender.post(load("status_failed"))
    assert response.status_code == 200


async def test_other_phone_number_id_is_ignored(sender: WebhookSender, recorder: Recorder) -> None:
    (response,) = await sender.post(load("other_phone_number_id"))
    assert response.status_code == 200
    assert recorder.events == []


@pytest.mark.parametrize("name", ["edit", "reaction", "revoke"], ids=["edit", "reaction", "revoke"])
async def test_edits_reactions_and_revokes_start_no_turn(
    sender: WebhookSender, recorder: Recorder, name: str
) -> None:
    (response,) = await sender.post(load(name))
    assert response.status_code == 200
    assert recorder.events == []


@pytest.mark.parametrize(
    "typ", ["system", "request_welcome", "deleted"], ids=["system", "welcome", "deleted"]
)
async def test_notices_start_no_turn(sender: WebhookSender, recorder: Recorder, typ: str) -> None:
    (response,) = await sender.post(sender.single(sender.message(typ, {"body": "x"})))
    assert response.status_code == 200
    assert recorder.events == []


async def test_group_message_maps_to_the_group(sender: WebhookSender, recorder: Recorder) -> None:
    (response,) = await sender.post(load("group_text"))
    assert response.status_code == 200
    (event,) = recorder.events
    assert event.source.chat_type == "group"
    assert event.source.chat_id == GROUP_ID
    assert event.source.sender_id == "447700900123"
    assert event.source.sender_name == "Priya Raman"
    assert event.mentions_bot
    assert event.addressed
    assert event.text == "¿podéis confirmar la reserva de las 21:00?"


async def test_group_message_without_mention_is_not_addressed(
    sender: WebhookSender, recorder: Recorder
) -> None:
    (response,) = await sender.post(sender.group_text("hola a todos /start"))
    assert response.status_code == 200
    (event,) = recorder.events
    assert event.source.chat_type == "group"
    assert not event.addressed


async def test_reply_to_the_business_number_is_a_reply_to_the_bot(
    sender: WebhookSender, recorder: Recorder
) -> None:
    payload = load("reply_with_context")
    message = payload["entry"][0]["changes"][0]["value"]["messages"][0]
    (response,) = await sender.post(payload)
    assert response.status_code == 200
    (event,) = recorder.events
    assert event.replies_to_bot
    assert event.platform_message_id == message["id"]
    assert event.reply_to_id == message["context"]["id"]


async def test_image_with_caption_gets_media_kind_and_caption(
    sender: WebhookSender, recorder: Recorder
) -> None:
    (response,) = await sender.post(load("image_with_caption"))
    assert response.status_code == 200
    (event,) = recorder.events
    assert event.media_kind == "image"
    assert event.text == "¿Tenéis esta talla?"


async def test_unsupported_gets_an_event_for_a_polite_answer(
    sender: WebhookSender, recorder: Recorder
) -> None:
    (response,) = await sender.post(load("unsupported"))
    assert response.status_code == 200
    (event,) = recorder.events
    assert event.media_kind == "unsupported"
    assert event.text == ""


@pytest.mark.parametrize(
    ("typ", "content", "kind", "text"),
    [
        ("image", {"id": "1", "mime_type": "image/jpeg"}, "image", ""),
        ("video", {"id": "1", "caption": "mira"}, "video", "mira"),
        ("document", {"id": "1", "filename": "a.pdf", "caption": "factura"}, "document", "factura"),
        ("audio", {"id": "1", "voice": False}, "audio", ""),
        ("audio", {"id": "1", "voice": True}, "voice", ""),
        ("sticker", {"id": "1", "animated": False}, "sticker", ""),
        ("location", {"latitude": 40.4, "longitude": -3.7}, "location", ""),
        ("contacts", [{"name": {"formatted_name": "Ana"}}], "contacts", ""),
        ("order", {"catalog_id": "1", "product_items": []}, "order", ""),
        ("future_kind", {"x": 1}, "unsupported", ""),
    ],
    ids=[
        "image",
        "video",
        "document",
        "audio",
        "voice",
        "sticker",
        "location",
        "contacts",
        "order",
        "unknown-type",
    ],
)
async def test_media_kinds(
    sender: WebhookSender, recorder: Recorder, typ: str, content: Any, kind: str, text: str
) -> None:
    (response,) = await sender.post(sender.single(sender.message(typ, content)))
    assert response.status_code == 200
    (event,) = recorder.events
    assert event.media_kind == kind
    assert event.text == text
