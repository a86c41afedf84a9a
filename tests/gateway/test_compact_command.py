"""``/compact`` through the gateway: the summary now, a short answer through the ledger."""

from __future__ import annotations

from collections.abc import Callable

from bot.core.compaction import SUMMARY_INSTRUCTIONS, is_summary
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
