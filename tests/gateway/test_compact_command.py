"""``/compact`` through the gateway: the summary now, a short answer through the ledger."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bot.core.compaction import SUMMARY_INSTRUCTIONS, is_summary
from bot.core.models.base import Usage
from bot.core.models.scripted import ScriptedModel
from bot.errors import ModelError
from bot.gateway.gateway import Replies
from tests.fakes.adapter import make_event
from tests.gateway.conftest import Rig


async def _chat(rig: Rig, count: int) -> None:
    for index in range(count):
        rig.model.add(ScriptedModel.reply(f"answer {index}"))
        await rig.adapter.deliver(make_event(f"message {index}: order ORD-{index}"))
        await rig.adapter.wait_for_sent(index + 1)


async def test_compact_summarises_now_and_says_so(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    await _chat(rig, 8)
    rig.model.add(ScriptedModel.reply("Orders so far: ORD-0, ORD-1"))
    await rig.adapter.deliver(make_event("/compact", command="compact"))
    sent = await rig.adapter.wait_for_sent(9)
    assert sent[8].text == Replies().compacted
    summary_request = rig.model.requests[-1]
    assert summary_request.system == SUMMARY_INSTRUCTIONS
    assert "message 0: order ORD-0" in (summary_request.messages[0].content or "")
    rig.model.add(ScriptedModel.reply("ORD-0, yes"))
    await rig.adapter.deliver(make_event("what was my first order?"))
    await rig.adapter.wait_for_sent(10)
    history = rig.model.requests[-1].messages
    assert is_summary(history[0]) and "ORD-0, ORD-1" in (history[0].content or "")
    users = [m.content for m in history if m.role.value == "user"]
    assert len(users) == 6 + 1  # the kept turns and the new one
    conversation = await rig.store.conversation(await _sid(rig))
    assert conversation is not None and sum(c for _, c in conversation) == 4  # 2 turns


async def test_compact_that_fails_leaves_the_conversation_and_apologises(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    await _chat(rig, 7)
    sid = await _sid(rig)
    before = [m.model_dump_json() for m, _ in await rig.store.conversation(sid) or []]
    rig.model.add(ModelError("down", retryable=True))
    await rig.adapter.deliver(make_event("/compact", command="compact"))
    sent = await rig.adapter.wait_for_sent(8)
    assert sent[7].text == Replies().compact_failed
    after = [m.model_dump_json() for m, _ in await rig.store.conversation(sid) or []]
    assert after == before


async def test_compact_on_a_short_conversation_has_nothing_to_do(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    await _chat(rig, 2)
    await rig.adapter.deliver(make_event("/compact", command="compact"))
    sent = await rig.adapter.wait_for_sent(3)
    assert sent[2].text == Replies().compact_nothing
    assert len(rig.model.requests) == 2


def test_help_names_compact() -> None:
    assert "/compact" in Replies().help and "/reset" in Replies().help


async def _sid(rig: Rig) -> str:
    (session_id,) = await rig.store.list_sessions()  # the rig's one conversation
    return session_id


SUMMARY_USAGE = Usage(input_tokens=5000, output_tokens=300)


async def _usage_rows(rig: Rig) -> list[tuple[str, str | None, int, int]]:
    async with rig.store.transaction() as tx:
        rows = await tx.fetchall(
            "SELECT kind, sender, prompt_tokens, completion_tokens FROM chatflow_usage ORDER BY id"
        )
    return [(str(k), None if s is None else str(s), int(p), int(c)) for k, s, p, c in rows]


@pytest.mark.parametrize(
    ("summary", "answer"),
    [
        pytest.param("Orders so far: ORD-0, ORD-1", "compacted", id="kept"),
        pytest.param("", "compact_failed", id="thrown-away"),
    ],
)
async def test_a_summary_is_billed_in_metrics_and_usage_to_the_sender_kept_or_not(
    rigs: Callable[..., object], summary: str, answer: str
) -> None:
    # G10: the summary call reached neither /metrics nor, when its summary was thrown
    # away, the usage table; and its row named no sender, so budgets never saw it.
    rig: Rig = await rigs()  # type: ignore[misc]
    await _chat(rig, 7)
    rig.model.add(ScriptedModel.reply(summary, usage=SUMMARY_USAGE))
    await rig.adapter.deliver(make_event("/compact", command="compact"))
    sent = await rig.adapter.wait_for_sent(8)
    assert sent[7].text == getattr(Replies(), answer)
    rows = await _usage_rows(rig)
    chat_senders = {sender for kind, sender, _, _ in rows if kind == "chat"}
    assert len(chat_senders) == 1 and None not in chat_senders
    assert [r for r in rows if r[0] == "compaction"] == [("compaction", *chat_senders, 5000, 300)]
    value = rig.gateway.metrics.registry.get_sample_value
    labels = {"agent": "Helper", "call": "compaction"}
    assert value("chatflow_tokens_total", {**labels, "kind": "prompt"}) == 5000
    assert value("chatflow_tokens_total", {**labels, "kind": "completion"}) == 300
