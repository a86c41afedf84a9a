"""TelegramAdapter against the fake Bot API server (tests/fakes/telegram_server.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from bot.errors import ChatflowError, ConfigurationError, PlatformError
from bot.gateway.contract import MessageEvent
from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.telegram.webhook import WEBHOOK_PATH
from bot.platforms.text import utf16_len
from tests.fakes.telegram_server import FakeTelegramServer, Fault

DATA = Path(__file__).resolve().parents[2] / "data" / "telegram"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


class Recorder:
    """A gateway stand-in: records accepted events; an optional hook runs first."""

    def __init__(self) -> None:
        self.events: list[MessageEvent] = []
        self.calls = 0
        self.hook: Callable[[MessageEvent], Awaitable[None]] | None = None
        self._cond = asyncio.Condition()

    async def __call__(self, event: MessageEvent) -> bool:
        self.calls += 1
        if self.hook is not None:
            await self.hook(event)
        async with self._cond:
            self.events.append(event)
            self._cond.notify_all()
        return True

    async def wait_for(self, count: int, within: float = 5.0) -> list[MessageEvent]:
        async with self._cond:
            await asyncio.wait_for(
                self._cond.wait_for(lambda: len(self.events) >= count), timeout=within
            )
            return list(self.events)


@pytest.fixture
async def server() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as fake:
        yield fake


AdapterFactory = Callable[..., TelegramAdapter]


@pytest.fixture
async def make_adapter(server: FakeTelegramServer) -> AsyncIterator[AdapterFactory]:
    made: list[TelegramAdapter] = []

    def factory(**kwargs: Any) -> TelegramAdapter:
        options: dict[str, Any] = {
            "base_url": server.base_url,
            "poll_timeout": 5,
            "backoff_initial": 0.01,
            "backoff_max": 0.05,
        }
        options.update(kwargs)
        token = options.pop("token", server.token)
        adapter = TelegramAdapter(token, **options)
        made.append(adapter)
        return adapter

    yield factory
    for adapter in made:
        await adapter.stop()


async def started(
    make_adapter: AdapterFactory, recorder: Recorder | None = None, **kwargs: Any
) -> tuple[TelegramAdapter, Recorder]:
    recorder = recorder or Recorder()
    adapter = make_adapter(**kwargs)
    await adapter.start(recorder)
    return adapter, recorder


async def test_dm_update_becomes_event(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, recorder = await started(make_adapter)
    assert adapter.is_connected
    assert adapter.bot_id == server.bot_id
    assert adapter.bot_username == server.bot_username
    deletes = await server.wait_for_request("deleteWebhook")
    assert deletes[0].params.get("drop_pending_updates") in (None, False)

    server.push_update(load("private_text"))
    (event,) = await recorder.wait_for(1)
    assert event.message_id == "telegram:111111111:10"
    assert event.source.chat_type == "dm"
    assert event.text == "Hola, ¿qué tal? 👋"
    # Confirmed only by a later poll, past the handled update.
    await server.wait_for_request("getUpdates", where=lambda r: r.params.get("offset") == 900000002)
    assert server.pending_update_ids == []


async def test_group_gating_facts(server: FakeTelegramServer, make_adapter: AdapterFactory) -> None:
    _, recorder = await started(make_adapter)
    names = [
        "group_plain",
        "group_mention",
        "group_reply_to_bot",
        "group_command_other_bot",
        "group_command_this_bot",
        "group_email_not_mention",
        "edited_message",
        "service_new_chat_members",
    ]
    for name in names:
        server.push_update(load(name))
    # Sentinel: once it arrives, every earlier update was handled.
    sentinel = server.push_update(load("private_text") | {"update_id": 900000100})
    events = await recorder.wait_for(6)
    assert events[-1].message_id == "telegram:111111111:10"
    by_id = {e.message_id.rsplit(":", 1)[1]: e for e in events[:-1]}
    assert set(by_id) == {"26", "20", "25", "27", "22"}  # other bot, edit, service: dropped
    assert {k: e.addressed for k, e in by_id.items()} == {
        "26": False,
        "20": True,
        "25": True,
        "27": True,
        "22": False,
    }
    await server.wait_for_request(
        "getUpdates", where=lambda r: r.params.get("offset") == sentinel + 1
    )


async def test_forum_topics_are_threads(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, recorder = await started(make_adapter)
    server.push_update(load("forum_topic_message"))
    server.push_update(load("forum_topic_message_other"))
    server.push_update(load("forum_general_topic"))
    first, second, general = await recorder.wait_for(3)
    assert (first.source.thread_id, second.source.thread_id) == ("42", "77")
    assert general.source.thread_id == "1"
    assert first.source.chat_id == second.source.chat_id

    for event in (first, second, general):
        await adapter.send(
            event.source.chat_id,
            f"answer for {event.source.thread_id}",
            thread_id=event.source.thread_id,
            reply_to=event.platform_message_id,
        )
    sent = await server.wait_for_sent(3)
    assert [m.message_thread_id for m in sent] == [42, 77, None]
    assert [m.reply_parameters["message_id"] for m in sent if m.reply_parameters] == [50, 51, 52]

    await adapter.indicate_typing(first)
    await adapter.indicate_typing(general)
    assert [a.params.get("message_thread_id") for a in server.chat_actions] == [42, None]


async def test_update_not_confirmed_before_on_event_returns(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    recorder = Recorder()
    entered = asyncio.Event()
    release = asyncio.Event()

    async def block(event: MessageEvent) -> None:
        entered.set()
        await release.wait()

    recorder.hook = block
    await started(make_adapter, recorder)
    update_id = server.push_update(load("private_text"))
    await asyncio.wait_for(entered.wait(), timeout=5)
    polls = len(server.get_updates_offsets)

    # While on_event runs, no getUpdates may confirm the update...
    with pytest.raises(TimeoutError):
        await server.wait_for_request("getUpdates", count=polls + 1, within=0.3)
    assert all(o is None or o <= update_id for o in server.get_updates_offsets)
    assert server.pending_update_ids == [update_id]

    # ...and once it returned, the next poll does.
    release.set()
    await server.wait_for_request(
        "getUpdates", where=lambda r: r.params.get("offset") == update_id + 1
    )
    assert server.pending_update_ids == []
    assert len(recorder.events) == 1


async def test_update_offered_again_after_crash(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    failing = Recorder()
    failed = asyncio.Event()

    async def crash(event: MessageEvent) -> None:
        failed.set()
        raise RuntimeError("database is gone")

    failing.hook = crash
    adapter, _ = await started(make_adapter, failing)
    update_id = server.push_update(load("group_mention"))
    await asyncio.wait_for(failed.wait(), timeout=5)
    await adapter.stop()
    assert not adapter.is_connected
    assert failing.events == []
    assert server.pending_update_ids == [update_id]  # never confirmed

    _, recorder = await started(make_adapter)
    (event,) = await recorder.wait_for(1)
    assert event.message_id == "telegram:-1001234567890:20"


async def test_accepted_update_is_confirmed_at_stop(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, recorder = await started(make_adapter)
    update_id = server.push_update(load("private_text"))
    await recorder.wait_for(1)
    await adapter.stop()
    assert update_id + 1 in server.get_updates_offsets
    assert server.pending_update_ids == []


async def test_on_event_failure_is_retried_without_loss(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    recorder = Recorder()
    failures = {"left": 2}

    async def flaky(event: MessageEvent) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise ChatflowError("busy", retryable=True, retry_after=0.01)

    recorder.hook = flaky
    await started(make_adapter, recorder)
    server.push_update(load("private_text"))
    server.push_update(load("group_mention"))
    events = await recorder.wait_for(2)
    assert [e.message_id for e in events] == [
        "telegram:111111111:10",
        "telegram:-1001234567890:20",
    ]
    assert recorder.calls == 4


async def test_polling_survives_server_errors(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    server.inject("getUpdates", Fault.server_error(), Fault.flood(0), Fault.server_error())
    _, recorder = await started(make_adapter)
    server.push_update(load("private_text"))
    (event,) = await recorder.wait_for(1)
    assert event.source.chat_type == "dm"


async def test_rejected_token_stops_start(
    server: FakeTelegramServer, make_adapter: AdapterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    bad = "987654321:AAwrongTokenWrongToken"
    adapter = make_adapter(token=bad)
    with pytest.raises(ConfigurationError):
        await adapter.start(Recorder())
    assert bad not in caplog.text
    assert not adapter.is_connected


async def test_webhook_route(server: FakeTelegramServer, make_adapter: AdapterFactory) -> None:
    adapter, recorder = await started(
        make_adapter, webhook_url="https://bot.example/webhooks/telegram", webhook_secret="s3cr-et"
    )
    assert server.webhook_url == "https://bot.example/webhooks/telegram"
    assert server.webhook_secret == "s3cr-et"
    assert all(r.method != "getUpdates" for r in server.requests)
    app = Starlette(routes=list(adapter.routes()))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bot") as client:
        update = load("group_mention")
        for headers in ({}, {"X-Telegram-Bot-Api-Secret-Token": "wrong"}):
            response = await client.post(WEBHOOK_PATH, json=update, headers=headers)
            assert response.status_code == 403
        assert recorder.calls == 0

        good = {"X-Telegram-Bot-Api-Secret-Token": "s3cr-et"}
        response = await client.post(WEBHOOK_PATH, content=b"{not json", headers=good)
        assert response.status_code == 400
        response = await client.post(WEBHOOK_PATH, json=load("edited_message"), headers=good)
        assert response.status_code == 200
        assert recorder.calls == 0

        response = await client.post(WEBHOOK_PATH, json=update, headers=good)
        assert response.status_code == 200
        assert [e.message_id for e in recorder.events] == ["telegram:-1001234567890:20"]

        async def refuse(event: MessageEvent) -> None:
            raise RuntimeError("inbox unavailable")

        recorder.hook = refuse
        response = await client.post(WEBHOOK_PATH, json=load("private_text"), headers=good)
        assert response.status_code == 500  # Telegram redelivers
        assert len(recorder.events) == 1


async def test_polling_mode_has_no_routes(make_adapter: AdapterFactory) -> None:
    adapter, _ = await started(make_adapter)
    assert adapter.routes() == []


async def test_send_split_reply_and_thread(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, _ = await started(make_adapter)
    text = "Intro paragraph.\n\n" + "漢字かな😀 " * 1500
    result = await adapter.send("-1009876543210", text, thread_id="42", reply_to="50")
    sent = await server.wait_for_sent(len(result.message_ids))
    assert len(sent) >= 2
    assert [str(m.message_id) for m in sent] == result.message_ids
    assert all(utf16_len(m.text) <= 4096 for m in sent)
    assert all(m.message_thread_id == 42 for m in sent)
    assert sent[0].reply_parameters == {"message_id": 50, "allow_sending_without_reply": True}
    assert all(m.reply_parameters is None for m in sent[1:])
    assert "".join(m.text for m in sent).replace(" ", "").replace("\n", "") == text.replace(
        " ", ""
    ).replace("\n", "")


async def test_send_falls_back_to_plain_text(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, _ = await started(make_adapter)
    await adapter.send("5", "snake_case_name is *fine")  # fails the Markdown check
    server.reject_parse_mode = True
    await adapter.send("5", "*really* fine")
    sent = await server.wait_for_sent(2)
    assert [m.parse_mode for m in sent] == [None, None]
    assert [m.text for m in sent] == ["snake_case_name is *fine", "*really* fine"]
    refused = [r for r in server.requests if r.method == "sendMessage" and "parse_mode" in r.params]
    assert len(refused) == 2


async def test_send_with_valid_markdown_keeps_it(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, _ = await started(make_adapter)
    await adapter.send("5", "*bold* and _italic_")
    (message,) = await server.wait_for_sent(1)
    assert message.parse_mode == "Markdown"


async def test_send_errors_from_server(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, _ = await started(make_adapter)
    server.inject("sendMessage", Fault.flood(4), Fault.blocked(), Fault.server_error())
    with pytest.raises(PlatformError) as flood:
        await adapter.send("5", "hi")
    assert (flood.value.retryable, flood.value.retry_after) == (True, 4.0)
    with pytest.raises(PlatformError) as blocked:
        await adapter.send("5", "hi")
    assert not blocked.value.retryable
    with pytest.raises(PlatformError) as broken:
        await adapter.send("5", "hi")
    assert broken.value.retryable and not broken.value.ambiguous
    assert server.sent == []


async def test_read_timeout_is_ambiguous(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, _ = await started(make_adapter, read_timeout=0.3)
    server.inject("sendMessage", Fault.hanging())
    with pytest.raises(PlatformError) as info:
        await adapter.send("5", "are you there?")
    assert info.value.ambiguous and info.value.retryable
    # It did arrive: exactly why a resend must carry the recovery marker.
    assert [m.text for m in server.sent] == ["are you there?"]
    server.release_hangs()


async def test_group_migration_on_send(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    adapter, recorder = await started(make_adapter)
    server.migrations[-4012345678] = -1004012345678
    result = await adapter.send("-4012345678", "hello group")
    (message,) = await server.wait_for_sent(1)
    assert message.chat_id == -1004012345678
    assert result.message_ids == [str(message.message_id)]
    (event,) = await recorder.wait_for(1)
    assert (event.source.chat_id, event.migrate_from_chat_id) == ("-1004012345678", "-4012345678")


async def test_migration_service_message_polled(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    _, recorder = await started(make_adapter)
    server.push_update(load("migrate_from_chat_id"))
    (event,) = await recorder.wait_for(1)
    assert event.migrate_from_chat_id == "-4012345678"
    assert event.text == ""


async def test_stop_is_idempotent_and_restartable(
    server: FakeTelegramServer, make_adapter: AdapterFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    adapter, _ = await started(make_adapter)
    await adapter.stop()
    await adapter.stop()
    assert not adapter.is_connected
    recorder = Recorder()
    await adapter.start(recorder)
    server.push_update(load("private_text"))
    await recorder.wait_for(1)
    with pytest.raises(RuntimeError):
        await adapter.start(recorder)
    await adapter.stop()
    # Ours at any level; PTB at INFO and above. (httpx logs URLs, token included,
    # at INFO, and PTB logs its base URL at DEBUG: the app keeps those loggers down.)
    checked = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("bot.platforms")
        or (r.levelno >= logging.INFO and not r.name.startswith("httpx"))
    ]
    assert any("Telegram adapter stopped" in m for m in checked)
    assert all(server.token not in m for m in checked)


async def test_typing_is_not_throttled_by_the_group_limit(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    # PTB's limiter allows 20 requests a minute per group; typing is refreshed every
    # few seconds and must not eat that budget (or be held back by it).
    adapter, recorder = await started(make_adapter)
    server.push_update(load("group_mention"))
    (event,) = await recorder.wait_for(1)
    await asyncio.wait_for(
        asyncio.gather(*(adapter.indicate_typing(event) for _ in range(25))), timeout=2
    )
    assert len(server.chat_actions) == 25


async def test_stop_timeout_bounds_a_stuck_on_event(
    server: FakeTelegramServer, make_adapter: AdapterFactory
) -> None:
    recorder = Recorder()
    entered = asyncio.Event()
    never = asyncio.Event()

    async def stuck(event: MessageEvent) -> None:
        entered.set()
        await never.wait()

    recorder.hook = stuck
    adapter, _ = await started(make_adapter, recorder, stop_timeout=0.05)
    update_id = server.push_update(load("private_text"))
    await asyncio.wait_for(entered.wait(), timeout=5)
    # Far below the 30 s default: stop() gave up on the handler after stop_timeout.
    await asyncio.wait_for(adapter.stop(), timeout=5)
    assert not adapter.is_connected
    assert server.pending_update_ids == [update_id]  # cancelled, so never confirmed


def _unreadable_update() -> dict[str, Any]:
    # A recorded update whose "date" changed type, as a newer Bot API might do.
    update = load("private_text")
    update["message"]["date"] = "2025-01-01T00:00:00Z"
    return update


@pytest.mark.parametrize("mode", ["polling", "webhook"], ids=["polling", "webhook"])
async def test_unreadable_update_is_skipped_with_one_warning(
    server: FakeTelegramServer,
    make_adapter: AdapterFactory,
    caplog: pytest.LogCaptureFixture,
    mode: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    broken = _unreadable_update()
    good = load("group_mention")
    if mode == "polling":
        _, recorder = await started(make_adapter)
        broken_id = server.push_update(broken)
        server.push_update(good)
        (event,) = await recorder.wait_for(1)
        await server.wait_for_request(
            "getUpdates", where=lambda r: (r.params.get("offset") or 0) > broken_id
        )
    else:
        adapter, recorder = await started(
            make_adapter, webhook_url="https://bot.example/webhooks/telegram", webhook_secret="s"
        )
        transport = httpx.ASGITransport(app=Starlette(routes=list(adapter.routes())))
        headers = {"X-Telegram-Bot-Api-Secret-Token": "s"}
        async with httpx.AsyncClient(transport=transport, base_url="http://bot") as client:
            skipped = await client.post(WEBHOOK_PATH, json=broken, headers=headers)
            accepted = await client.post(WEBHOOK_PATH, json=good, headers=headers)
        # 200: a redelivery would fail the same way, so Telegram must not retry it.
        assert (skipped.status_code, accepted.status_code) == (200, 200)
        (event,) = recorder.events
    assert event.message_id == "telegram:-1001234567890:20"
    assert recorder.calls == 1
    ours = [
        r
        for r in caplog.records
        if r.name.startswith("bot.platforms") and r.levelno >= logging.WARNING
    ]
    assert [(r.levelno, r.exc_info) for r in ours] == [(logging.WARNING, None)]
    line = ours[0].getMessage()
    assert str(broken["update_id"]) in line
    for secret in ("111111111", "Hola", "alice", "Liddell"):
        assert secret not in line
