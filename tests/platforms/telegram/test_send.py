"""TelegramAdapter.send and start, with the Bot API mocked by respx.

``translate_error`` on its own is tested in ``test_telegram_errors.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
import respx

from bot.errors import ConfigurationError, PlatformError
from bot.gateway.contract import MessageEvent, SessionSource
from bot.platforms.base import PlatformAdapter
from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.text import utf16_len

TOKEN = "123456789:AAtestTOKENvalue_for_respx_only"
API = f"https://api.telegram.org/bot{TOKEN}"
BOT_USER = {"id": 5000000001, "is_bot": True, "first_name": "Chatflow", "username": "cf_bot"}


def ok(result: Any) -> httpx.Response:
    return httpx.Response(200, json={"ok": True, "result": result})


def error(status: int, description: str, **parameters: Any) -> httpx.Response:
    body: dict[str, Any] = {"ok": False, "error_code": status, "description": description}
    if parameters:
        body["parameters"] = parameters
    return httpx.Response(status, json=body)


def sent_message(chat_id: int, message_id: int, text: str = "x") -> httpx.Response:
    chat_type = "private" if chat_id > 0 else "supergroup"
    return ok(
        {
            "message_id": message_id,
            "date": 1735689600,
            "chat": {"id": chat_id, "type": chat_type, "title": "t"},
            "from": BOT_USER,
            "text": text,
        }
    )


def form(request: httpx.Request) -> dict[str, str]:
    return dict(parse_qsl(request.content.decode("utf-8"), keep_blank_values=True))


class Recorder:
    """A gateway stand-in: records events and accepts them."""

    def __init__(self) -> None:
        self.events: list[MessageEvent] = []

    async def __call__(self, event: MessageEvent) -> bool:
        self.events.append(event)
        return True


@pytest.fixture
async def mock() -> AsyncIterator[respx.MockRouter]:
    with respx.mock(base_url=API, assert_all_called=False) as router:
        router.post("/getMe").mock(return_value=ok(BOT_USER))
        router.post("/setWebhook").mock(return_value=ok(True))
        yield router


@pytest.fixture
async def adapter(mock: respx.MockRouter) -> AsyncIterator[TelegramAdapter]:
    # Webhook mode: start() makes no getUpdates calls, so respx only sees sends.
    tg = TelegramAdapter(
        TOKEN, webhook_url="https://bot.example/webhooks/telegram", webhook_secret="s3cret"
    )
    recorder = Recorder()
    await tg.start(recorder)
    tg.recorder = recorder  # type: ignore[attr-defined]
    yield tg
    await tg.stop()


def send_route(mock: respx.MockRouter, *responses: httpx.Response | Exception) -> respx.Route:
    return mock.post("/sendMessage").mock(side_effect=list(responses))


async def test_adapter_satisfies_protocol(adapter: TelegramAdapter) -> None:
    assert isinstance(adapter, PlatformAdapter)
    assert adapter.name == "telegram"
    assert adapter.max_text_len == 4096
    assert adapter.is_connected
    assert adapter.bot_id == 5000000001
    assert adapter.bot_username == "cf_bot"
    assert adapter.format_reply("hi", "Agent") == "hi"


async def test_send_simple_with_reply_and_topic(
    adapter: TelegramAdapter, mock: respx.MockRouter
) -> None:
    route = send_route(mock, sent_message(-100123, 77))
    result = await adapter.send("-100123", "hello", thread_id="42", reply_to="telegram:-100123:9")
    assert result.message_ids == ["77"]
    body = form(route.calls[0].request)
    assert body["chat_id"] == "-100123"
    assert body["text"] == "hello"
    assert body["message_thread_id"] == "42"
    assert body["parse_mode"] == "Markdown"
    assert json.loads(body["reply_parameters"]) == {
        "message_id": 9,
        "allow_sending_without_reply": True,
    }


@pytest.mark.parametrize(
    ("thread_id", "expected"),
    [(None, None), ("1", None), ("7", "7")],
    ids=["no-thread", "general-topic-omitted", "topic"],
)
async def test_thread_id_on_send(
    adapter: TelegramAdapter, mock: respx.MockRouter, thread_id: str | None, expected: str | None
) -> None:
    route = send_route(mock, sent_message(-100123, 1))
    await adapter.send("-100123", "hi", thread_id=thread_id)
    assert form(route.calls[0].request).get("message_thread_id") == expected


async def test_flood_control_then_success(adapter: TelegramAdapter, mock: respx.MockRouter) -> None:
    send_route(
        mock, error(429, "Too Many Requests: retry after 3", retry_after=3), sent_message(5, 2)
    )
    with pytest.raises(PlatformError) as info:
        await adapter.send("5", "hi")
    assert info.value.retryable
    assert info.value.retry_after == 3.0
    assert not info.value.ambiguous
    assert info.value.code == 429
    # The caller retries after retry_after: the next attempt goes through.
    assert (await adapter.send("5", "hi")).message_ids == ["2"]


async def test_parse_error_falls_back_to_plain_text(
    adapter: TelegramAdapter, mock: respx.MockRouter
) -> None:
    route = send_route(
        mock,
        error(400, "Bad Request: can't parse entities: Can't find end of the entity at byte 3"),
        sent_message(5, 10),
    )
    result = await adapter.send("5", "a *b")
    assert result.message_ids == ["10"]
    first, second = (form(call.request) for call in route.calls)
    assert first["parse_mode"] == "Markdown"
    assert "parse_mode" not in second
    assert second["text"] == "a *b"


async def test_other_bad_request_is_permanent_without_plain_retry(
    adapter: TelegramAdapter, mock: respx.MockRouter
) -> None:
    route = send_route(mock, error(400, "Bad Request: chat not found"))
    with pytest.raises(PlatformError) as info:
        await adapter.send("5", "hi")
    assert not info.value.retryable
    assert info.value.code == 400
    assert route.call_count == 1


async def test_forbidden_is_permanent(adapter: TelegramAdapter, mock: respx.MockRouter) -> None:
    send_route(mock, error(403, "Forbidden: bot was blocked by the user"))
    with pytest.raises(PlatformError) as info:
        await adapter.send("5", "hi")
    assert not info.value.retryable
    assert not info.value.ambiguous
    assert info.value.code == 403
    assert info.value.platform == "telegram"


@pytest.mark.parametrize(
    ("failure", "ambiguous"),
    [
        (httpx.ReadTimeout("read timed out"), True),
        (httpx.WriteTimeout("write timed out"), True),
        (httpx.RemoteProtocolError("server disconnected"), True),
        (httpx.ConnectTimeout("connect timed out"), False),
        (httpx.ConnectError("connection refused"), False),
        (httpx.PoolTimeout("pool exhausted"), False),
        (error(500, "Internal Server Error"), False),
        (error(502, "Bad Gateway"), False),
    ],
    ids=[
        "read-timeout",
        "write-timeout",
        "dropped-connection",
        "connect-timeout",
        "connect-error",
        "pool-timeout",
        "http-500",
        "http-502",
    ],
)
async def test_transport_failures_are_retryable_and_maybe_ambiguous(
    adapter: TelegramAdapter,
    mock: respx.MockRouter,
    failure: httpx.Response | Exception,
    ambiguous: bool,
) -> None:
    send_route(mock, failure)
    with pytest.raises(PlatformError) as info:
        await adapter.send("5", "hi")
    assert info.value.retryable
    assert info.value.ambiguous is ambiguous


def _boundary_text() -> str:
    # Part 1 ends in a word of emoji and CJK straddling the 4096-unit limit.
    return "word " * 818 + "漢字😀😀漢字" + " " + "末尾😀" * 500


async def test_long_text_is_split_in_order(
    adapter: TelegramAdapter, mock: respx.MockRouter
) -> None:
    texts: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = form(request)
        texts.append(body["text"])
        return sent_message(5, 100 + len(texts))

    route = mock.post("/sendMessage").mock(side_effect=reply)
    text = _boundary_text()
    assert utf16_len(text) > 4096
    result = await adapter.send("5", text, reply_to="9")
    assert result.message_ids == [str(100 + i) for i in range(1, len(texts) + 1)]
    assert len(texts) >= 2
    assert all(0 < utf16_len(t) <= 4096 for t in texts)
    assert "".join(texts).replace(" ", "") == text.replace(" ", "")
    bodies = [form(call.request) for call in route.calls]
    assert "reply_parameters" in bodies[0]
    assert all("reply_parameters" not in b for b in bodies[1:])


async def test_failure_after_first_part_is_ambiguous(
    adapter: TelegramAdapter, mock: respx.MockRouter
) -> None:
    send_route(mock, sent_message(5, 1), error(403, "Forbidden: bot was blocked by the user"))
    with pytest.raises(PlatformError) as info:
        await adapter.send("5", "x" * 5000)
    assert info.value.ambiguous
    assert not info.value.retryable
    assert "1 of 2 parts" in str(info.value)


async def test_chat_migration_resends_and_tells_the_gateway(
    adapter: TelegramAdapter, mock: respx.MockRouter
) -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        chat_id = int(form(request)["chat_id"])
        if chat_id == -4012345678:
            return error(
                400,
                "Bad Request: group chat was upgraded to a supergroup chat",
                migrate_to_chat_id=-1004012345678,
            )
        return sent_message(chat_id, 3)

    route = mock.post("/sendMessage").mock(side_effect=reply)
    result = await adapter.send("-4012345678", "hello")
    assert result.message_ids == ["3"]
    assert [form(c.request)["chat_id"] for c in route.calls] == ["-4012345678", "-1004012345678"]
    events = adapter.recorder.events  # type: ignore[attr-defined]
    assert len(events) == 1
    assert events[0].migrate_from_chat_id == "-4012345678"
    assert events[0].source.chat_id == "-1004012345678"
    assert events[0].text == ""
    # Later sends to the old id go straight to the supergroup.
    await adapter.send("-4012345678", "again")
    assert form(route.calls[-1].request)["chat_id"] == "-1004012345678"
    assert route.call_count == 3


@pytest.mark.parametrize("text", ["", "   \n"], ids=["empty", "blank"])
async def test_blank_text_is_refused_without_a_request(
    adapter: TelegramAdapter, mock: respx.MockRouter, text: str
) -> None:
    route = send_route(mock)
    with pytest.raises(PlatformError) as info:
        await adapter.send("5", text)
    assert info.value.code == "empty_text"
    assert not info.value.retryable
    assert route.call_count == 0


async def test_send_before_start_is_retryable() -> None:
    tg = TelegramAdapter(TOKEN)
    with pytest.raises(PlatformError) as info:
        await tg.send("5", "hi")
    assert info.value.retryable


def _event(chat_id: str, thread_id: str | None) -> MessageEvent:
    return MessageEvent(
        platform="telegram",
        message_id=f"telegram:{chat_id}:1",
        source=SessionSource("telegram", chat_id, "group", "42", thread_id=thread_id),
        text="hi",
    )


@pytest.mark.parametrize(
    ("thread_id", "expected"),
    [(None, None), ("1", None), ("42", "42")],
    ids=["no-thread", "general", "topic"],
)
async def test_typing_action(
    adapter: TelegramAdapter, mock: respx.MockRouter, thread_id: str | None, expected: str | None
) -> None:
    route = mock.post("/sendChatAction").mock(return_value=ok(True))
    await adapter.indicate_typing(_event("-100123", thread_id))
    body = form(route.calls[0].request)
    assert body["action"] == "typing"
    assert body.get("message_thread_id") == expected


async def test_typing_errors_are_swallowed(
    adapter: TelegramAdapter, mock: respx.MockRouter
) -> None:
    route = mock.post("/sendChatAction").mock(
        side_effect=[error(403, "Forbidden: bot was kicked"), httpx.ConnectError("down")]
    )
    await adapter.indicate_typing(_event("-100123", None))
    await adapter.indicate_typing(_event("-100123", None))
    assert route.call_count == 2


async def test_rejected_token_is_a_configuration_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="bot.platforms")
    with respx.mock(base_url=API) as router:
        router.post("/getMe").mock(return_value=error(401, "Unauthorized"))
        tg = TelegramAdapter(TOKEN, backoff_initial=0.001)
        with pytest.raises(ConfigurationError) as info:
            await tg.start(Recorder())
    assert info.value.setting == "TELEGRAM_BOT_TOKEN"
    assert TOKEN not in str(info.value)
    assert TOKEN not in caplog.text
    assert "TELEGRAM_BOT_TOKEN" in caplog.text
    assert not tg.is_connected


async def test_start_retries_getme_then_gives_up_retryable() -> None:
    with respx.mock(base_url=API) as router:
        route = router.post("/getMe").mock(side_effect=httpx.ConnectError("refused"))
        tg = TelegramAdapter(TOKEN, backoff_initial=0.001, start_attempts=3)
        with pytest.raises(PlatformError) as info:
            await tg.start(Recorder())
    assert route.call_count == 3
    assert info.value.retryable
    assert not tg.is_connected


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"token": ""}, "TELEGRAM_BOT_TOKEN"),
        ({"token": "   "}, "TELEGRAM_BOT_TOKEN"),
        ({"token": TOKEN, "webhook_url": "https://x/h"}, "TELEGRAM_WEBHOOK_SECRET"),
        (
            {"token": TOKEN, "webhook_url": "https://x/h", "webhook_secret": "has space"},
            "TELEGRAM_WEBHOOK_SECRET",
        ),
    ],
    ids=["empty-token", "blank-token", "webhook-without-secret", "bad-secret-chars"],
)
def test_configuration_errors(kwargs: dict[str, Any], setting: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        TelegramAdapter(**kwargs)
    assert info.value.setting == setting


def test_import_leaves_the_environment_alone() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PTB_TIMEDELTA"}
    probe = "import os, bot.platforms.telegram; print(os.environ.get('PTB_TIMEDELTA'))"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"


@pytest.mark.parametrize(
    ("before", "after"),
    [(None, "true"), ("1", "1"), ("false", "false")],
    ids=["unset", "explicit-on", "explicit-off"],
)
def test_adapter_opts_in_to_timedelta_durations(
    monkeypatch: pytest.MonkeyPatch, before: str | None, after: str
) -> None:
    if before is None:
        monkeypatch.delenv("PTB_TIMEDELTA", raising=False)
    else:
        monkeypatch.setenv("PTB_TIMEDELTA", before)
    TelegramAdapter(TOKEN)
    assert os.environ["PTB_TIMEDELTA"] == after


async def test_flood_control_without_an_earlier_opt_in(
    monkeypatch: pytest.MonkeyPatch, mock: respx.MockRouter
) -> None:
    monkeypatch.delenv("PTB_TIMEDELTA", raising=False)
    tg = TelegramAdapter(TOKEN, webhook_url="https://bot.example/h", webhook_secret="s3cret")
    await tg.start(Recorder())
    try:
        send_route(mock, error(429, "Too Many Requests: retry after 2", retry_after=2))
        with pytest.raises(PlatformError) as info:
            await tg.send("5", "hi")
    finally:
        await tg.stop()
    assert (info.value.retryable, info.value.retry_after, info.value.code) == (True, 2.0, 429)
