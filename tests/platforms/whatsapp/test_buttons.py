"""WhatsApp buttons: the recorded ``button_reply`` / ``list_reply`` webhooks parsed as taps,
reply buttons or a list message checked by the fake Graph API, long bodies, titles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.gateway.contract import MessageEvent, OutgoingButton, SendResult, SessionSource
from bot.gateway.ledger.keyboards import new_token
from bot.platforms.whatsapp.adapter import WhatsAppAdapter
from bot.platforms.whatsapp.buttons import MAX_BUTTON_TITLE, MAX_ROW_TITLE, titles
from bot.platforms.whatsapp.payload import parse_webhook
from bot.platforms.whatsapp.templates import ReplyTemplate
from tests.fakes.whatsapp_server import FakeWhatsAppServer

DATA = Path(__file__).resolve().parents[2] / "data" / "whatsapp"


def recorded(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("name", ["button_reply", "list_reply"])
def test_the_recorded_taps_parse_with_their_token(name: str) -> None:
    payload = recorded(name)
    phone_id = payload["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"]
    (event,) = parse_webhook(payload, phone_id=phone_id).events
    assert event.tap_token == "callback_data"  # the reply id: our token
    assert event.keyboard_message_id == "wamid.xyzxyz"  # the message that carried it
    assert event.text == "title" and event.button is None
    assert event.source.sender_id == "972987654321"


def test_a_text_message_is_no_tap() -> None:
    payload = recorded("button_reply")
    message = payload["entry"][0]["changes"][0]["value"]["messages"][0]
    message.update(type="text", text={"body": "hi"})
    del message["interactive"]
    phone_id = payload["entry"][0]["changes"][0]["value"]["metadata"]["phone_number_id"]
    (event,) = parse_webhook(payload, phone_id=phone_id).events
    assert event.tap_token is None and event.keyboard_message_id is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=60).filter(str.strip), min_size=1, max_size=10))
def test_titles_fit_and_are_unique(labels: list[str]) -> None:
    for limit in (MAX_BUTTON_TITLE, MAX_ROW_TITLE):
        made = titles(labels, limit)
        assert len(made) == len(labels) and len(set(made)) == len(made)
        assert all(1 <= len(t) <= limit for t in made)


def buttons(*labels: str) -> list[OutgoingButton]:
    return [OutgoingButton(new_token(), label) for label in labels]


async def test_three_choices_are_reply_buttons(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    offered = buttons("Yes, go ahead with the refund", "No", "Yes, go ahead with the exchange")
    result = await adapter.send_with_buttons("34600000001", "Refund or exchange?", offered)
    (sent,) = graph.sent
    interactive = sent.json["interactive"]
    assert interactive["type"] == "button"
    replies = [b["reply"] for b in interactive["action"]["buttons"]]
    assert [r["id"] for r in replies] == [b.token for b in offered]
    assert [r["title"] for r in replies] == ["Yes, go ahead with…", "No", "Yes, go ahead w… (2)"]
    assert result.message_ids == graph.sent_wamids


async def test_five_choices_are_a_list_and_a_long_text_goes_first(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    offered = buttons("A", "B", "C", "D", "A very long flavour name, really long")
    text = "x" * 1500
    result = await adapter.send_with_buttons("34600000001", text, offered)
    first, second = graph.sent
    assert first.json["type"] == "text"
    interactive = second.json["interactive"]
    assert interactive["type"] == "list" and len(interactive["body"]["text"]) <= 1024
    rows = interactive["action"]["sections"][0]["rows"]
    assert [r["id"] for r in rows] == [b.token for b in offered]
    assert rows[4]["description"] == "A very long flavour name, really long"
    assert len(result.message_ids) == 2


async def test_a_closed_window_lists_the_choices_in_the_text(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    texts: list[str] = []

    async def closed(chat_id: str) -> bool:
        return True

    async def send(chat_id: str, text: str, **kwargs: object) -> SendResult:
        texts.append(text)  # where the template path takes over
        return SendResult(["wamid.t"])

    adapter._window_closed = closed  # type: ignore[method-assign]
    adapter.send = send  # type: ignore[method-assign]
    result = await adapter.send_with_buttons("34600000001", "Pick", buttons("A", "B"))
    assert texts == ["Pick\n\n1. A\n2. B"] and result.message_ids == ["wamid.t"]
    assert graph.sent == []


async def test_a_refused_tap_is_told_in_a_short_text(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    event = MessageEvent(
        platform="whatsapp",
        message_id="wamid.x",
        source=SessionSource("whatsapp", "34600000001", "dm", "34600000001"),
        text="title",
        tap_token="t",
    )
    await adapter.answer_tap(event, None)
    assert graph.sent == []
    await adapter.answer_tap(event, "This choice has expired.")
    (sent,) = graph.sent
    assert sent.json["text"]["body"] == "This choice has expired."


async def test_a_refused_tap_outside_the_window_sends_nothing_and_never_a_template(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    adapter.template = ReplyTemplate.configured("order_update", "en_US")
    event = MessageEvent(
        platform="whatsapp",
        message_id="wamid.x",
        source=SessionSource("whatsapp", "34600000001", "dm", "34600000001"),
        text="title",
        tap_token="t",
    )
    # Meta's clock says closed (131047): the notice is dropped, not sent as the template.
    graph.close_window("34600000001")
    await adapter.answer_tap(event, "This choice has expired.")
    assert graph.sent == [] and graph.templates == []

    # Our own record says closed: nothing is even tried.
    async def closed(chat_id: str) -> bool:
        return True

    graph.closed_windows.clear()
    adapter._window_closed = closed  # type: ignore[method-assign]
    before = len(graph.requests)
    await adapter.answer_tap(event, "This choice has expired.")
    assert graph.sent == [] and graph.templates == [] and len(graph.requests) == before
