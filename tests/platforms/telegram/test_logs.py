"""No raw id, token or text in Telegram logs at INFO or above (pywa's test_pii_absent_at_info).

The adapter is driven through its failure paths against the fake Bot API
server, with everything captured at DEBUG; only the httpx logger is left out
(it logs request URLs, token included, at INFO: the app keeps it at WARNING).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

import bot.platforms.telegram.adapter as telegram_module
from bot.errors import PlatformError, StorageError
from bot.gateway.contract import MessageEvent
from bot.logs import log_ref
from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.telegram.webhook import WEBHOOK_PATH
from tests.fakes.telegram_server import FakeTelegramServer, Fault

DATA = Path(__file__).resolve().parents[2] / "data" / "telegram"

USER_ID = 7123456789  # a private chat: its chat id is this user id
MESSAGE_ID = 8675309
TEXT = "my card ends in 4242, call me on 0612345678"
OLD_GROUP = -4012345678
NEW_GROUP = -1004012345678
EVENT_ID = f"telegram:{USER_ID}:{MESSAGE_ID}"
SECRET = "w3bhook-secret"


def private_update(update_id: int, *, message_id: int = MESSAGE_ID) -> dict[str, Any]:
    """The recorded private_text update, carrying this test's ids and text."""
    update: dict[str, Any] = json.loads((DATA / "private_text.json").read_text(encoding="utf-8"))
    message = update["message"]
    update["update_id"] = update_id
    message["message_id"] = message_id
    message["from"]["id"] = USER_ID
    message["chat"]["id"] = USER_ID
    message["text"] = TEXT
    return update


def unreadable_update(update_id: int) -> dict[str, Any]:
    update = private_update(update_id)
    update["message"]["date"] = "2025-01-01T00:00:00Z"  # PTB rejects it (TypeError)
    return update


class Gateway:
    """Fails with the given exceptions in turn, then accepts."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.accepted: list[MessageEvent] = []
        self._cond = asyncio.Condition()

    async def __call__(self, event: MessageEvent) -> bool:
        if self.failures:
            raise self.failures.pop(0)
        async with self._cond:
            self.accepted.append(event)
            self._cond.notify_all()
        return True

    async def wait_for(self, count: int) -> None:
        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: len(self.accepted) >= count), timeout=5
            )


def quoting_failures() -> list[Exception]:
    """Refusals whose messages quote the ids and the text, as real ones can."""
    return [
        StorageError(f"duplicate key (message_id)=({EVENT_ID}) text={TEXT!r}", retryable=True),
        KeyError(str(USER_ID)),
        RuntimeError(f"bug while handling {TEXT!r} from {USER_ID}"),
    ]


@pytest.fixture
async def server() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as fake:
        yield fake


def rendered(record: logging.LogRecord) -> str:
    """The record as a handler writes it: the message and any traceback."""
    return logging.Formatter("%(levelname)s %(name)s %(message)s").format(record)


def leaks(records: list[logging.LogRecord], secrets: list[str]) -> list[str]:
    found = []
    for record in records:
        if record.levelno < logging.INFO or record.name.startswith("httpx"):
            continue
        line = rendered(record)
        found += [f"{secret!r} in {line!r}" for secret in secrets if secret in line]
    return found


async def drive_polling(server: FakeTelegramServer, monkeypatch: pytest.MonkeyPatch) -> None:
    real_map = telegram_module.map_update

    def failing_map(update: Any, **kwargs: Any) -> MessageEvent | None:
        if update.update_id == 2:
            raise ValueError(f"cannot map {TEXT!r} in chat {USER_ID}")
        return real_map(update, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(telegram_module, "map_update", failing_map)
        await run_polling(server)


async def run_polling(server: FakeTelegramServer) -> None:
    server.inject("getUpdates", Fault.server_error())
    gateway = Gateway(*quoting_failures())
    adapter = TelegramAdapter(
        server.token,
        base_url=server.base_url,
        poll_timeout=5,
        read_timeout=0.3,
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    await adapter.start(gateway)
    try:
        server.push_update(unreadable_update(1))
        server.push_update(private_update(2, message_id=MESSAGE_ID + 1))
        server.push_update(private_update(3))
        await gateway.wait_for(1)

        server.inject(
            "sendMessage",
            Fault.blocked(),
            Fault.bad_request("chat not found"),
            Fault.flood(3),
            Fault.server_error(),
            Fault.hanging(),
        )
        for _ in range(5):
            with pytest.raises(PlatformError):
                await adapter.send(str(USER_ID), TEXT, reply_to=EVENT_ID)
        server.release_hangs()
        # The first part goes through, the second is refused.
        server.on_send = lambda sent: server.inject("sendMessage", Fault.blocked())
        with pytest.raises(PlatformError):
            await adapter.send(str(USER_ID), (TEXT + "\n") * 200)
        server.on_send = None

        server.migrations[OLD_GROUP] = NEW_GROUP
        gateway.failures = [RuntimeError(f"no session for {OLD_GROUP} -> {NEW_GROUP}")]
        await adapter.send(str(OLD_GROUP), TEXT)

        server.inject("sendChatAction", Fault.blocked())
        await adapter.indicate_typing(gateway.accepted[0])
    finally:
        await adapter.stop()


async def drive_webhook(server: FakeTelegramServer) -> None:
    gateway = Gateway(*quoting_failures())
    adapter = TelegramAdapter(
        server.token,
        base_url=server.base_url,
        webhook_url="https://bot.example/webhooks/telegram",
        webhook_secret=SECRET,
    )
    await adapter.start(gateway)
    try:
        transport = httpx.ASGITransport(app=Starlette(routes=list(adapter.routes())))
        headers = {"X-Telegram-Bot-Api-Secret-Token": SECRET}
        async with httpx.AsyncClient(transport=transport, base_url="http://bot") as client:
            statuses = [
                (await client.post(WEBHOOK_PATH, json=update, headers=headers)).status_code
                for update in [unreadable_update(10)] + [private_update(11)] * 4
            ]
    finally:
        await adapter.stop()
    assert statuses == [200, 503, 500, 500, 200]
    assert len(gateway.accepted) == 1


async def test_failure_paths_log_no_ids_token_or_text(
    server: FakeTelegramServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)
    await drive_polling(server, monkeypatch)
    await drive_webhook(server)

    secrets = [
        str(USER_ID),
        str(MESSAGE_ID),
        str(MESSAGE_ID + 1),
        str(OLD_GROUP),
        str(NEW_GROUP),
        server.token,
        TEXT,
        "4242",
    ]
    assert leaks(caplog.records, secrets) == []
    # The paths really ran, and what they logged can be matched with the gateway's logs.
    ours = " | ".join(
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("bot.platforms") and r.levelno >= logging.WARNING
    )
    for expected in (
        "unreadable",
        "unmappable",
        "not accepted by the gateway (StorageError)",
        "not accepted by the gateway (KeyError)",
        "getUpdates failed",
        "send failed on part 1 of 1",
        "send failed on part 2 of",
        "migration notice not accepted (RuntimeError)",
        log_ref(EVENT_ID),
    ):
        assert expected in ours
    # The details are still there for whoever turns DEBUG on.
    debug = [rendered(r) for r in caplog.records if r.name.startswith("bot.platforms")]
    assert any(TEXT in line and "KeyError" not in line for line in debug)
