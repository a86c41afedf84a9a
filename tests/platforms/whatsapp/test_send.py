"""WhatsApp sending through pywa, with the Graph API mocked by respx."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import respx
from pywa.types.sent_update import RecipientType

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent, SessionSource
from bot.platforms.text import split_text
from bot.platforms.whatsapp import adapter as whatsapp_module
from bot.platforms.whatsapp.adapter import DEFAULT_API_VERSION, WhatsAppAdapter
from bot.platforms.whatsapp.payload import is_group_chat_id
from bot.platforms.whatsapp.templates import WINDOW_CLOSED_REASON
from tests.fakes.whatsapp_webhook import real_wamid

PHONE_ID = "106540352242922"
TOKEN = "test-token"
BASE = "https://graph.facebook.com"
MESSAGES_URL = f"{BASE}/v{DEFAULT_API_VERSION}/{PHONE_ID}/messages"
USER = "16505551234"
GROUP = "Y2FwaV9ncm91cDoxNTU1MDc4Mzg4MToxMjAzNjMwMjU0NzQxNTk4MTkZD"
BSUID = "US.13491208655302741918"
INBOUND = real_wamid(USER)
"""The user's message the bot answers or marks read."""


async def _ignore(event: MessageEvent) -> bool:
    return True


def ok(wamid: str) -> httpx.Response:
    return httpx.Response(
        200,
        json={
            "messaging_product": "whatsapp",
            "contacts": [{"input": USER, "wa_id": USER}],
            "messages": [{"id": wamid}],
        },
    )


def meta_error(
    code: int, status: int = 400, headers: dict[str, str] | None = None
) -> httpx.Response:
    return httpx.Response(
        status,
        json={
            "error": {
                "message": f"(#{code}) error",
                "type": "OAuthException",
                "code": code,
                "error_subcode": 2494010,
                "fbtrace_id": "AbCdEf123",
            }
        },
        headers=headers,
    )


def body_of(call: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(call.request.content)
    return data


@pytest.fixture
async def adapter() -> AsyncIterator[WhatsAppAdapter]:
    wa = WhatsAppAdapter(PHONE_ID, TOKEN, verify_token="vt", app_secret="secret", send_pause=0)
    await wa.start(_ignore)
    yield wa
    await wa.stop()


@pytest.fixture
def graph() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_mocked=True, assert_all_called=False) as router:
        yield router


# -- the wire format -----------------------------------------------------------------------


async def test_text_to_a_person(adapter: WhatsAppAdapter, graph: respx.MockRouter) -> None:
    wamid = real_wamid(USER)
    route = graph.post(MESSAGES_URL).mock(return_value=ok(wamid))
    result = await adapter.send(USER, "Hola")
    assert result.message_ids == [wamid]
    (call,) = route.calls
    assert call.request.headers["authorization"] == f"Bearer {TOKEN}"
    assert body_of(call) == {
        "messaging_product": "whatsapp",
        "recipient_type": "individual",
        "type": "text",
        "to": USER,
        "text": {"body": "Hola", "preview_url": False},
    }
    assert wamid in adapter._sent_ids  # a reply quoting it is to the bot


async def test_reply_quotes_the_message(adapter: WhatsAppAdapter, graph: respx.MockRouter) -> None:
    route = graph.post(MESSAGES_URL).mock(return_value=ok(real_wamid(USER)))
    await adapter.send(USER, "Claro", reply_to=INBOUND)
    assert body_of(route.calls[0])["context"] == {"message_id": INBOUND}


async def test_group_is_answered_in_the_group(
    adapter: WhatsAppAdapter, graph: respx.MockRouter
) -> None:
    route = graph.post(MESSAGES_URL).mock(return_value=ok(real_wamid(GROUP)))
    await adapter.send(GROUP, "Hola grupo", reply_to=INBOUND)
    body = body_of(route.calls[0])
    assert body["recipient_type"] == "group"
    assert body["to"] == GROUP
    assert body["context"] == {"message_id": INBOUND}


