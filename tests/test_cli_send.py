"""``python -m bot send``: the operator's own message, owed through the ledger."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.stores.base import TransactionalStore
from bot.core.stores.postgres import PostgresSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.contract import SessionSource
from bot.gateway.instances import InstanceRegistry, Owner
from bot.gateway.keys import (
    build_session_key,
    load_or_create_secret,
    load_or_create_shared_secret,
    session_id_for,
)
from bot.gateway.ledger import DeliveryLedger, Obligation, compute_obligation_id
from bot.gateway.takeover import OPERATOR_NAME
from bot.instance_lock import InstanceLock
from tests.cli_inprocess import cli as _bot
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]

TOKEN = "123456:test-token"
DM_CHAT = "111111111"  # the chat of tests/data/telegram/private_text.json
GROUP_CHAT = "-1001234567890"  # of group_mention.json
WA_NUMBER = "15551234567"
WA_ENV = {
    "WHATSAPP_PHONE_ID": "1234567890",
    "WHATSAPP_TOKEN": "wa-token",
    "WHATSAPP_VERIFY_TOKEN": "verify",
    "WHATSAPP_APP_SECRET": "app-secret",
}


def _send(tmp_path: Path, *args: str, stdin: str = "", **env: str) -> tuple[int, str, str]:
    result = _bot(tmp_path, "send", *args, stdin=stdin, **{"TELEGRAM_BOT_TOKEN": TOKEN, **env})
    return result.returncode, result.stdout, result.stderr


async def _owed(store: TransactionalStore) -> list[Obligation]:
    try:
        return await DeliveryLedger(store).list_obligations()
    finally:
        await store.close()


def _sqlite(tmp_path: Path) -> SQLiteSessionStore:
    return SQLiteSessionStore(str(tmp_path / "data" / "chatflow.db"))


def _dm_key(chat_id: str, secret: bytes, platform: str = "telegram") -> str:
    return build_session_key(SessionSource(platform, chat_id, "dm", chat_id), secret=secret)


@pytest.mark.parametrize(
    ("target", "text", "env", "says"),
    [
        pytest.param("signal:123", "hi", {}, "unknown platform 'signal'", id="unknown-platform"),
        pytest.param("telegram", "hi", {}, "must be <platform>:<chat id>", id="no-colon"),
        pytest.param("telegram:abc", "hi", {}, "telegram chat id must be an integer", id="tg-abc"),
        pytest.param("telegram:", "hi", {}, "telegram chat id must be an integer", id="tg-empty"),
        pytest.param("telegram:0", "hi", {}, "telegram chat id must be an integer", id="tg-zero"),
        pytest.param(
            "telegram:123:topic", "hi", {}, "telegram topic id must be", id="tg-bad-topic"
        ),
        pytest.param(
            "whatsapp:+15551234567", "hi", WA_ENV, "whatsapp chat id must be", id="wa-plus"
        ),
        pytest.param(
            f"whatsapp:{WA_NUMBER}:7", "hi", WA_ENV, "whatsapp chats have no threads", id="wa-th"
        ),
        pytest.param(
            f"whatsapp:{WA_NUMBER}", "hi", {}, "whatsapp is not configured", id="wa-unconfigured"
        ),
        pytest.param(f"telegram:{DM_CHAT}", "", {}, "the message is empty", id="empty"),
        pytest.param(f"telegram:{DM_CHAT}", " \n ", {}, "the message is empty", id="blank"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, target: str, text: str, env: dict[str, str], says: str
) -> None:
    code, out, err = _send(tmp_path, target, text, **env)
    assert code == 2
    assert out == ""
    assert err.strip().splitlines() == [err.strip()]  # one line, no traceback
    assert err.startswith("chatflow: send: ") and says in err


def test_telegram_not_configured_is_refused(tmp_path: Path) -> None:
    code, _, err = _send(tmp_path, f"telegram:{DM_CHAT}", "hi", TELEGRAM_BOT_TOKEN="")
    assert code == 2
    assert err.strip() == (
        "chatflow: send: telegram is not configured here (set TELEGRAM_BOT_TOKEN, as for the bot)"
    )


def test_empty_text_from_stdin_is_refused(tmp_path: Path) -> None:
    code, _, err = _send(tmp_path, f"telegram:{DM_CHAT}", "-", stdin="\n")
    assert code == 2 and "the message is empty" in err


async def test_with_no_bot_the_message_is_queued_pending_for_the_chats_dm_session(
    tmp_path: Path,
) -> None:
    text = "Your parcel shipped today."
    code, out, err = _send(tmp_path, f"telegram:{DM_CHAT}", text)
    assert code == 0, err
    (row,) = await _owed(_sqlite(tmp_path))
    assert (
        out.strip()
        == f"queued {row.obligation_id}: no bot is running; it is sent when the bot starts"
    )
    secret = await asyncio.to_thread(load_or_create_secret, tmp_path / "data")
    key = _dm_key(DM_CHAT, secret)
    assert (row.state, row.attempts, row.platform) == ("pending", 0, "telegram")
    assert (row.session_key, row.session_id) == (key, session_id_for(key))
    assert (row.chat_id, row.thread_id, row.content) == (DM_CHAT, None, text)
    assert row.message_ref.startswith(f"{OPERATOR_NAME}:")
    assert DM_CHAT not in err and text not in err  # logs name neither the chat nor the text


async def test_text_from_stdin_and_a_whatsapp_number(tmp_path: Path) -> None:
    code, _, err = _send(
        tmp_path, f"whatsapp:{WA_NUMBER}", "-", stdin="line one\nline two\n", **WA_ENV
    )
    assert code == 0, err
    (row,) = await _owed(_sqlite(tmp_path))
    secret = await asyncio.to_thread(load_or_create_secret, tmp_path / "data")
    assert row.session_key == _dm_key(WA_NUMBER, secret, "whatsapp")
    assert (row.platform, row.chat_id, row.content) == ("whatsapp", WA_NUMBER, "line one\nline two")


async def test_with_a_bot_running_it_says_the_message_was_handed_over(tmp_path: Path) -> None:
    lock = InstanceLock(tmp_path / "data")
    lock.acquire()  # this test plays the running bot
    try:
        code, out, err = _send(tmp_path, f"telegram:{DM_CHAT}", "hello")
    finally:
        lock.release()
    assert code == 0, err
    assert out.startswith("sent to the running bot: ") and "within seconds" in out
    assert len(out.strip().splitlines()) == 1


async def test_a_known_group_conversation_gets_the_message_in_its_history(tmp_path: Path) -> None:
    """The chat's latest ledger row names the conversation the console shows: the message
    lands there (group key, per-user session), labelled as the operator's."""
    data = tmp_path / "data"
    data.mkdir()
    secret = await asyncio.to_thread(load_or_create_secret, data)
    source = SessionSource("telegram", GROUP_CHAT, "group", "222222222")
    key = build_session_key(source, secret=secret)
    session_id = session_id_for(key)
    store = _sqlite(tmp_path)
    try:
        session = await store.get_or_create(
            session_id, Agent(name="Triage", instructions="help"), {"platform": "telegram"}
        )
        session.add_message(Message(role=Role.USER, content="@bot where is my order?"))
        await store.save(session)
        ledger = DeliveryLedger(store)
        await ledger.record_obligation(
            obligation_id=compute_obligation_id(key, "m1", "It ships tomorrow."),
            session_key=key,
            session_id=session_id,
            platform="telegram",
            chat_id=GROUP_CHAT,
            thread_id=None,
            reply_to="20",
            content="It ships tomorrow.",
            message_ref="m1",
        )
    finally:
        await store.close()

    code, _, err = _send(tmp_path, f"telegram:{GROUP_CHAT}", "It shipped.")
    assert code == 0, err

    store = _sqlite(tmp_path)
    try:
        rows = [
            r
            for r in await DeliveryLedger(store).list_obligations()
            if r.message_ref.startswith(f"{OPERATOR_NAME}:")
        ]
        stored = await store.get(session_id)
    finally:
        await store.close()
    assert [(r.session_key, r.session_id, r.chat_id) for r in rows] == [
        (key, session_id, GROUP_CHAT)
    ]
    assert stored is not None
    last = stored.history[-1]
    assert (last.role, last.content, last.name) == (Role.MODEL, "It shipped.", OPERATOR_NAME)
    assert rows[0].message_ref == f"{OPERATOR_NAME}:{last.id}"


