"""Buttons through the gateway: the keyboard goes out with the reply, a tap comes back as
a message of the same conversation, refused taps start nothing, interceptors come first."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot import Agent, Button, Runner, ToolOutput, tool
from bot.config import Settings
from bot.core.messages import Role
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.approvals import approval_rows
from bot.gateway.contract import MessageEvent, OutgoingButton
from bot.gateway.events import event_from_dict, event_to_dict
from bot.gateway.gateway import Gateway
from bot.gateway.keys import hash_sender_id
from bot.gateway.ledger.keyboards import TABLE as BUTTONS_TABLE
from bot.gateway.ledger.obligations import TABLE
from bot.gateway.taps import (
    EXPIRED_NOTICE,
    FAILED_NOTICE,
    NOT_YOURS,
    TapInfo,
    TapOutcome,
    tap_text,
)
from tests.fakes.adapter import FakeAdapter, make_event
from tests.fakes.button_adapter import ButtonAdapter
from tests.fakes.clock import FakeClock

SECRET = b"k" * 32


@tool
def ask_size() -> ToolOutput:
    """Offer the sizes."""
    return ToolOutput("sizes offered", buttons=["Small", Button("Large", value="size:L")])


@tool
def ask_approval() -> ToolOutput:
    """Offer an approval keyboard (any member may tap it: the interceptor judges who)."""
    return ToolOutput(
        "asked", buttons=[Button("Approve", value="test-intercept:yes:1")], anyone_may_tap=True
    )


@tool
def ask_group() -> ToolOutput:
    """Offer a poll to the whole group."""
    return ToolOutput("poll offered", buttons=["Monday", "Tuesday"], anyone_may_tap=True)


@tool(needs_approval=True)
def book(day: str) -> str:
    """Book the outing."""
    return f"booked {day}"


@dataclass
class Rig:
    gateway: Gateway
    adapter: ButtonAdapter
    model: ScriptedModel
    store: SQLiteSessionStore
    clock: FakeClock

    async def ask(self, text: str = "which size?") -> list[OutgoingButton]:
        """A message whose turn calls ``ask_size``: the keyboard sent with the reply."""
        self.model.add(ScriptedModel.call("ask_size"), ScriptedModel.reply("Which size?"))
        before = len(self.adapter.sent)
        assert await self.adapter.deliver(make_event(text))
        await self.adapter.wait_for_sent(before + 1)
        return self.adapter.keyboards[-1]

    async def tap(self, token: str, callback: str, **fields: Any) -> bool:
        event = make_event("", message_id=f"fake:tap:{callback}", tap_token=token, **fields)
        return await self.adapter.deliver(event)

    async def turns(self) -> int:
        """User messages in the history."""
        async with self.store.transaction() as tx:
            rows = await tx.fetchall("SELECT session_id FROM chatflow_sessions")
        count = 0
        for (session_id,) in rows:
            session = await self.store.get(str(session_id))
            assert session is not None
            count += sum(1 for m in session.history if m.role == Role.USER)
        return count


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    clock = FakeClock()
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"), clock=clock)
    model = ScriptedModel()
    agent = Agent(
        name="Shop", instructions="Sell.", tools=[ask_size, ask_approval, ask_group, book]
    )
    runner = Runner(agent, store, model=model)
    adapter = ButtonAdapter()
    settings = Settings(data_dir=tmp_path, button_ttl_seconds=600)
    gateway = Gateway(runner, store, [adapter], settings, secret=SECRET)
    await gateway.start()
    await gateway.wait_ready()
    yield Rig(gateway, adapter, model, store, clock)
    await gateway.stop(grace=1)
    await store.close()


def tap_counts(rig: Rig) -> dict[str, float]:
    """``chatflow_taps_total`` by outcome, as ``/metrics`` shows it."""
    samples = rig.gateway.metrics.registry.get_sample_value
    outcomes = ("accepted", "intercepted", "duplicate", "refused")
    counts = {o: samples("chatflow_taps_total", {"outcome": o}) for o in outcomes}
    return {o: n for o, n in counts.items() if n}


async def test_the_reply_carries_the_keyboard_and_each_button_has_a_row(rig: Rig) -> None:
    keyboard = await rig.ask()
    assert [b.label for b in keyboard] == ["Small", "Large"]
    tokens = [b.token for b in keyboard]
    assert len(set(tokens)) == 2 and all(len(t.encode()) <= 64 for t in tokens)
    assert "size:L" not in tokens  # the platform sees the token, never the value
    async with rig.store.transaction() as tx:
        rows = await tx.fetchall(
            f"SELECT token, label, value, keyboard_id, used_at FROM {BUTTONS_TABLE} "
            "ORDER BY position"
        )
        (buttons_json,) = await tx.fetchone(f"SELECT buttons FROM {TABLE}") or (None,)
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (tokens[0], "Small", None),
        (tokens[1], "Large", "size:L"),
    ]
    assert rows[0][3] == rows[1][3] and rows[0][4] is None
    assert buttons_json is not None and tokens[0] in buttons_json
    # The model was told the buttons will be shown.
    tool_result = next(m for m in rig.model.requests[1].messages if m.role == Role.TOOL)
    assert "will be shown under your reply" in (tool_result.content or "")


async def test_a_tap_becomes_the_label_in_the_same_conversation(rig: Rig) -> None:
    keyboard = await rig.ask()
    rig.model.add(ScriptedModel.reply("Large it is."))
    assert await rig.tap(keyboard[1].token, "cb1", keyboard_message_id="k-1")
    await rig.adapter.wait_for_sent(2)
    last = rig.model.requests[-1].messages[-1]
    assert last.role == Role.USER
    assert last.content is not None and last.content.startswith("Large")
    assert "size:L" in last.content  # the value differs from the label: the model reads it
    assert rig.adapter.answers == [("fake:tap:cb1", None)]
    assert rig.adapter.removed == ["k-1"]
    assert await rig.turns() == 2  # one conversation: the question and the tap


async def test_a_redelivered_tap_is_answered_and_starts_no_second_turn(rig: Rig) -> None:
    keyboard = await rig.ask()
    rig.model.add(ScriptedModel.reply("Small it is."))
    assert await rig.tap(keyboard[0].token, "cb1")
    await rig.adapter.wait_for_sent(2)
    assert not await rig.tap(keyboard[0].token, "cb1")  # the same callback again
    assert not await rig.tap(keyboard[1].token, "cb2")  # another button, same keyboard
    assert rig.adapter.answers == [
        ("fake:tap:cb1", None),
        ("fake:tap:cb1", None),  # a duplicate: answered, no notice
        ("fake:tap:cb2", EXPIRED_NOTICE),
    ]
    assert rig.model.remaining == 0 and len(rig.adapter.sent) == 2
    assert await rig.turns() == 2
    assert tap_counts(rig) == {"accepted": 1.0, "duplicate": 1.0, "refused": 1.0}


@pytest.mark.parametrize(
    "forge",
    [
        {"token": "not-a-token"},
        {"chat_id": "chat-2"},
        {"platform": "other"},
    ],
)
async def test_forged_or_foreign_taps_change_nothing(rig: Rig, forge: dict[str, str]) -> None:
    keyboard = await rig.ask()
    event = make_event(
        "",
        message_id="fake:tap:x",
        tap_token=forge.get("token", keyboard[0].token),
        chat_id=forge.get("chat_id", "chat-1"),
        platform=forge.get("platform", "fake"),
    )
    event = dataclasses.replace(event, platform="fake")
    assert not await rig.adapter.deliver(event)
    assert rig.adapter.answers == [("fake:tap:x", EXPIRED_NOTICE)]
    async with rig.store.transaction() as tx:
        used = await tx.fetchall(f"SELECT used_at FROM {BUTTONS_TABLE} WHERE used_at IS NOT NULL")
    assert used == [] and await rig.turns() == 1


def in_group(text: str, sender: str, **fields: Any) -> MessageEvent:
    """A message of ``sender`` in the group ``group-1`` (addressed to the bot)."""
    return make_event(
        text,
        chat_id="group-1",
        chat_type="group",
        sender_id=sender,
        sender_name=sender.title(),
        mentions_bot=True,
        **fields,
    )


async def sessions_by_sender(rig: Rig) -> dict[str, list[str]]:
    """The user messages of each conversation, by the sender name it last saw."""
    async with rig.store.transaction() as tx:
        rows = await tx.fetchall("SELECT session_id FROM chatflow_sessions ORDER BY session_id")
    out: dict[str, list[str]] = {}
    for (session_id,) in rows:
        session = await rig.store.get(str(session_id))
        assert session is not None
        texts = [m.content or "" for m in session.history if m.role == Role.USER]
        out[str(session.metadata.get("sender_name"))] = texts
    return out


async def test_another_members_tap_is_refused_and_starts_nothing(rig: Rig) -> None:
    rig.model.add(ScriptedModel.call("ask_size"), ScriptedModel.reply("Alice, which size?"))
    assert await rig.adapter.deliver(in_group("@bot ice cream", "alice"))
    await rig.adapter.wait_for_sent(1)
    keyboard = rig.adapter.keyboards[-1]
    # Bob taps Alice's keyboard: refused, no turn, the keyboard stays open for her.
    assert not await rig.adapter.deliver(
        in_group("", "bob", message_id="fake:tap:bob", tap_token=keyboard[1].token)
    )
    assert rig.adapter.answers == [("fake:tap:bob", NOT_YOURS)]
    assert rig.adapter.removed == [] and await rig.turns() == 1
    rig.model.add(ScriptedModel.reply("Large it is."))
    assert await rig.adapter.deliver(
        in_group("", "alice", message_id="fake:tap:alice", tap_token=keyboard[1].token)
    )
    await rig.adapter.wait_for_sent(2)
    assert rig.adapter.answers[-1] == ("fake:tap:alice", None)
    assert list(await sessions_by_sender(rig)) == ["Alice"]  # Bob never spoke in it
    assert tap_counts(rig) == {"accepted": 1.0, "refused": 1.0}


async def test_a_keyboard_for_anyone_takes_another_members_tap(rig: Rig) -> None:
    rig.model.add(ScriptedModel.call("ask_group"), ScriptedModel.reply("Which day, everyone?"))
    assert await rig.adapter.deliver(in_group("@bot plan the outing", "alice"))
    await rig.adapter.wait_for_sent(1)
    keyboard = rig.adapter.keyboards[-1]
    rig.model.add(ScriptedModel.reply("Tuesday, noted."))
    assert await rig.adapter.deliver(
        in_group("", "bob", message_id="fake:tap:bob", tap_token=keyboard[1].token)
    )
    await rig.adapter.wait_for_sent(2)
    assert rig.adapter.answers == [("fake:tap:bob", None)]
    last = rig.model.requests[-1].messages[-1]
    assert last.content is not None and last.content.endswith("Tuesday")


async def test_an_expired_keyboard_is_refused(rig: Rig) -> None:
    keyboard = await rig.ask()
    rig.clock.advance(seconds=601)
    assert not await rig.tap(keyboard[0].token, "late")
    assert rig.adapter.answers == [("fake:tap:late", EXPIRED_NOTICE)]
    assert await rig.turns() == 1


async def test_two_taps_racing_start_one_turn(rig: Rig) -> None:
    keyboard = await rig.ask()
    rig.model.add(ScriptedModel.reply("One."))
    results = await asyncio.gather(rig.tap(keyboard[0].token, "a"), rig.tap(keyboard[1].token, "b"))
    assert sorted(results) == [False, True]
    await rig.adapter.wait_for_sent(2)
    notices = sorted(n or "" for _, n in rig.adapter.answers)
    assert notices == ["", EXPIRED_NOTICE]
    assert await rig.turns() == 2


async def test_an_interceptor_takes_its_prefix_before_anything_is_journaled(rig: Rig) -> None:
    seen: list[tuple[MessageEvent, Button, TapInfo]] = []
    outcomes = [TapOutcome(consumed=False, notice="Only Ana can answer."), TapOutcome(True, "Done")]

    async def handler(event: MessageEvent, button: Button, info: TapInfo) -> TapOutcome:
        async with rig.store.transaction() as tx:
            row = await tx.fetchone(
                f"SELECT used_at FROM {BUTTONS_TABLE} WHERE token = ?", (info.token,)
            )
        assert row == (None,)  # called before the keyboard is marked used
        seen.append((event, button, info))
        return outcomes.pop(0)

    rig.gateway.taps.intercept("test-intercept:", handler)
    rig.model.add(ScriptedModel.call("ask_approval"), ScriptedModel.reply("May I?"))
    assert await rig.adapter.deliver(make_event("refund me"))
    await rig.adapter.wait_for_sent(1)
    token = rig.adapter.keyboards[-1][0].token
    assert not await rig.tap(token, "other", sender_id="user-2")
    assert not await rig.tap(token, "mine", keyboard_message_id="k")
    event, button, info = seen[0]
    assert button == Button("Approve", value="test-intercept:yes:1")
    assert event.text == "Approve" and event.source.sender_id == "user-2"
    assert info.session_id == seen[1][2].session_id and info.chat_id == "chat-1"
    assert rig.adapter.answers == [
        ("fake:tap:other", "Only Ana can answer."),
        ("fake:tap:mine", "Done"),
    ]
    assert rig.adapter.removed == ["k"]
    # Consumed: the keyboard is used now, and no turn ran for either tap.
    assert not await rig.tap(token, "again")
    assert rig.adapter.answers[-1] == ("fake:tap:again", EXPIRED_NOTICE)
    assert await rig.turns() == 1 and len(seen) == 2
    assert tap_counts(rig) == {"intercepted": 2.0, "refused": 1.0}


async def test_a_failing_interceptor_is_answered_and_leaves_the_keyboard_open(rig: Rig) -> None:
    async def handler(event: MessageEvent, button: Button, info: TapInfo) -> TapOutcome:
        raise RuntimeError("boom")

    rig.gateway.taps.intercept("test-intercept:", handler)
    rig.model.add(ScriptedModel.call("ask_approval"), ScriptedModel.reply("May I?"))
    assert await rig.adapter.deliver(make_event("refund me"))
    await rig.adapter.wait_for_sent(1)
    token = rig.adapter.keyboards[-1][0].token
    assert not await rig.tap(token, "t1")
    assert rig.adapter.answers == [("fake:tap:t1", FAILED_NOTICE)]
    async with rig.store.transaction() as tx:
        assert await tx.fetchall(f"SELECT 1 FROM {BUTTONS_TABLE} WHERE used_at IS NOT NULL") == []


async def test_a_channel_without_buttons_lists_them_numbered(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "c.db"))
    model = ScriptedModel()
    runner = Runner(Agent(name="Shop", instructions="x", tools=[ask_size]), store, model=model)
    plain = FakeAdapter()
    gateway = Gateway(runner, store, [plain], Settings(data_dir=tmp_path), secret=SECRET)
    await gateway.start()
    await gateway.wait_ready()
    try:
        model.add(ScriptedModel.call("ask_size"), ScriptedModel.reply("Which size?"))
        assert await plain.deliver(make_event("hi"))
        sent = await plain.wait_for_sent(1)
        assert sent[0].text == "Which size?\n\n1. Small\n2. Large"
    finally:
        await gateway.stop(grace=1)
        await store.close()


@tool
def ask_secret() -> ToolOutput:
    """Offer a choice whose label and value are personal."""
    return ToolOutput("asked", buttons=[Button("Ana García 4411", value="iban:ES7921000813")])


async def test_labels_and_values_never_reach_the_logs_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SQLiteSessionStore(str(tmp_path / "pii.db"))
    model = ScriptedModel()
    runner = Runner(Agent(name="Bank", instructions="x", tools=[ask_secret]), store, model=model)
    adapter = ButtonAdapter()
    gateway = Gateway(runner, store, [adapter], Settings(data_dir=tmp_path), secret=SECRET)
    await gateway.start()
    await gateway.wait_ready()
    try:
        with caplog.at_level(logging.DEBUG):
            model.add(ScriptedModel.call("ask_secret"), ScriptedModel.reply("Which account?"))
            assert await adapter.deliver(make_event("pay"))
            await adapter.wait_for_sent(1)
            token = adapter.keyboards[-1][0].token
            model.add(ScriptedModel.reply("Done."))
            assert await adapter.deliver(make_event("", message_id="fake:tap:1", tap_token=token))
            await adapter.wait_for_sent(2)
            assert not await adapter.deliver(
                make_event("", message_id="fake:tap:2", tap_token=token)
            )
            assert not await adapter.deliver(make_event("", message_id="fake:tap:3", tap_token="x"))
    finally:
        await gateway.stop(grace=1)
        await store.close()
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert loud  # the flow logged something at INFO
    for secret in ("Ana García", "4411", "ES7921000813", token):
        assert not any(secret in line for line in loud), secret


def test_a_tap_survives_the_inbox_journal() -> None:
    tap = make_event(
        "Large",
        message_id="fake:tap:j",
        tap_token="tok",
        callback_id="cb",
        keyboard_message_id="k",
        button=Button("Large", value="size:L"),
    )
    data = event_to_dict(tap)
    assert data["button"] == {"label": "Large", "value": "size:L"}
    back = event_from_dict(json.loads(json.dumps(data)))
    assert back == tap and tap_text(back).endswith("value: 'size:L']")
    plain = event_to_dict(make_event("hi"))
    assert "button" not in plain and event_from_dict(plain).button is None


async def test_a_polls_tap_leaves_the_conversations_person_its_approver(rig: Rig) -> None:
    """G2: Bob's tap on a poll runs in Alice's conversation; the approval it asks for is
    Alice's to give, not Bob's."""
    rig.model.add(ScriptedModel.call("ask_group"), ScriptedModel.reply("Which day, everyone?"))
    assert await rig.adapter.deliver(in_group("@bot plan the outing", "alice"))
    await rig.adapter.wait_for_sent(1)
    poll = rig.adapter.keyboards[-1]
    rig.model.add(ScriptedModel.call("book", day="Tuesday"))
    assert await rig.adapter.deliver(
        in_group("", "bob", message_id="fake:tap:bob", tap_token=poll[1].token)
    )
    await rig.adapter.wait_for_sent(2)
    [row] = await approval_rows(rig.store)
    assert row.sender_ref == hash_sender_id("alice", SECRET)
    approve = rig.adapter.keyboards[-1][0]
    assert not await rig.adapter.deliver(
        in_group("", "bob", message_id="fake:tap:bob-2", tap_token=approve.token)
    )
    assert rig.adapter.answers[-1] == ("fake:tap:bob-2", NOT_YOURS)
    assert [r.state for r in await approval_rows(rig.store)] == ["pending"]
