"""Benchmark: tokens sent per turn over a 200-turn conversation, with and without compaction.

One conversation of ``TURNS`` user messages runs twice in this one process, through
the real ``Runner`` and an in-memory store: with the product's pruning alone
(``MAX_TURNS`` 40, dropping to 30) and with ``Compaction(trigger_tokens=TRIGGER,
keep_recent_turns=KEEP)`` on top. About every second turn the model first calls a
tool; answers are 250-350 characters; the order number is given (and looked up)
once, in turn 2. The
model is a deterministic stand-in, and its summaries keep the lines that carry
an order number (each once, the last ``SUMMARY_LINES``), as a summary that
keeps ids would.

Each request is rendered as ``OpenAICompatibleModel`` sends it (the same JSON:
model, tools, then messages) and measured in bytes; tokens are bytes / 4 (the
ratio between the two runs is what is judged, not the count). Per request:
its tokens, and its prefix-stable share -- the bytes equal to the previous
request's prefix over its bytes, what a provider's prompt cache can match
(OpenAI: from 1,024 tokens, in 128-token steps, as ``prompt_cost``). Summary
requests are counted as what they cost: tokens sent too.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import sys
from collections.abc import Sequence
from typing import Any

from bench.common import print_table, write_result
from bench.prompt_cost import SYSTEM_PROMPT, WORDS, cacheable, sentence
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.compaction import SUMMARY_INSTRUCTIONS, Compaction
from bot.core.messages import Message, Role
from bot.core.models.base import ModelResponse, OnText, ToolSpec
from bot.core.models.openai_compat import _to_openai_tools, to_openai_messages
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.in_memory import SessionStore
from bot.core.tools import tool

NAME = "compaction_cost"
TURNS = 200
TRIGGER = 3000
KEEP = 8
SUMMARY_LINES = 30
ORDER = "ORD-50213"
BUCKET = 20
_ORDER_RE = re.compile(r"ORD-\d+")


@tool
def check_order_status(order_id: str) -> str:
    """Look up an order's shipping status by its number."""
    return f"order {order_id}: in transit, with the carrier since Monday"


@tool
def search_help(topic: str) -> str:
    """Search the shop's help pages."""
    return f"help on {topic}: " + " ".join(WORDS[:12])


class BenchModel:
    """Answers each turn (a tool call every second turn), summarises compaction requests,
    and renders every request as the HTTP body ``OpenAICompatibleModel`` would send."""

    def __init__(self) -> None:
        self.rng = random.Random(30)
        self.bodies: list[bytes] = []
        self.summary_bodies: list[bytes] = []

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        request: dict[str, Any] = {"model": model}
        if tools:
            request["tools"] = _to_openai_tools(tools, None)
        request["messages"] = to_openai_messages(system, messages)
        body = json.dumps(request, ensure_ascii=False).encode()
        if system == SUMMARY_INSTRUCTIONS:
            self.summary_bodies.append(body)
            text = messages[-1].content or ""
            kept = list(dict.fromkeys(ln for ln in text.splitlines() if _ORDER_RE.search(ln)))
            return ModelResponse(content="\n".join(kept[-SUMMARY_LINES:]) or "No order yet.")
        self.bodies.append(body)
        last = messages[-1]
        if last.role is Role.USER and ORDER in (last.content or ""):
            call = ScriptedModel.tool_call("check_order_status", order_id=ORDER)
            return ModelResponse(content=None, tool_calls=[call])
        if last.role is Role.USER and len(self.bodies) % 3 == 1:
            topic = self.rng.choice(WORDS)
            return ModelResponse(tool_calls=[ScriptedModel.tool_call("search_help", topic=topic)])
        return ModelResponse(content=sentence(self.rng, 250, 350))

    async def stream(self, *, on_text: OnText, **request: Any) -> ModelResponse:
        return await self.complete(**request)


def _user_text(rng: random.Random, turn: int) -> str:
    if turn == 2:
        return f"My order number is {ORDER}, where is it?"
    return sentence(rng, 30, 90)


