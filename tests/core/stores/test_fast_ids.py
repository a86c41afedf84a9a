"""Ids and versions that need only uniqueness come from a fast generator, not the CSPRNG."""

from __future__ import annotations

import os
import secrets
import uuid
from pathlib import Path

import pytest

from bot.core.agent import Agent
from bot.core.ids import new_hex_id
from bot.core.messages import Message, Role
from bot.core.stores.sqlite import SQLiteSessionStore

AGENT = Agent(name="Triage", instructions="triage")


async def test_messages_and_saves_make_no_csprng_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: object) -> object:
        raise AssertionError("a CSPRNG call for an id that needs only uniqueness")

    store = SQLiteSessionStore(str(tmp_path / "s.db"))
    try:
        await store.open()
        monkeypatch.setattr(uuid, "uuid4", refuse)
        monkeypatch.setattr(secrets, "randbits", refuse)
        monkeypatch.setattr(os, "urandom", refuse)
        ids: set[str] = set()
        for n in range(3):
            async with store.session_lock(f"s{n}"):
                session = await store.get_or_create(f"s{n}", AGENT)
                session.add_message(Message(role=Role.USER, content=f"q{n}"))
                session.add_message(Message(role=Role.MODEL, content=f"a{n}"))
                await store.save(session)
            ids.update(m.id for m in session.history)
        assert len(ids) == 6 and all(len(i) == 32 for i in ids)
    finally:
        await store.close()


def test_a_forked_child_does_not_repeat_the_parents_ids() -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first id, then out at once
        os.write(write_end, new_hex_id().encode())
        os._exit(0)
    try:
        os.close(write_end)
        parent_id = new_hex_id()
        child_id = os.read(read_end, 64).decode()
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert len(child_id) == 32 and child_id != parent_id
