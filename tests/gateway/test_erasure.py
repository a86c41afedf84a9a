"""``erase_person``: everything about one person goes, other people's data stays.

Ann writes in private (with a photo), in a forum topic she shares with Bob, and
the bot remembers facts of both; then Ann is erased.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.core.long_memory import MemoryScope, RememberRequest, apply_memory_in
from bot.core.models.scripted import ScriptedModel
from bot.gateway.contract import MediaAttachment
from bot.gateway.erasure import REDACTED, erase_person
from bot.gateway.events import MessageEvent
from bot.gateway.keys import hash_chat_id, hash_sender_id, parse_person
from tests.fakes.adapter import make_event
from tests.fakes.media_files import jpeg_bytes
from tests.gateway.conftest import Rig

SECRET = b"s" * 32  # tests.gateway.conftest's


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


def test_a_person_is_named_platform_colon_id() -> None:
    person = parse_person("whatsapp:+15551234567")
    assert (person.platform, person.user_id) == ("whatsapp", "15551234567")
    for bad in ("123", "telegram:", ":5", "Tele gram:5"):
        with pytest.raises(ValueError, match="PLATFORM:USER_ID"):
            parse_person(bad)


async def test_everything_about_ann_goes_and_bob_keeps_his(
    rigs: Callable[..., object], tmp_path: Path
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    secret = rig.gateway.approvals._secret
    assert secret is not None
    rig.adapter.files["photo-ann"] = photo = jpeg_bytes(padding=777)
    rig.model.add(
        ScriptedModel.reply("Nice kettle, Ann."),
        ScriptedModel.reply("Noted in the topic."),
        ScriptedModel.reply("Bob, noted."),
    )
    ann_dm = make_event(
        "ann-private-kettle-words",
        chat_id="ann",
        sender_id="ann",
        media=[MediaAttachment("image", file_id="photo-ann", mime_type="image/jpeg", size=900)],
    )

    def in_topic(text: str, sender: str) -> MessageEvent:
        return make_event(
            text,
            chat_type="group",
            chat_id="g1",
            thread_id="7",
            mentions_bot=True,
            sender_id=sender,
            sender_name=sender.title(),
        )

    ann_topic, bob_topic = in_topic("ann-topic-words", "ann"), in_topic("bob-topic-words", "bob")
    for count, event in enumerate((ann_dm, ann_topic, bob_topic), start=1):
        assert await rig.adapter.deliver(event)
        await rig.adapter.wait_for_sent(count)
    assert await rig.gateway._dispatcher.drain(10)
    ann_scope = MemoryScope(
        "fake", hash_chat_id("ann", secret), hash_sender_id("ann", secret), True
    )
    bob_scope = MemoryScope(
        "fake", hash_chat_id("g1", secret), hash_sender_id("bob", secret), False, "7"
    )
    async with rig.store.transaction() as tx:
        await apply_memory_in(
            tx, [RememberRequest("mem_ann", "ann-fact-words", "me")], ann_scope, "s", 1.0
        )
        await apply_memory_in(
            tx, [RememberRequest("mem_bob", "bob-fact-words", "me")], bob_scope, "s", 1.0
        )
    await rig.gateway.stop(grace=1)
    media_dir = tmp_path / "media"
    assert photo in _all_bytes(media_dir)

    erasure = await erase_person(rig.store, parse_person("fake:ann"), secret, media_dir=media_dir)

    counts = erasure.counts
    assert counts["memories"] == 1 and counts["sessions"] == 1
    assert counts["group messages redacted"] == 1
    assert counts["journal rows"] == 2 and counts["replies"] == 2
    assert counts["media files"] >= 1 and counts["window records"] == 0
    assert counts["usage rows"] >= 2
    assert len(erasure.lines()) == 13
    everything = _all_bytes(tmp_path)
    for ann in (b"ann-private-kettle-words", b"ann-topic-words", b"ann-fact-words", b"Nice kettle"):
        assert ann not in everything, ann
    assert photo not in everything
    conn = sqlite3.connect(tmp_path / "chatflow.db")
    try:
        topic_messages = [
            json.loads(r[0]).get("content")
            for r in conn.execute("SELECT message_json FROM chatflow_messages WHERE role = 'user'")
        ]
        assert REDACTED in topic_messages and "bob-topic-words" in topic_messages[-1]
        assert conn.execute("SELECT text FROM chatflow_memories").fetchall() == [
            ("bob-fact-words",)
        ]
    finally:
        conn.close()