async def conversation(compaction: Compaction | None, turns: int = TURNS) -> dict[str, Any]:
    """Run the conversation; return per-turn tokens and per-request prefix shares."""
    settings = Settings(_env_file=None)
    store = SessionStore(settings.max_turns, prune_to_turns=settings.effective_prune_to_turns)
    model = BenchModel()
    human = Agent(name="Human Desk", instructions="A person answers.", handoff_description="people")
    agent = Agent(
        name="Order Tracking",
        instructions=SYSTEM_PROMPT,
        tools=[check_order_status, search_help],
        handoffs=[human],
        compaction=compaction,
    )
    rng = random.Random(27)
    per_turn: list[int] = []
    summary_per_turn: list[int] = []
    async with Runner(agent, store, model=model, stream_replies=False) as runner:
        for turn in range(1, turns + 1):
            sent, summaries = len(model.bodies), len(model.summary_bodies)
            await runner.run_async("chat", _user_text(rng, turn))
            await runner.compactor.wait_idle()
            per_turn.append(sum(len(b) for b in model.bodies[sent:]) // 4)
            summary_per_turn.append(sum(len(b) for b in model.summary_bodies[summaries:]) // 4)
    shares: list[float] = []
    cached = 0
    previous = b""
    for body in model.bodies:
        prefix = _common_prefix(previous, body)
        shares.append(prefix / len(body))
        cached += cacheable(prefix // 4)
        previous = body
    chat_tokens = sum(len(b) for b in model.bodies) // 4
    summary_tokens = sum(len(b) for b in model.summary_bodies) // 4
    return {
        "compaction": None
        if compaction is None
        else {"trigger_tokens": TRIGGER, "keep_recent_turns": KEEP},
        "tokens_per_turn": per_turn,
        "summary_tokens_per_turn": summary_per_turn,
        "prefix_stable_share": shares,
        "requests": len(model.bodies),
        "summary_requests": len(model.summary_bodies),
        "chat_tokens": chat_tokens,
        "summary_tokens": summary_tokens,
        "total_tokens": chat_tokens + summary_tokens,
        "cacheable_tokens": cached,
        "mean_prefix_stable_share": sum(shares) / len(shares),
        "largest_request_tokens": max(len(b) for b in model.bodies) // 4,
        "order_id_in_last_request": ORDER in model.bodies[-1].decode(),
    }


def _common_prefix(a: bytes, b: bytes) -> int:
    size = min(len(a), len(b))
    low, high = 0, size
    while low < high:  # the longest equal prefix, by halving (bytes compare in C)
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _bucket_rows(plain: dict[str, Any], compacted: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for start in range(0, TURNS, BUCKET):
        end = start + BUCKET
        row = [f"{start + 1}-{end}"]
        for result in (plain, compacted):
            tokens = result["tokens_per_turn"][start:end]
            summary = result["summary_tokens_per_turn"][start:end]
            row.append(f"{(sum(tokens) + sum(summary)) / len(tokens):,.0f}")
        rows.append(row)
    return rows


async def main() -> int:
    plain = await conversation(None)
    compacted = await conversation(Compaction(trigger_tokens=TRIGGER, keep_recent_turns=KEEP))
    print_table(
        f"Tokens sent per turn over {TURNS} turns (bytes / 4; summary requests included)",
        ["turns", "pruning only (40 -> 30)", f"compaction ({TRIGGER:,} tokens, keep {KEEP})"],
        _bucket_rows(plain, compacted),
    )
    rows = []
    for label, result in (("pruning only", plain), ("compaction", compacted)):
        rows.append(
            [
                label,
                f"{result['total_tokens']:,}",
                f"{result['summary_requests']} ({result['summary_tokens']:,})",
                f"{result['largest_request_tokens']:,}",
                f"{result['mean_prefix_stable_share']:.1%}",
                f"{result['cacheable_tokens'] / result['chat_tokens']:.0%}",
                "yes" if result["order_id_in_last_request"] else "no",
            ]
        )
    print_table(
        "Totals",
        [
            "policy",
            "tokens sent",
            "summaries (tokens)",
            "largest request",
            "prefix-stable share",
            "cacheable (OpenAI rule)",
            "turn-2 order id at turn 200",
        ],
        rows,
    )
    write_result(
        NAME,
        {
            "turns": TURNS,
            "words": len(WORDS),
            "pruning_only": plain,
            "compaction": compacted,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