async def test_with_a_bot_running_on_sqlite_the_conversation_is_left_to_the_bot(
    tmp_path: Path,
) -> None:
    """The running bot's session locks are in its own process: a history written from
    here could fail the save of a turn it is running, so only the ledger row is written."""
    data = tmp_path / "data"
    data.mkdir()
    secret = await asyncio.to_thread(load_or_create_secret, data)
    key = _dm_key(DM_CHAT, secret)
    session_id = session_id_for(key)
    store = _sqlite(tmp_path)
    try:
        session = await store.get_or_create(session_id, Agent(name="Triage", instructions="x"))
        session.add_message(Message(role=Role.USER, content="where is my order?"))
        await store.save(session)
    finally:
        await store.close()
    lock = InstanceLock(data)
    lock.acquire()  # this test plays the running bot
    try:
        code, _, err = _send(tmp_path, f"telegram:{DM_CHAT}", "It shipped.")
    finally:
        lock.release()
    assert code == 0, err
    store = _sqlite(tmp_path)
    try:
        stored = await store.get(session_id)
    finally:
        await store.close()
    owed = await _owed(_sqlite(tmp_path))
    assert [(o.session_id, o.content) for o in owed] == [(session_id, "It shipped.")]
    assert stored is not None
    assert [m.content for m in stored.history] == ["where is my order?"]