async def test_business_scoped_user_id_goes_as_recipient(
    adapter: WhatsAppAdapter, graph: respx.MockRouter
) -> None:
    route = graph.post(MESSAGES_URL).mock(return_value=ok(real_wamid(BSUID)))
    await adapter.send(BSUID, "Hola")
    body = body_of(route.calls[0])
    assert body["recipient_type"] == "individual"
    assert body["recipient"] == BSUID
    assert "to" not in body


async def test_long_text_goes_in_ordered_parts_quoting_only_the_first(
    adapter: WhatsAppAdapter, graph: respx.MockRouter
) -> None:
    answered = [real_wamid(USER) for _ in range(100)]
    counter = iter(answered)
    route = graph.post(MESSAGES_URL).mock(side_effect=lambda request: ok(next(counter)))
    paragraphs = [f"Párrafo {i}: " + "palabra " * 300 for i in range(5)]
    text = "\n\n".join(p.strip() for p in paragraphs)
    assert len(text) > 2 * 4096
    result = await adapter.send(USER, text, reply_to=INBOUND)
    bodies = [body_of(c) for c in route.calls]
    assert len(bodies) == len(split_text(text, 4096)) >= 3
    assert result.message_ids == answered[: len(bodies)]
    assert [b["text"]["body"] for b in bodies] == split_text(text, 4096)
    assert all(len(b["text"]["body"]) <= 4096 for b in bodies)
    assert bodies[0]["context"] == {"message_id": INBOUND}
    assert all("context" not in b for b in bodies[1:])
    joined = " ".join(b["text"]["body"] for b in bodies)
    assert joined.split() == text.split()
    assert all(i in adapter._sent_ids for i in result.message_ids)


