"""The Runner's pause on a tool that needs approval, and the turn that resumes it."""

from __future__ import annotations

from typing import Any, cast

import pytest

from bot.core.agent import Agent, tool
from bot.core.approvals import (
    DECLINED_RESULT,
    DETAILS,
    EXPIRED_RESULT,
    UNKNOWN_RESULT,
    WAITING_RESULT,
    approval_prompt,
    details_text,
    parse_approval_button,
)
from bot.core.messages import Message, Role
from bot.core.models import ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.in_memory import SessionStore
from bot.core.tools import Decline, ToolContext
from bot.errors import ChatflowError

SID = "test-approvals-0001"


def _refund_agent(log: list[dict[str, Any]]) -> Agent:
    @tool(needs_approval=True)
    def refund(order_id: str, amount: float) -> str:
        """Refund an order.

        Args:
            order_id: The order.
            amount: How much.
        """
        log.append({"order_id": order_id, "amount": amount})
        return f"refunded {amount} on {order_id}"

    @tool
    def balance() -> str:
        """The balance."""
        log.append({"balance": True})
        return "42"

    return Agent(name="Billing", instructions="Bill.", tools=[refund, balance])


def _assert_valid(history: list[Message]) -> None:
    """Every tool call answered, every result after its call: what a provider accepts."""
    open_calls: set[str] = set()
    for message in history:
        if message.role is Role.MODEL:
            assert not open_calls, "a tool call was left without its result"
            open_calls = {call.id for call in message.tool_calls}
        elif message.role is Role.TOOL:
            assert message.tool_call_id in open_calls
            open_calls.discard(message.tool_call_id)
        else:
            assert not open_calls
    assert not open_calls


async def test_a_gated_call_ends_the_turn_with_a_question_and_runs_nothing() -> None:
    log: list[dict[str, Any]] = []
    model = ScriptedModel([ScriptedModel.call("refund", order_id="1001", amount=25)])
    store = SessionStore()
    async with Runner(_refund_agent(log), store, model=model) as runner:
        result = await runner.run_async(SID, "refund 1001 please")
    assert log == []
    pending = result.pending_approval
    assert pending is not None
    assert (pending.tool_name, pending.agent) == ("refund", "Billing")
    assert pending.arguments == {"order_id": "1001", "amount": 25}
    assert result.content == "May I refund an order?\nOrder id: 1001\nAmount: 25"
    assert result.content == approval_prompt(pending)
    assert [b.label for b in result.buttons] == ["Approve", "Deny"]
    assert [parse_approval_button(b.effective_value) for b in result.buttons] == [
        (pending.approval_id, "approve"),
        (pending.approval_id, "deny"),
    ]
    session = await store.get(SID)
    assert session is not None
    # The pending call is not in the history: it comes back with its result once decided.
    assert [(m.role, m.content, m.tool_calls) for m in session.history] == [
        (Role.USER, "refund 1001 please", []),
        (Role.MODEL, result.content, []),
    ]


async def test_approved_runs_the_tool_once_and_the_model_answers_from_its_result() -> None:
    log: list[dict[str, Any]] = []
    model = ScriptedModel(
        [ScriptedModel.call("refund", order_id="1001", amount=25), ScriptedModel.reply("Done!")]
    )
    store = SessionStore()
    async with Runner(_refund_agent(log), store, model=model) as runner:
        paused = await runner.run_async(SID, "refund 1001 please")
        assert paused.pending_approval is not None
        result = await runner.resume_async(
            SID, paused.pending_approval, "approved", inbound_message_id="approval:x"
        )
    assert log == [{"order_id": "1001", "amount": 25}]
    assert result.content == "Done!"
    assert result.pending_approval is None
    assert result.buttons == ()
    session = await store.get(SID)
    assert session is not None
    _assert_valid(session.history)
    call_message, tool_message = session.history[2], session.history[3]
    assert call_message.tool_calls[0].id == paused.pending_approval.call_id
    assert tool_message.content == "refunded 25.0 on 1001"
    # The model's second request held the call and its real result.
    sent = model.requests[1].messages
    assert any(m.role is Role.TOOL and m.content == "refunded 25.0 on 1001" for m in sent)
    _assert_valid(list(sent))


