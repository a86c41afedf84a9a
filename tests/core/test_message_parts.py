"""Message parts (images, audio, documents, locations, contacts) through every store."""

from __future__ import annotations

import asyncio
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.core.agent import Agent
from bot.core.messages import (
    AudioPart,
    ContactPart,
    DocumentPart,
    ImagePart,
    LocationPart,
    Message,
    MessagePart,
    Role,
    TextPart,
)
from bot.core.stores.base import BaseSessionStore, TransactionalStore
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore

AGENT = Agent(name="Support", instructions="Help.")

_text = st.text(st.characters(codec="utf-8"), max_size=40)
_sha = st.text("0123456789abcdef", min_size=64, max_size=64)
_stored = {
    "sha256": _sha,
    "mime_type": st.sampled_from(["image/jpeg", "audio/ogg", "application/pdf", "text/plain"]),
    "size": st.integers(0, 20 * 1024 * 1024),
    "file_name": st.none() | _text,
}
_coordinate = st.floats(-90, 90, allow_nan=False)
PARTS: st.SearchStrategy[MessagePart] = st.one_of(
    st.builds(TextPart, text=_text),
    st.builds(ImagePart, **_stored),
    st.builds(AudioPart, **_stored, voice=st.booleans(), transcript=st.none() | _text),
    st.builds(DocumentPart, **_stored, text=st.none() | _text, truncated=st.booleans()),
    st.builds(
        LocationPart,
        latitude=_coordinate,
        longitude=_coordinate,
        name=st.none() | _text,
        address=st.none() | _text,
    ),
    st.builds(ContactPart, name=_text, phones=st.lists(_text, max_size=3)),
)
USER_MESSAGES = st.builds(
    Message,
    role=st.just(Role.USER),
    content=st.none() | _text,
    parts=st.lists(PARTS, max_size=4),
)


def _stores() -> list[BaseSessionStore]:
    return [SessionStore(default_max_turns=3), SQLiteSessionStore(":memory:", default_max_turns=3)]


async def _round_trip(store: BaseSessionStore, messages: list[Message]) -> None:
    try:
        store.set_agent_resolver({AGENT.name: AGENT}.get)
        session = await store.get_or_create("s-1", AGENT)
        for message in messages:
            session.add_message(message)
            session.add_message(Message(role=Role.MODEL, content="ok", agent=AGENT.name))
        expected = session.history
        await store.save(session)
        loaded = await store.get("s-1")
        assert loaded is not None
        assert loaded.history == expected  # pruned to the last 3 turns, parts and all

        checkpoint = loaded.checkpoint()
        loaded.add_message(messages[0])
        loaded.rollback_to(checkpoint)
        assert loaded.history == expected
        await store.save(loaded)
        again = await store.get("s-1")
        assert again is not None and again.history == expected
    finally:
        await store.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(USER_MESSAGES, min_size=1, max_size=5))
def test_parts_round_trip_through_the_stores_pruning_and_rollback(
    messages: list[Message],
) -> None:
    for store in _stores():
        asyncio.run(_round_trip(store, messages))


def test_a_part_survives_json_as_its_own_kind() -> None:
    message = Message(
        role=Role.USER,
        content="look",
        parts=[ImagePart(sha256="a" * 64, mime_type="image/jpeg", size=3, file_name="x.jpg")],
    )
    again = Message.model_validate_json(message.model_dump_json())
    assert again == message
    assert isinstance(again.parts[0], ImagePart)


async def test_a_row_in_the_format_before_parts_still_loads(store: BaseSessionStore) -> None:
    if not isinstance(store, TransactionalStore):
        return  # the in-memory store keeps Message objects, not rows
    store.set_agent_resolver({AGENT.name: AGENT}.get)
    session = await store.get_or_create("s-old", AGENT)
    session.add_message(Message(role=Role.USER, content="placeholder"))
    await store.save(session)
    # The exact shape rows had before parts existed (no "parts" key).
    old_row = json.dumps(
        {
            "role": "user",
            "content": "where is my order?",
            "tool_calls": [],
            "tool_call_id": None,
            "name": None,
            "agent": None,
            "id": "0123456789abcdef0123456789abcdef",
            "created_at": "2026-01-05T10:00:00Z",
        }
    )
    async with store.transaction() as tx:
        await tx.execute(
            "UPDATE chatflow_messages SET message_json = ? WHERE session_id = ?",
            (old_row, "s-old"),
        )
    loaded = await store.get("s-old")
    assert loaded is not None
    (message,) = loaded.history
    assert message.content == "where is my order?"
    assert message.parts == []


async def test_every_part_kind_round_trips_through_this_store(store: BaseSessionStore) -> None:
    store.set_agent_resolver({AGENT.name: AGENT}.get)
    parts: list[MessagePart] = [
        TextPart(text="also"),
        ImagePart(sha256="a" * 64, mime_type="image/jpeg", size=34_000, file_name="é.jpg"),
        AudioPart(sha256="b" * 64, mime_type="audio/ogg", size=9000, voice=True, transcript="hi"),
        DocumentPart(
            sha256="c" * 64, mime_type="application/pdf", size=1, text="Invoice", truncated=True
        ),
        LocationPart(latitude=52.52, longitude=13.405, name="Shop", address="Main St 1"),
        ContactPart(name="Ana", phones=["+34 600 000 000"]),
    ]
    session = await store.get_or_create("s-kinds", AGENT)
    session.add_message(Message(role=Role.USER, content="see", parts=parts))
    await store.save(session)
    loaded = await store.get("s-kinds")
    assert loaded is not None
    assert loaded.history[0].parts == parts