async def test_parts_are_paced(
    adapter: WhatsAppAdapter, graph: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    pauses: list[float] = []

    async def fake_sleep(delay: float) -> None:
        pauses.append(delay)

    monkeypatch.setattr(whatsapp_module, "_pause", fake_sleep)
    adapter.send_pause = 0.7
    graph.post(MESSAGES_URL).mock(side_effect=[ok(real_wamid(USER)) for _ in range(3)])
    await adapter.send(USER, "\n\n".join(["x" * 4000] * 3))
    assert pauses == [0.7, 0.7]


async def test_stop_between_parts_is_ambiguous(
    adapter: WhatsAppAdapter, graph: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def stop_instead_of_sleeping(delay: float) -> None:
        await adapter.stop()

    monkeypatch.setattr(whatsapp_module, "_pause", stop_instead_of_sleeping)
    adapter.send_pause = 1.0
    route = graph.post(MESSAGES_URL).mock(return_value=ok(real_wamid(USER)))
    with pytest.raises(PlatformError) as info:
        await adapter.send(USER, "\n\n".join(["z" * 4000] * 2))
    assert info.value.ambiguous and info.value.retryable
    assert route.call_count == 1


async def test_api_base_url_is_honoured_with_pywas_version_path(graph: respx.MockRouter) -> None:
    wa = WhatsAppAdapter(
        PHONE_ID,
        TOKEN,
        verify_token="vt",
        app_secret="s",
        api_base_url="https://graph.example.test/proxy/",
        api_version="22.0",
        send_pause=0,
    )
    wamid = real_wamid(USER)
    route = graph.post(f"https://graph.example.test/proxy/v22.0/{PHONE_ID}/messages").mock(
        return_value=ok(wamid)
    )
    await wa.start(_ignore)
    try:
        assert (await wa.send(USER, "hola")).message_ids == [wamid]
    finally:
        await wa.stop()
    assert route.called


@pytest.mark.parametrize(
    ("chat_id", "group"),
    [
        (USER, False),
        ("+16505551234", False),
        ("US.13491208655302741918", False),
        ("US.ENT.11815799212886844830", False),
        (GROUP, True),
        ("Y2FwaV9ncm91cDoxNzA1NTU1MDEzOToxMjAzNjM0MDQ2OTQyMzM4MjAZD", True),
        ("120363025474159819-group", True),
    ],
    ids=["wa-id", "plus-number", "bsuid", "parent-bsuid", "group", "group-pywa-doc", "group-dash"],
)
def test_group_rule_agrees_with_pywa(chat_id: str, group: bool) -> None:
    assert is_group_chat_id(chat_id) is group
    assert (RecipientType.from_recipient(chat_id) is RecipientType.GROUP_ID) is group


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "retryable"),
    [
        (130429, 400, True),
        (131056, 400, True),
        (4, 400, True),
        (80007, 400, True),
        (131048, 400, True),
        (131000, 500, True),
        (131047, 400, False),
        (131026, 400, False),
        (190, 401, False),
        (100, 400, False),
        (131051, 400, False),
    ],
    ids=[
        "130429-throughput",
        "131056-pair-rate",
        "4-api-calls",
        "80007-waba-rate",
        "131048-spam-rate",
        "131000-server",
        "131047-24h-window",
        "131026-undeliverable",
        "190-auth",
        "100-invalid-param",
        "131051-unsupported",
    ],
)
async def test_meta_errors_are_mapped(
    adapter: WhatsAppAdapter, graph: respx.MockRouter, code: int, status: int, retryable: bool
) -> None:
    graph.post(MESSAGES_URL).mock(return_value=meta_error(code, status))
    with pytest.raises(PlatformError) as info:
        await adapter.send(USER, "hola")
    error = info.value
    assert error.platform == "whatsapp"
    assert error.code == code
    assert error.retryable is retryable
    assert error.ambiguous is False
    # A throughput refusal names no Retry-After: the number's 1-s window is the wait.
    assert error.retry_after == (1.0 if code == 130429 else None)
    if code == 131047:  # no template configured: the reason says what to set
        assert str(error) == WINDOW_CLOSED_REASON
    else:
        assert str(code) in str(error)
    assert isinstance(error.__cause__, Exception)


async def test_retry_after_header_is_used(
    adapter: WhatsAppAdapter, graph: respx.MockRouter
) -> None:
    graph.post(MESSAGES_URL).mock(
        return_value=meta_error(130429, 429, headers={"Retry-After": "30"})
    )
    with pytest.raises(PlatformError) as info:
        await adapter.send(USER, "hola")
    assert info.value.retryable
    assert info.value.retry_after == 30.0


async def test_24h_window_error_says_so(adapter: WhatsAppAdapter, graph: respx.MockRouter) -> None:
    graph.post(MESSAGES_URL).mock(return_value=meta_error(131047))
    with pytest.raises(PlatformError, match="24-hour"):
        await adapter.send(USER, "hola")


async def test_later_part_failing_is_ambiguous(
    adapter: WhatsAppAdapter, graph: respx.MockRouter
) -> None:
    first = real_wamid(USER)
    graph.post(MESSAGES_URL).mock(side_effect=[ok(first), meta_error(131056)])
    with pytest.raises(PlatformError) as info:
        await adapter.send(USER, "\n\n".join(["y" * 4000] * 2))
    assert info.value.ambiguous
    assert info.value.retryable
    assert first in adapter._sent_ids


@pytest.mark.parametrize(
    ("exc", "ambiguous"),
    [
        (httpx.ConnectError("refused"), False),
        (httpx.ConnectTimeout("slow connect"), False),
        (httpx.ReadTimeout("slow answer"), True),
        (httpx.RemoteProtocolError("dropped"), True),
    ],
    ids=["connect-error", "connect-timeout", "read-timeout", "dropped-connection"],
)
async def test_transport_errors(
    adapter: WhatsAppAdapter, graph: respx.MockRouter, exc: Exception, ambiguous: bool
) -> None:
    graph.post(MESSAGES_URL).mock(side_effect=exc)
    with pytest.raises(PlatformError) as info:
        await adapter.send(USER, "hola")
    assert info.value.retryable
    assert info.value.ambiguous is ambiguous
    assert info.value.code is None


