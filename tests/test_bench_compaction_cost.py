"""``bench/compaction_cost.py`` measures what it says, on a shorter conversation."""

from __future__ import annotations

from bench.compaction_cost import KEEP, TRIGGER, conversation
from bot.core.compaction import Compaction


async def test_compaction_sends_fewer_tokens_and_keeps_the_order_id() -> None:
    plain = await conversation(None, turns=70)
    compacted = await conversation(Compaction(TRIGGER, KEEP), turns=70)
    assert plain["summary_requests"] == 0 and compacted["summary_requests"] >= 1
    assert compacted["total_tokens"] < plain["total_tokens"]
    assert compacted["largest_request_tokens"] < plain["largest_request_tokens"]
    assert compacted["order_id_in_last_request"] and not plain["order_id_in_last_request"]
    for result in (plain, compacted):
        assert len(result["tokens_per_turn"]) == 70
        shares = result["prefix_stable_share"]
        assert len(shares) == result["requests"] and all(0 <= s <= 1 for s in shares)
        assert result["mean_prefix_stable_share"] > 0.8
