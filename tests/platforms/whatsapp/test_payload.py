"""WhatsApp webhook payloads as events: ``parse_webhook`` on its own, without the route."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.platforms.whatsapp.adapter import WEBHOOK_PATH
from bot.platforms.whatsapp.payload import parse_webhook
from tests.fakes.whatsapp_webhook import (
    BUSINESS_NUMBER,
    PHONE_NUMBER_ID,
    USER_WA_ID,
    WebhookSender,
    real_wamid,
)

APP_SECRET = "app-secret-for-tests"
URL = f"http://bot.test{WEBHOOK_PATH}"
"""Unused for posting: ``WebhookSender`` only builds the payloads here."""


def test_reply_quoting_a_sent_wamid_is_a_reply_to_the_bot() -> None:
    sender = WebhookSender(URL, APP_SECRET)
    ours = real_wamid(USER_WA_ID)
    payload = sender.text("sí", context={"from": "34600000000", "id": ours})
    (plain,) = parse_webhook(payload, phone_id=PHONE_NUMBER_ID).events
    (known,) = parse_webhook(payload, phone_id=PHONE_NUMBER_ID, sent_ids={ours}).events
    assert not plain.replies_to_bot
    assert known.replies_to_bot


def test_reply_to_someone_else_is_not_a_reply_to_the_bot() -> None:
    sender = WebhookSender(URL, APP_SECRET)
    theirs = real_wamid("447700900999")
    payload = sender.group_text("+1", context={"from": "447700900999", "id": theirs})
    sent_ids = {real_wamid(USER_WA_ID)}
    (event,) = parse_webhook(payload, phone_id=PHONE_NUMBER_ID, sent_ids=sent_ids).events
    assert not event.replies_to_bot


@pytest.mark.parametrize(
    ("text", "mentioned", "stripped"),
    [
        (f"@{BUSINESS_NUMBER} hola", True, "hola"),
        (f"hola @{BUSINESS_NUMBER}, ¿qué tal?", True, "hola , ¿qué tal?"),
        (f"@+{BUSINESS_NUMBER} hola", True, "hola"),
        (f"@{BUSINESS_NUMBER}0 hola", False, None),
        (f"mail me at x@{BUSINESS_NUMBER}", False, None),
        (f"{BUSINESS_NUMBER} hola", False, None),
        ("@447700900123 hola", False, None),
    ],
    ids=["leading", "inside", "plus", "longer-number", "email-like", "no-at", "other-number"],
)
def test_mention_of_the_business_number(text: str, mentioned: bool, stripped: str | None) -> None:
    sender = WebhookSender(URL, APP_SECRET)
    (event,) = parse_webhook(sender.group_text(text), phone_id=PHONE_NUMBER_ID).events
    assert event.mentions_bot is mentioned
    assert event.text == (stripped if stripped is not None else text)


@pytest.mark.parametrize(
    ("text", "group", "command"),
    [
        ("/reset", False, "reset"),
        ("/Start ahora", False, "start"),
        ("/reset", True, None),
        (f"@{BUSINESS_NUMBER} /reset", True, "reset"),
        ("a /reset", False, None),
    ],
    ids=["dm", "dm-with-args", "group-bare", "group-mentioned", "not-leading"],
)
def test_commands(text: str, group: bool, command: str | None) -> None:
    sender = WebhookSender(URL, APP_SECRET)
    payload = sender.group_text(text) if group else sender.text(text)
    (event,) = parse_webhook(payload, phone_id=PHONE_NUMBER_ID).events
    assert event.command == command


@pytest.mark.parametrize(
    ("typ", "content", "text"),
    [
        ("button", {"text": "Sí, confirmar", "payload": "YES"}, "Sí, confirmar"),
        (
            "interactive",
            {"type": "button_reply", "button_reply": {"id": "1", "title": "Ver menú"}},
            "Ver menú",
        ),
        (
            "interactive",
            {"type": "list_reply", "list_reply": {"id": "2", "title": "Martes"}},
            "Martes",
        ),
    ],
    ids=["template-button", "button-reply", "list-reply"],
)
def test_button_taps_are_text(typ: str, content: dict[str, Any], text: str) -> None:
    sender = WebhookSender(URL, APP_SECRET)
    (event,) = parse_webhook(
        sender.single(sender.message(typ, content)), phone_id=PHONE_NUMBER_ID
    ).events
    assert event.text == text
    assert event.media_kind is None


def test_malformed_messages_are_skipped_not_raised() -> None:
    sender = WebhookSender(URL, APP_SECRET)
    good = sender.message("text", {"body": "ok"})
    no_id = sender.message("text", {"body": "x"})
    del no_id["id"]
    no_body = sender.message("text", {})
    payload = sender.envelope([[sender.value([no_id, no_body, good])]])
    payload["entry"][0]["changes"][0]["value"]["messages"].append("junk")
    batch = parse_webhook(payload, phone_id=PHONE_NUMBER_ID)
    assert [e.text for e in batch.events] == ["ok"]
    assert batch.ignored == 2


def test_bad_timestamp_falls_back_to_now() -> None:
    sender = WebhookSender(URL, APP_SECRET)
    payload = sender.text("hola")
    payload["entry"][0]["changes"][0]["value"]["messages"][0]["timestamp"] = "soon"
    before = datetime.now(UTC)
    (event,) = parse_webhook(payload, phone_id=PHONE_NUMBER_ID).events
    assert event.timestamp >= before


# -- invariants ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "entry",
                    "changes",
                    "value",
                    "messages",
                    "statuses",
                    "metadata",
                    "contacts",
                    "id",
                    "from",
                    "type",
                    "text",
                    "body",
                    "phone_number_id",
                    "field",
                    "context",
                    "group_id",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(payload=st.dictionaries(st.sampled_from(["object", "entry"]), json_values, max_size=2))
def test_parsing_never_raises_on_arbitrary_json(payload: dict[str, Any]) -> None:
    batch = parse_webhook(payload, phone_id=PHONE_NUMBER_ID)
    assert all(e.message_id for e in batch.events)


def _layout() -> st.SearchStrategy[list[list[list[str]]]]:
    body = st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != "")
    return st.lists(
        st.lists(st.lists(body, max_size=4), min_size=1, max_size=3), min_size=1, max_size=3
    )


@settings(max_examples=100, deadline=None)
@given(layout=_layout())
def test_every_message_of_any_batch_becomes_one_event(layout: list[list[list[str]]]) -> None:
    sender = WebhookSender(URL, APP_SECRET)
    payload = sender.batched(layout)
    expected = [
        m["id"]
        for e in payload["entry"]
        for c in e["changes"]
        for m in c["value"].get("messages", [])
    ]
    batch = parse_webhook(payload, phone_id=PHONE_NUMBER_ID)
    assert [e.message_id for e in batch.events] == expected