async def test_send_before_start_is_retryable() -> None:
    wa = WhatsAppAdapter(PHONE_ID, TOKEN, verify_token="vt", app_secret="s")
    with pytest.raises(PlatformError) as info:
        await wa.send(USER, "hola")
    assert info.value.retryable


@pytest.mark.parametrize("text", ["", "   \n "], ids=["empty", "blank"])
async def test_blank_text_is_refused_without_a_request(
    adapter: WhatsAppAdapter, graph: respx.MockRouter, text: str
) -> None:
    route = graph.post(MESSAGES_URL).mock(return_value=ok(real_wamid(USER)))
    with pytest.raises(PlatformError) as info:
        await adapter.send(USER, text)
    assert not info.value.retryable
    assert not route.called


async def test_send_after_stop_fails(adapter: WhatsAppAdapter) -> None:
    await adapter.stop()
    with pytest.raises(PlatformError):
        await adapter.send(USER, "hola")


# -- typing --------------------------------------------------------------------------------


def _event(wamid: str = INBOUND) -> MessageEvent:
    return MessageEvent(
        platform="whatsapp",
        message_id=wamid,
        platform_message_id=wamid,
        source=SessionSource(platform="whatsapp", chat_id=USER, chat_type="dm", sender_id=USER),
        text="hola",
    )


async def test_typing_marks_read_once_per_event(
    adapter: WhatsAppAdapter, graph: respx.MockRouter
) -> None:
    route = graph.post(MESSAGES_URL).mock(return_value=httpx.Response(200, json={"success": True}))
    event = _event()
    await adapter.indicate_typing(event)
    await adapter.indicate_typing(event)
    other = real_wamid(USER)
    await adapter.indicate_typing(_event(other))
    bodies = [body_of(c) for c in route.calls]
    assert bodies[0] == {
        "messaging_product": "whatsapp",
        "status": "read",
        "message_id": INBOUND,
        "typing_indicator": {"type": "text"},
    }
    assert [b["message_id"] for b in bodies] == [INBOUND, other]


async def test_typing_is_shown_again_while_a_long_turn_runs(
    adapter: WhatsAppAdapter, graph: respx.MockRouter
) -> None:
    route = graph.post(MESSAGES_URL).mock(return_value=httpx.Response(200, json={"success": True}))
    now = [100.0]
    adapter._clock = lambda: now[0]
    event = _event()
    for step in (0.0, 4.0, 4.0, 4.0, 4.0, 4.0):  # the gateway's 4 s typing loop
        now[0] += step
        await adapter.indicate_typing(event)
    # WhatsApp's indicator lasts 25 s: shown at 100 s, again in the next 20 s window.
    assert len(route.calls) == 2


@pytest.mark.parametrize(
    "response",
    [meta_error(100), httpx.ConnectError("down")],
    ids=["meta-error", "network-error"],
)
async def test_typing_errors_are_swallowed(
    adapter: WhatsAppAdapter, graph: respx.MockRouter, response: Any
) -> None:
    route = graph.post(MESSAGES_URL)
    if isinstance(response, Exception):
        route.mock(side_effect=response)
    else:
        route.mock(return_value=response)
    await adapter.indicate_typing(_event())
    assert route.called


async def test_typing_before_start_does_nothing(graph: respx.MockRouter) -> None:
    route = graph.post(MESSAGES_URL)
    wa = WhatsAppAdapter(PHONE_ID, TOKEN, verify_token="vt", app_secret="s")
    await wa.indicate_typing(_event())
    assert not route.called