@pytest.mark.parametrize(
    ("decision", "text"),
    [("denied", DECLINED_RESULT), ("expired", EXPIRED_RESULT), ("unknown", UNKNOWN_RESULT)],
)
async def test_a_decision_other_than_approved_tells_the_model_and_runs_nothing(
    decision: Any, text: str
) -> None:
    log: list[dict[str, Any]] = []
    model = ScriptedModel(
        [ScriptedModel.call("refund", order_id="1", amount=5), ScriptedModel.reply("OK then.")]
    )
    store = SessionStore()
    async with Runner(_refund_agent(log), store, model=model) as runner:
        paused = await runner.run_async(SID, "refund")
        assert paused.pending_approval is not None
        result = await runner.resume_async(SID, paused.pending_approval, decision)
    assert log == []
    assert result.content == "OK then."
    results = [m.content for m in model.requests[1].messages if m.role is Role.TOOL]
    assert results == [text]
    session = await store.get(SID)
    assert session is not None
    _assert_valid(session.history)


async def test_a_callable_policy_decides_per_call_sync_or_async() -> None:
    ran: list[float] = []

    def big(ctx: ToolContext, args: dict[str, Any]) -> bool:
        assert ctx.session_id == SID
        return float(args["amount"]) > 100

    async def big_async(ctx: ToolContext, args: dict[str, Any]) -> bool:
        return float(args["amount"]) > 100

    for policy in (big, big_async):

        @tool(needs_approval=policy)
        def pay(amount: float) -> str:
            """Pay."""
            ran.append(amount)
            return "paid"

        agent = Agent(name="Payer", instructions="Pay.", tools=[pay])
        model = ScriptedModel(
            [
                ScriptedModel.call("pay", amount=10),
                ScriptedModel.reply("paid 10"),
                ScriptedModel.call("pay", amount=500),
            ]
        )
        async with Runner(agent, SessionStore(), model=model) as runner:
            small = await runner.run_async(SID, "pay 10")
            large = await runner.run_async(SID, "pay 500")
        assert small.pending_approval is None
        assert large.pending_approval is not None
    assert ran == [10, 10]


async def test_a_policy_that_raises_asks_for_approval() -> None:
    def broken(ctx: ToolContext, args: dict[str, Any]) -> bool:
        raise RuntimeError("no")

    @tool(needs_approval=broken)
    def wipe() -> str:
        """Wipe."""
        raise AssertionError("must not run")

    agent = Agent(name="Ops", instructions="x", tools=[wipe])
    model = ScriptedModel([ScriptedModel.call("wipe")])
    async with Runner(agent, SessionStore(), model=model) as runner:
        result = await runner.run_async(SID, "wipe")
    assert result.pending_approval is not None
    assert result.content == "May I wipe?"


async def test_other_calls_of_the_answer_run_and_a_second_gated_one_waits() -> None:
    log: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            ScriptedModel.calls(
                ("balance", {}),
                ("refund", {"order_id": "1", "amount": 1}),
                ("refund", {"order_id": "2", "amount": 2}),
            ),
            ScriptedModel.reply("Refunded."),
        ]
    )
    store = SessionStore()
    async with Runner(_refund_agent(log), store, model=model) as runner:
        paused = await runner.run_async(SID, "balance and two refunds")
        assert log == [{"balance": True}]
        assert paused.pending_approval is not None
        assert paused.pending_approval.arguments == {"order_id": "1", "amount": 1}
        session = await store.get(SID)
        assert session is not None
        _assert_valid(session.history)
        results = [m.content for m in session.history if m.role is Role.TOOL]
        assert results[0] == "42"
        assert WAITING_RESULT in (results[1] or "")
        await runner.resume_async(SID, paused.pending_approval, "approved")
    assert log == [{"balance": True}, {"order_id": "1", "amount": 1}]
    _assert_valid(session.history)


async def test_a_new_message_while_pending_is_answered_and_the_approval_still_resumes() -> None:
    log: list[dict[str, Any]] = []
    model = ScriptedModel(
        [
            ScriptedModel.call("refund", order_id="7", amount=3),
            ScriptedModel.reply("It is 42."),
            ScriptedModel.reply("Refund done."),
        ]
    )
    store = SessionStore()
    async with Runner(_refund_agent(log), store, model=model) as runner:
        paused = await runner.run_async(SID, "refund 7")
        other = await runner.run_async(SID, "what's my balance?")
        assert other.content == "It is 42."
        assert paused.pending_approval is not None
        result = await runner.resume_async(SID, paused.pending_approval, "approved")
    assert result.content == "Refund done."
    assert log == [{"order_id": "7", "amount": 3}]
    session = await store.get(SID)
    assert session is not None
    _assert_valid(session.history)
    _assert_valid(list(model.requests[-1].messages))


