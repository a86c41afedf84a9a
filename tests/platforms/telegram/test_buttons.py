"""Telegram buttons: the recorded ``callback_query`` mapped, inline keyboards checked by the
fake Bot API, callback answers and keyboard removal, labels never read as markup."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from telegram import InlineKeyboardButton, InlineKeyboardMarkup

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent, OutgoingButton, SessionSource
from bot.gateway.ledger.keyboards import new_token
from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.telegram.buttons import MAX_CALLBACK_BYTES, escape_markup, inline_keyboard
from bot.platforms.telegram.mapping import map_update
from tests.fakes.telegram_server import FakeTelegramServer, check_entities

DATA = Path(__file__).resolve().parents[2] / "data" / "telegram"
BOT_ID = 5000000001


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


def test_the_recorded_callback_query_maps_to_a_tap() -> None:
    event = map_update(load("callback_query"), bot_id=BOT_ID, bot_username="chatflow_test_bot")
    assert event is not None
    assert event.message_id == "telegram:callback:4382bfdwdsb323b2d9"
    assert (event.tap_token, event.callback_id, event.keyboard_message_id) == (
        "more",
        "4382bfdwdsb323b2d9",
        "35",
    )
    assert event.text == "" and event.button is None
    source = event.source
    assert (source.chat_id, source.chat_type, source.sender_id) == ("111111111", "dm", "111111111")
    assert source.sender_name == "Alice Liddell"


def test_a_callback_without_data_or_message_is_ignored() -> None:
    update = load("callback_query")
    del update["callback_query"]["data"]
    assert map_update(update, bot_id=BOT_ID, bot_username="b") is None
    update = load("callback_query")
    del update["callback_query"]["message"]
    update["callback_query"]["inline_message_id"] = "AAA"
    assert map_update(update, bot_id=BOT_ID, bot_username="b") is None


_LABELS = st.text(min_size=1, max_size=60).filter(lambda s: s.strip() != "")


@settings(max_examples=200, deadline=None)
@given(st.lists(_LABELS, min_size=1, max_size=10))
def test_keyboards_carry_tokens_of_at_most_64_bytes_and_labels_as_typed(labels: list[str]) -> None:
    buttons = [OutgoingButton(new_token(), label) for label in labels]
    markup = inline_keyboard(buttons).to_dict()
    rows = markup["inline_keyboard"]
    assert [row[0]["text"] for row in rows] == labels  # never escaped, never parsed
    for row, button in zip(rows, buttons, strict=True):
        data = row[0]["callback_data"]
        assert data == button.token and 1 <= len(data.encode()) <= MAX_CALLBACK_BYTES


def test_a_token_too_long_for_callback_data_is_refused() -> None:
    with pytest.raises(PlatformError):
        inline_keyboard([OutgoingButton("é" * 33, "x")])


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_escaped_labels_parse_as_plain_text(label: str) -> None:
    for mode in ("HTML", "MarkdownV2", "Markdown"):
        escaped = escape_markup(label, mode)
        assert check_entities(escaped, mode) is None, (mode, escaped)
    assert "<" not in escape_markup(label, "HTML")
    assert escape_markup(label, None) == label


def tap_event(chat_id: str, *, keyboard: str | None, callback: str | None) -> MessageEvent:
    return MessageEvent(
        platform="telegram",
        message_id=f"telegram:callback:{callback}",
        source=SessionSource("telegram", chat_id, "dm", chat_id),
        text="",
        tap_token="t",
        callback_id=callback,
        keyboard_message_id=keyboard,
    )


async def test_the_keyboard_goes_on_the_last_part_only(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    adapter, server = telegram_on_fake
    buttons = [OutgoingButton("tok-1", "<b>Yes</b>"), OutgoingButton("tok-2", "*No*")]
    long_text = "word " * 1000  # two parts
    result = await adapter.send_with_buttons("42", long_text, buttons)
    assert len(result.message_ids) == 2
    sends = [r.params for r in server.requests if r.method == "sendMessage"]
    assert "reply_markup" not in sends[0]
    rows = sends[1]["reply_markup"]["inline_keyboard"]
    assert [(r[0]["text"], r[0]["callback_data"]) for r in rows] == [
        ("<b>Yes</b>", "tok-1"),
        ("*No*", "tok-2"),
    ]
    assert server.buttons.keyboards[("42", int(result.message_ids[1]))] == rows


async def test_answer_and_removal_against_the_fake(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
    caplog: pytest.LogCaptureFixture,
) -> None:
    adapter, server = telegram_on_fake
    sent = await adapter.send_with_buttons("42", "Pick", [OutgoingButton("tok-1", "Yes")])
    message_id = int(sent.message_ids[0])
    query = server.buttons.push_callback(42, message_id, "tok-1")
    event = tap_event("42", keyboard=str(message_id), callback=query)
    await adapter.answer_tap(event, "This choice has expired.")
    await adapter.remove_keyboard(event)
    assert server.buttons.answers == [
        {"callback_query_id": query, "text": "This choice has expired."}
    ]
    assert server.buttons.keyboards[("42", message_id)] == []
    # Telegram answers a query once and edits a removed keyboard no more: both are
    # best effort, logged without the ids.
    with caplog.at_level(logging.DEBUG):
        await adapter.answer_tap(event, None)
        await adapter.remove_keyboard(event)
    assert len(server.buttons.answers) == 1
    ours = [r for r in caplog.records if r.name.startswith("bot.")]
    assert len(ours) == 2 and all(
        query not in r.getMessage() and str(message_id) not in r.getMessage() for r in ours
    )


async def test_the_fake_refuses_callback_data_over_64_bytes(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    adapter, _ = telegram_on_fake

    markup = InlineKeyboardMarkup([[InlineKeyboardButton("x", callback_data="a" * 65)]])
    with pytest.raises(PlatformError) as caught:
        await adapter.send("42", "Pick", reply_markup=markup)
    assert "button_data_invalid" in str(caught.value).lower()


async def test_polling_asks_for_callback_queries(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    _, server = telegram_on_fake
    await server.wait_for_request("getUpdates", 1)
    assert server.allowed_updates is not None and "callback_query" in server.allowed_updates
