"""Mapping Telegram updates (tests/data/telegram/*.json) to MessageEvents."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from telegram import Update

from bot.platforms.telegram.mapping import map_update
from bot.platforms.text import utf16_len

DATA = Path(__file__).resolve().parents[2] / "data" / "telegram"
BOT_ID = 5000000001
BOT_USERNAME = "chatflow_test_bot"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


def mapped(name: str, **kwargs: Any) -> Any:
    return map_update(load(name), bot_id=BOT_ID, bot_username=BOT_USERNAME, **kwargs)


IGNORED = [
    "group_command_other_bot",
    "edited_message",
    "from_bot",
    "service_new_chat_members",
    "channel_post",
    "automatic_forward",
]


@pytest.mark.parametrize("name", IGNORED, ids=IGNORED)
def test_ignored_updates(name: str) -> None:
    assert mapped(name) is None


# name -> expected attributes; "source.x" reads event.source.x
EXPECTED: dict[str, dict[str, Any]] = {
    "private_text": {
        "message_id": "telegram:111111111:10",
        "platform_message_id": "10",
        "source.chat_type": "dm",
        "source.chat_id": "111111111",
        "source.sender_id": "111111111",
        "source.thread_id": None,
        "source.sender_name": "Alice Liddell",
        "text": "Hola, ¿qué tal? 👋",
        "mentions_bot": False,
        "replies_to_bot": False,
        "command": None,
        "media_kind": None,
    },
    "group_mention": {
        "message_id": "telegram:-1001234567890:20",
        "source.chat_type": "group",
        "source.chat_name": "Chatflow users",
        "mentions_bot": True,
        "text": "🙂 what's the weather?",
    },
    "group_mention_other_case": {"mentions_bot": True, "text": "summarise this"},
    "group_email_not_mention": {
        "mentions_bot": False,
        "text": "mail admin@chatflow_test_bot.com please",
    },
    "group_mention_other_bot": {"mentions_bot": False, "text": "ask @other_bot instead"},
    "group_text_mention": {"mentions_bot": True, "text": "Chatflow can you help?"},
    "group_reply_to_bot": {
        "replies_to_bot": True,
        "reply_to_id": "19",
        "mentions_bot": False,
        "text": "and tomorrow?",
    },
    "group_plain": {
        "source.chat_type": "group",
        "source.chat_id": "-4012345678",
        "mentions_bot": False,
        "replies_to_bot": False,
        "command": None,
    },
    "group_command_this_bot": {"command": "start", "text": "/start now", "mentions_bot": False},
    "group_command_bare": {"command": "help", "text": "/help"},
    "private_command": {"command": "reset", "source.chat_type": "dm"},
    "forum_topic_message": {
        "source.thread_id": "42",
        "mentions_bot": True,
        # the topic was created by the bot, but that is no reply to the bot
        "replies_to_bot": False,
        "reply_to_id": None,
        "text": "how do refunds work?",
    },
    "forum_topic_message_other": {"source.thread_id": "77", "mentions_bot": True},
    "forum_general_topic": {"source.thread_id": "1", "mentions_bot": True},
    "forum_topic_reply_to_bot": {
        "source.thread_id": "42",
        "replies_to_bot": True,
        "reply_to_id": "49",
    },
    "reply_chain_non_forum": {
        "source.thread_id": None,
        "reply_to_id": "59",
        "replies_to_bot": False,
        "mentions_bot": True,
        "text": "agreed?",
    },
    "photo_caption": {"media_kind": "photo", "text": "What is this bird?"},
    "sticker": {"media_kind": "sticker", "text": ""},
    "voice": {"media_kind": "voice", "text": ""},
    "anonymous_admin": {
        "source.sender_id": "-1001234567890",
        "source.sender_name": "Chatflow users",
        "mentions_bot": True,
        "text": "please pin the rules",
    },
    "migrate_to_chat_id": {
        "message_id": "telegram:-4012345678:32",
        "source.chat_id": "-1004012345678",
        "source.chat_type": "group",
        "migrate_from_chat_id": "-4012345678",
        "text": "",
    },
    "migrate_from_chat_id": {
        "message_id": "telegram:-1004012345678:1",
        "source.chat_id": "-1004012345678",
        "migrate_from_chat_id": "-4012345678",
        "text": "",
    },
}


def _attr(event: Any, path: str) -> Any:
    for part in path.split("."):
        event = getattr(event, part)
    return event


@pytest.mark.parametrize("name", list(EXPECTED), ids=list(EXPECTED))
def test_mapped_events(name: str) -> None:
    event = mapped(name)
    assert event is not None
    assert event.platform == "telegram"
    for path, value in EXPECTED[name].items():
        assert _attr(event, path) == value, path
    assert event.timestamp == datetime(2025, 1, 1, tzinfo=UTC)
    assert event.raw == load(name)


@pytest.mark.parametrize(
    ("name", "addressed"),
    [
        ("group_plain", False),
        ("group_email_not_mention", False),
        ("group_mention_other_bot", False),
        ("group_mention", True),
        ("group_reply_to_bot", True),
        ("group_command_this_bot", True),
        ("group_command_bare", True),
        ("group_text_mention", True),
    ],
    ids=lambda v: str(v),
)
def test_group_addressing(name: str, addressed: bool) -> None:
    event = mapped(name)
    assert event is not None
    assert event.addressed is addressed


def test_channel_post_with_channels_allowed() -> None:
    event = mapped("channel_post", allow_channels=True)
    assert event is not None
    assert event.source.chat_type == "channel"
    assert event.source.sender_id == "-1005555555555"
    assert event.text == "New release: Chatflow 0.1"


def test_update_object_and_dict_map_alike() -> None:
    raw = load("forum_topic_message")
    from_dict = map_update(raw, bot_id=BOT_ID, bot_username=BOT_USERNAME)
    from_update = map_update(Update.de_json(raw, None), bot_id=BOT_ID, bot_username=BOT_USERNAME)
    assert from_dict == from_update


def test_bot_username_change_changes_mentions() -> None:
    event = map_update(load("group_mention"), bot_id=BOT_ID, bot_username="someone_else_bot")
    assert event is not None
    assert not event.mentions_bot
    assert "@chatflow_test_bot" in event.text


def test_command_for_other_bot_is_kept_when_it_is_us() -> None:
    raw = load("group_command_other_bot")
    event = map_update(raw, bot_id=6000000002, bot_username="Other_Bot")
    assert event is not None
    assert event.command == "start"
    assert event.text == "/start"


def _message_with_mention(prefix: str, suffix: str) -> dict[str, Any]:
    mention = "@" + BOT_USERNAME
    return {
        "update_id": 1,
        "message": {
            "message_id": 5,
            "date": 1735689600,
            "chat": {"id": -100777, "type": "supergroup", "title": "G"},
            "from": {"id": 42, "is_bot": False, "first_name": "U"},
            "text": prefix + mention + suffix,
            "entities": [
                {"type": "mention", "offset": utf16_len(prefix), "length": utf16_len(mention)}
            ],
        },
    }


def _squeeze(text: str) -> str:
    return "".join(ch for ch in text if not ch.isspace())


_PIECES = st.lists(
    st.sampled_from(["a", "b", " ", "\n", ",", ":", "😀", "👍🏽", "漢", "ש", "é", "\u200d"]),
    max_size=12,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(prefix=_PIECES, suffix=_PIECES)
def test_own_mention_is_removed_wherever_it_is(prefix: str, suffix: str) -> None:
    event = map_update(
        _message_with_mention(prefix, suffix), bot_id=BOT_ID, bot_username=BOT_USERNAME
    )
    assert event is not None
    assert event.mentions_bot
    assert "@" not in event.text
    assert event.text == event.text.strip()
    # A leading mention takes the "," or ":" after it along ("@bot, hi" -> "hi").
    rest = suffix.lstrip(" \t,:;") if not prefix.strip() else suffix
    assert _squeeze(event.text) == _squeeze(prefix) + _squeeze(rest)


def test_two_mentions_both_removed() -> None:
    text = "@chatflow_test_bot hi @chatflow_test_bot bye"
    raw = _message_with_mention("", " hi @chatflow_test_bot bye")
    raw["message"]["entities"].append({"type": "mention", "offset": 22, "length": 18})
    assert raw["message"]["text"] == text
    event = map_update(raw, bot_id=BOT_ID, bot_username=BOT_USERNAME)
    assert event is not None
    assert event.text == "hi bye"