async def test_a_running_gateway_claims_the_queued_message_at_its_next_poll(
    tmp_path: Path,
) -> None:
    """The retry poll (every few seconds), not only the minute's sweep, claims it; of two
    processes polling, one gets it."""
    code, _, err = _send(tmp_path, f"telegram:{DM_CHAT}", "hello")
    assert code == 0, err
    store = _sqlite(tmp_path)
    try:
        first = DeliveryLedger(store, owner=Owner(os.getpid(), "first"))
        second = DeliveryLedger(store, owner=Owner(os.getpid(), "second"))
        claimed = await first.due_retries()
        assert await second.due_retries() == []
    finally:
        await store.close()
    (row,) = claimed
    assert (row.state, row.attempts, row.needs_marker, row.content) == (
        "attempting",
        1,
        False,
        "hello",
    )


async def test_on_postgres_the_message_is_queued_in_the_database(
    pg_dsn: str, tmp_path: Path
) -> None:
    code, out, err = _send(tmp_path, f"telegram:{DM_CHAT}", "hello pg", DATABASE_URL=pg_dsn)
    assert code == 0, err
    assert out.startswith("queued ") and "no bot is running" in out

    store = PostgresSessionStore(pg_dsn)
    await store.open()
    secret = await load_or_create_shared_secret(store)
    registry = InstanceRegistry(store, owner=Owner(os.getpid(), "the-running-bot"))
    await registry.register()  # this test plays a live bot process
    (row,) = await _owed(store)
    key = _dm_key(DM_CHAT, secret)
    assert (row.state, row.session_key, row.session_id) == ("pending", key, session_id_for(key))
    assert row.content == "hello pg"

    code, out, err = _send(tmp_path, f"telegram:{DM_CHAT}", "again", DATABASE_URL=pg_dsn)
    assert code == 0, err
    assert out.startswith("sent to the running bot: ")
