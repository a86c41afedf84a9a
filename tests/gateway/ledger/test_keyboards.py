"""Buttons in the ledger: migration 3, the id covers them, their rows come with the
obligation in one transaction, a resend carries the same tokens, single use is guarded."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from bot.core.buttons import Button
from bot.core.sql import ensure_schema
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.attachments import send_reply
from bot.gateway.contract import OutgoingButton, SendResult
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.keyboards import (
    TABLE as BUTTONS_TABLE,
)
from bot.gateway.ledger.keyboards import (
    KeyboardButton,
    find_button_in,
    mark_used_in,
    new_keyboard,
    new_token,
)
from bot.gateway.ledger.obligations import (
    MIGRATIONS,
    RECOVERED_MARKER,
    TABLE,
    Obligation,
    compute_obligation_id,
)
from tests.fakes.adapter import FakeAdapter
from tests.fakes.clock import FakeClock
from tests.gateway.ledger.ledger_support import open_ledger

KEYBOARD = (KeyboardButton("tok-a", "Small"), KeyboardButton("tok-b", "Large", "size:L"))


def owed(
    buttons: tuple[KeyboardButton, ...] = KEYBOARD, content: str = "Which size?"
) -> Obligation:
    return Obligation.owed(
        obligation_id=compute_obligation_id("k", "m", content, (), buttons),
        session_key="k",
        session_id="s",
        platform="fake",
        chat_id="c1",
        thread_id="t1",
        reply_to=None,
        content=content,
        message_ref="m",
        buttons=buttons,
    )


@pytest.fixture
async def ledger(store: SQLiteSessionStore, clock: FakeClock) -> DeliveryLedger:
    return await open_ledger(store, clock)


def test_the_id_covers_labels_and_values_not_tokens() -> None:
    plain = compute_obligation_id("k", "m", "Which size?")
    with_buttons = compute_obligation_id("k", "m", "Which size?", (), KEYBOARD)
    other_tokens = compute_obligation_id(
        "k", "m", "Which size?", (), new_keyboard([Button("Small"), Button("Large", "size:L")])
    )
    other_value = compute_obligation_id(
        "k", "m", "Which size?", (), (KEYBOARD[0], KeyboardButton("tok-b", "Large", "size:XL"))
    )
    assert plain != with_buttons == other_tokens != other_value


def test_new_tokens_are_short_random_and_url_safe() -> None:
    tokens = {new_token() for _ in range(1000)}
    assert len(tokens) == 1000
    assert all(
        len(t.encode()) <= 64 and t.replace("-", "").replace("_", "").isalnum() for t in tokens
    )


async def test_buttons_rows_are_written_with_the_obligation(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    obligation = owed()
    async with store.transaction() as tx:
        assert await ledger.record_in(tx, obligation, claimed=True)
        info = await find_button_in(tx, "tok-b")
    assert info is not None
    assert (info.button, info.position, info.keyboard_id) == (
        Button("Large", "size:L"),
        1,
        obligation.obligation_id,
    )
    assert (info.session_key, info.session_id, info.chat_id, info.thread_id) == (
        "k",
        "s",
        "c1",
        "t1",
    )
    stored = await ledger.get(obligation.obligation_id)
    assert stored is not None and stored.buttons == KEYBOARD
    # Recording the same reply again keeps the first keyboard: no second set of rows.
    again = dataclasses.replace(
        obligation, buttons=new_keyboard([Button("Small"), Button("Large", "size:L")])
    )
    async with store.transaction() as tx:
        assert not await ledger.record_in(tx, again)
        count = await tx.fetchone(f"SELECT COUNT(*) FROM {BUTTONS_TABLE}")
    assert count == (2,)


async def test_a_rolled_back_turn_leaves_no_keyboard(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await ledger.record_in(tx, owed())
            raise RuntimeError("the turn failed after recording")
    async with store.transaction() as tx:
        assert await tx.fetchone(f"SELECT COUNT(*) FROM {BUTTONS_TABLE}") == (0,)
        assert await tx.fetchone(f"SELECT COUNT(*) FROM {TABLE}") == (0,)


async def test_single_use_is_a_guarded_update(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    obligation = owed()
    async with store.transaction() as tx:
        await ledger.record_in(tx, obligation)
        assert await mark_used_in(tx, obligation.obligation_id, 10.0)
        assert not await mark_used_in(tx, obligation.obligation_id, 11.0)
        info = await find_button_in(tx, "tok-a")
    assert info is not None and info.used_at is not None


class KeyboardAdapter(FakeAdapter):
    def __init__(self) -> None:
        super().__init__()
        self.keyboards: list[tuple[str, list[OutgoingButton]]] = []

    async def send_with_buttons(
        self,
        chat_id: str,
        text: str,
        buttons: Sequence[OutgoingButton],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        self.keyboards.append((text, list(buttons)))
        return await self.send(chat_id, text, thread_id=thread_id, reply_to=reply_to)


async def test_a_resend_carries_the_same_keyboard(
    ledger: DeliveryLedger, store: SQLiteSessionStore
) -> None:
    obligation = owed()
    async with store.transaction() as tx:
        await ledger.record_in(tx, obligation, claimed=True)
    stored = await ledger.get(obligation.obligation_id)
    assert stored is not None
    adapter = KeyboardAdapter()
    await send_reply(adapter, dataclasses.replace(stored, needs_marker=True), None)
    ((text, buttons),) = adapter.keyboards
    assert text == RECOVERED_MARKER + "Which size?"
    assert buttons == [OutgoingButton("tok-a", "Small"), OutgoingButton("tok-b", "Large")]


async def test_rows_made_before_buttons_still_load(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "old.db"))
    await store.open()
    try:
        async with store.transaction() as tx:  # the ledger as version 2 left it
            await ensure_schema(tx, "delivery_ledger", {1: MIGRATIONS[1], 2: MIGRATIONS[2]})
            await tx.execute(
                f"INSERT INTO {TABLE} (obligation_id, session_key, session_id, platform, "
                "chat_id, message_ref, content, state, owner_pid, owner_instance, created_at, "
                "fresh_since, updated_at) VALUES ('o-old', 'k', 's', 'fake', 'c', 'm', 'hi', "
                "'pending', 1, 'gone', 1.0, 1.0, 1.0)"
            )
        ledger = DeliveryLedger(store)
        await ledger.open()
        old = await ledger.get("o-old")
        assert old is not None and old.content == "hi" and old.buttons == ()
    finally:
        await store.close()
