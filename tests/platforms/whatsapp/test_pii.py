"""No WhatsApp id reaches the logs raw: wamids, wa_ids and group ids only as ``log_ref``.

A wamid is base64 around the sender's (or recipient's) phone number, so logging
one at WARNING ships the number to every log sink. These tests drive the real
adapter over its failure paths, where ids get logged, with wamids in Meta's own
format (``real_wamid``), and look for the number, the wamid and its base64 body
in every record at INFO and above (and in our own DEBUG records).
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import respx
from starlette.applications import Starlette

from bot.errors import ChatflowError, StorageError
from bot.gateway.contract import MessageEvent
from bot.logs import log_ref
from bot.platforms.whatsapp.adapter import DEFAULT_API_VERSION, WEBHOOK_PATH, WhatsAppAdapter
from tests.fakes.whatsapp_webhook import (
    GROUP_ID,
    PHONE_NUMBER_ID,
    USER_WA_ID,
    WebhookSender,
    real_wamid,
)

APP_SECRET = "app-secret-for-pii-tests"
URL = f"http://bot.test{WEBHOOK_PATH}"
GRAPH = f"https://graph.facebook.com/v{DEFAULT_API_VERSION}/{PHONE_NUMBER_ID}/messages"
PAYLOADS = Path("/work/shared/payloads/whatsapp")
# Keys whose values identify a person, a chat or a message, or are what they said.
_SENSITIVE_KEYS = frozenset(
    {
        "wa_id",
        "from",
        "id",
        "recipient_id",
        "group_id",
        "user_id",
        "parent_user_id",
        "from_user_id",
        "message_id",
        "original_message_id",
        "body",
        "caption",
    }
)
# Shorter values ("1", "x") would match innocent log text by accident.
_MIN_SECRET_LEN = 6

OnEvent = Callable[[MessageEvent], Awaitable[bool]]


class AdapterFactory(Protocol):
    """Starts an adapter that is stopped when the test ends."""

    async def __call__(
        self, on_event: OnEvent, phone_id: str = PHONE_NUMBER_ID
    ) -> WhatsAppAdapter: ...


def wamid_secrets(wamid: str, wa_id: str) -> list[str]:
    """What must never be logged of ``wamid``: itself, its base64 body, the number in it."""
    body = wamid.removeprefix("wamid.")
    # The 3-byte header is 4 base64 characters, so the next 12 encode wa_id[:9] on their own:
    # a truncated wamid in a log would still carry this fragment of the number.
    return [wamid, body, body[4:16], wa_id]


def formatted(record: logging.LogRecord) -> list[str]:
    """The text a handler could write for ``record``: message, traceback and stack."""
    texts = [record.getMessage()]
    if record.exc_info and record.exc_info[1] is not None:
        texts.append("".join(traceback.format_exception(record.exc_info[1])))
    if record.exc_text:
        texts.append(record.exc_text)
    if record.stack_info:
        texts.append(record.stack_info)
    return texts


def leaks(records: Iterable[logging.LogRecord], secrets: Iterable[str]) -> list[str]:
    """Every (record, secret) pair where a secret shows: INFO+ anywhere, DEBUG from ``bot``."""
    wanted = [s for s in dict.fromkeys(secrets) if len(s) >= _MIN_SECRET_LEN]
    found: list[str] = []
    for record in records:
        ours = record.name == "bot" or record.name.startswith("bot.")
        if record.levelno < logging.INFO and not ours:
            continue
        for text in formatted(record):
            found.extend(
                f"{record.levelname} {record.name}: {secret!r} in {text!r}"
                for secret in wanted
                if secret in text
            )
    return found


def logged_at(records: Iterable[logging.LogRecord], level: int, ref: str) -> bool:
    return any(r.levelno == level and ref in r.getMessage() for r in records)


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG):
        yield caplog


async def started(on_event: OnEvent, phone_id: str = PHONE_NUMBER_ID) -> WhatsAppAdapter:
    adapter = WhatsAppAdapter(
        phone_id, "test-token", verify_token="vt", app_secret=APP_SECRET, send_pause=0
    )
    await adapter.start(on_event)
    return adapter


def sender_for(adapter: WhatsAppAdapter) -> WebhookSender:
    app = Starlette(routes=list(adapter.routes()))
    return WebhookSender(URL, APP_SECRET, transport=httpx.ASGITransport(app=app))


async def accept(event: MessageEvent) -> bool:
    return True


async def refuse_storage(event: MessageEvent) -> bool:
    raise StorageError("inbox is unavailable")


async def refuse_busy(event: MessageEvent) -> bool:
    raise ChatflowError("the queue is full", retryable=True, retry_after=3)


async def crash(event: MessageEvent) -> bool:
    raise RuntimeError("unexpected bug in the gateway")


@pytest.fixture
async def adapter_factory() -> AsyncIterator[AdapterFactory]:
    adapters: list[WhatsAppAdapter] = []

    async def make(on_event: OnEvent, phone_id: str = PHONE_NUMBER_ID) -> WhatsAppAdapter:
        adapter = await started(on_event, phone_id)
        adapters.append(adapter)
        return adapter

    yield make
    for adapter in adapters:
        await adapter.stop()


# -- the adapter's failure paths -----------------------------------------------------------


@pytest.mark.parametrize(
    ("on_event", "status", "level"),
    [
        (refuse_storage, 500, logging.ERROR),
        (refuse_busy, 503, logging.WARNING),
        (crash, 500, logging.ERROR),
    ],
    ids=["storage-error", "busy", "unexpected-exception"],
)
@pytest.mark.parametrize("chat", ["dm", "group"], ids=["dm", "group"])
async def test_refused_message_is_logged_by_reference_only(
    adapter_factory: AdapterFactory,
    debug_logs: pytest.LogCaptureFixture,
    on_event: OnEvent,
    status: int,
    level: int,
    chat: str,
) -> None:
    adapter = await adapter_factory(on_event)
    sender = sender_for(adapter)
    wamid = real_wamid(USER_WA_ID)
    text = "Mi número es el de siempre"
    if chat == "group":
        payload = sender.group_text(text, wamid=wamid)
    else:
        payload = sender.text(text, wamid=wamid)
    response = await sender.post_one(payload)
    assert response.status_code == status
    secrets = [*wamid_secrets(wamid, USER_WA_ID), GROUP_ID, text]
    assert leaks(debug_logs.records, secrets) == []
    assert logged_at(debug_logs.records, level, log_ref(wamid))


@pytest.mark.parametrize("callback_fails", [False, True], ids=["callback-ok", "callback-fails"])
async def test_failed_delivery_of_a_sent_message_is_logged_by_reference_only(
    adapter_factory: AdapterFactory,
    debug_logs: pytest.LogCaptureFixture,
    callback_fails: bool,
) -> None:
    adapter = await adapter_factory(accept)
    sent = real_wamid(USER_WA_ID)
    with respx.mock(assert_all_mocked=True) as graph:
        graph.post(GRAPH).mock(
            return_value=httpx.Response(
                200,
                json={
                    "messaging_product": "whatsapp",
                    "contacts": [{"input": USER_WA_ID, "wa_id": USER_WA_ID}],
                    "messages": [{"id": sent}],
                },
            )
        )
        result = await adapter.send(USER_WA_ID, "Su pedido está listo")
    assert result.message_ids == [sent]
    assert sent in adapter._sent_ids  # remembered as ours
    reported: list[str] = []

    async def on_failed(wamid: str, error: str) -> None:
        reported.append(wamid)
        if callback_fails:
            raise StorageError("ledger is unavailable")

    adapter.on_status_failed = on_failed
    sender = sender_for(adapter)
    response = await sender.post_one(sender.status(sent, "failed"))
    assert response.status_code == 200
    assert reported == [sent]
    assert leaks(debug_logs.records, wamid_secrets(sent, USER_WA_ID)) == []
    ref = log_ref(sent)
    assert logged_at(debug_logs.records, logging.WARNING, f"delivery failed for {ref}")
    if callback_fails:
        assert logged_at(debug_logs.records, logging.WARNING, f"callback failed for {ref}")


async def test_malformed_messages_in_a_batch_are_logged_by_reference_only(
    adapter_factory: AdapterFactory, debug_logs: pytest.LogCaptureFixture
) -> None:
    events: list[MessageEvent] = []

    async def record(event: MessageEvent) -> bool:
        events.append(event)
        return True

    adapter = await adapter_factory(record)
    sender = sender_for(adapter)
    other = "447700900123"
    good = sender.message("text", {"body": "hola"}, wa_id=USER_WA_ID)
    no_body = sender.message("text", {}, wa_id=USER_WA_ID)
    no_sender = sender.message("text", {"body": "¿quién soy?"}, wa_id=other)
    del no_sender["from"]
    no_id = sender.message("text", {"body": "sin id"}, wa_id=other)
    del no_id["id"]
    reaction = sender.message("reaction", {"message_id": good["id"], "emoji": "+"}, wa_id=other)
    # No contacts, so nothing can stand in for the missing sender.
    value = sender.value([good, no_body, no_sender, no_id, reaction], contacts=[])
    response = await sender.post_one(sender.envelope([[value]]))
    assert response.status_code == 200
    assert [e.message_id for e in events] == [good["id"]]
    records = debug_logs.records
    secrets = [
        *wamid_secrets(good["id"], USER_WA_ID),
        *wamid_secrets(no_body["id"], USER_WA_ID),
        *wamid_secrets(no_sender["id"], other),
        *wamid_secrets(reaction["id"], other),
        "¿quién soy?",
        "sin id",
    ]
    assert leaks(records, secrets) == []
    assert logged_at(records, logging.WARNING, log_ref(no_body["id"]))
    assert logged_at(records, logging.WARNING, log_ref(no_sender["id"]))


# -- payloads recorded by other WhatsApp libraries -----------------------------------------


def _bodies(path: Path) -> list[tuple[str, dict[str, Any]]]:
    data: Any = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and "object" in data:
        return [(path.stem, data)]
    return [(name, body) for name, body in data.items() if isinstance(body, dict)]


def _strings_under_sensitive_keys(value: Any, key: str | None = None) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _strings_under_sensitive_keys(v, k)
    elif isinstance(value, list):
        for item in value:
            yield from _strings_under_sensitive_keys(item, key)
    elif key in _SENSITIVE_KEYS and isinstance(value, str | int) and not isinstance(value, bool):
        text = str(value)
        yield text
        if text.startswith("wamid."):
            yield text.removeprefix("wamid.")


def _phone_id(body: dict[str, Any]) -> str:
    for entry in body.get("entry") or []:
        for change in entry.get("changes") or []:
            metadata = (change.get("value") or {}).get("metadata") or {}
            if metadata.get("phone_number_id"):
                return str(metadata["phone_number_id"])
    return PHONE_NUMBER_ID


_PAYLOAD_FILES = sorted(PAYLOADS.rglob("*.json")) if PAYLOADS.is_dir() else []


@pytest.mark.skipif(not _PAYLOAD_FILES, reason=f"no recorded payloads in {PAYLOADS}")
@pytest.mark.parametrize(
    "path",
    _PAYLOAD_FILES,
    ids=[str(p.relative_to(PAYLOADS).with_suffix("")) for p in _PAYLOAD_FILES],
)
async def test_recorded_payloads_log_no_raw_id(
    adapter_factory: AdapterFactory, debug_logs: pytest.LogCaptureFixture, path: Path
) -> None:
    async def failing_callback(wamid: str, error: str) -> None:
        raise StorageError("ledger is unavailable")

    senders: dict[tuple[OnEvent, str], WebhookSender] = {}
    secrets: list[str] = []
    for name, body in _bodies(path):
        secrets.extend(_strings_under_sensitive_keys(body))
        # Refused first (the message paths), then accepted so statuses reach the callback.
        for on_event in (refuse_storage, crash, accept):
            key = (on_event, _phone_id(body))
            if key not in senders:
                adapter = await adapter_factory(*key)
                adapter.on_status_failed = failing_callback
                senders[key] = sender_for(adapter)
            response = await senders[key].post_one(body)
            assert response.status_code in (200, 500), name
    assert leaks(debug_logs.records, secrets) == []