async def test_a_resumed_turn_that_fails_rolls_back_like_any_turn() -> None:
    model = ScriptedModel([ScriptedModel.call("refund", order_id="7", amount=3)])
    store = SessionStore()
    async with Runner(_refund_agent([]), store, model=model) as runner:
        paused = await runner.run_async(SID, "refund 7")
        session = await store.get(SID)
        assert session is not None
        before = list(session.history)
        assert paused.pending_approval is not None
        with pytest.raises(ChatflowError):  # the script is exhausted: the model fails
            await runner.resume_async(SID, paused.pending_approval, "denied")
    assert session.history == before


def test_needs_approval_must_be_a_bool_a_question_or_a_callable() -> None:
    with pytest.raises(TypeError):

        @tool(needs_approval=cast(Any, 42))
        def nope() -> str:
            """No."""
            return ""

    with pytest.raises(ValueError):

        @tool(needs_approval=" ")
        def blank() -> str:
            """No."""
            return ""


async def _ask(needs_approval: Any, **arguments: Any) -> tuple[Any, list[str]]:
    """A turn whose model calls ``pay(**arguments)`` under ``needs_approval``: its result
    and the tool's runs."""
    ran: list[str] = []

    @tool(needs_approval=needs_approval)
    def pay(order_id: str, amount: float, note: str = "") -> str:
        """Pay a customer back (the shop's own money).

        Args:
            order_id: The order.
            amount: How much.
            note: A note to the bank.
        """
        ran.append(order_id)
        return "paid"

    agent = Agent(name="Payer", instructions="Pay.", tools=[pay])
    model = ScriptedModel([ScriptedModel.call("pay", **arguments), ScriptedModel.reply("ok")])
    async with Runner(agent, SessionStore(), model=model) as runner:
        result = await runner.run_async(SID, "pay")
    return result, ran


async def test_the_default_question_reads_as_a_question_to_a_customer() -> None:
    """N4: built from the description and the values, not ``name=value`` pairs."""
    result, ran = await _ask(True, order_id="1042", amount=25.5)
    assert result.content == "May I pay a customer back?\nOrder id: 1042\nAmount: 25.5"
    assert "=" not in result.content and ran == []
    assert [b.label for b in result.buttons] == ["Approve", "Deny"]  # everything is shown


async def test_a_tool_sets_its_own_question_as_a_template_or_a_function() -> None:
    result, _ = await _ask(
        "May I refund order {order_id} for {amount:.2f}?", order_id="1042", amount=25
    )
    assert result.content == "May I refund order 1042 for 25.00?"

    def ask(ctx: ToolContext, args: dict[str, Any]) -> str:
        return f"Pay back order {args['order_id']} ({args['amount']})?"

    result, _ = await _ask(ask, order_id="1042", amount=25)
    assert result.content == "Pay back order 1042 (25)?"
    assert [b.label for b in result.buttons] == ["Approve", "Deny"]
    # A template that does not fit the call falls back to the default question.
    result, _ = await _ask("Refund {missing}?", order_id="1042", amount=25)
    assert result.content.startswith("May I pay a customer back?")


async def test_a_check_declines_before_asking_and_the_model_reads_why() -> None:
    async def unpaid(ctx: ToolContext, args: dict[str, Any]) -> Decline:
        return Decline("Order 1042 has not been paid, so there is nothing to pay back.")

    result, ran = await _ask(unpaid, order_id="1042", amount=25)
    assert result.pending_approval is None and ran == [] and result.content == "ok"
    session = result.new_messages
    [tool_result] = [m.content for m in session if m.role is Role.TOOL]
    assert tool_result is not None and "has not been paid" in tool_result


async def test_arguments_cut_in_the_question_add_a_details_button() -> None:
    """G5: the question cannot show the whole call, so Details sends it in full."""
    long_note = "P.S. card 4111 1111 1111 1111 " + "x" * 300
    result, _ = await _ask(True, order_id="1042", amount=25, note=long_note)
    pending = result.pending_approval
    assert pending is not None and not pending.shows_all
    assert long_note not in result.content
    assert [b.label for b in result.buttons] == ["Approve", "Deny", DETAILS]
    assert parse_approval_button(result.buttons[2].effective_value) == (
        pending.approval_id,
        "details",
    )
    assert long_note in details_text(pending.tool_name, pending.arguments)
    # A tool's own question that leaves an argument out offers Details too.
    result, _ = await _ask("May I pay back order {order_id}?", order_id="1042", amount=25)
    assert [b.label for b in result.buttons] == ["Approve", "Deny", DETAILS]
