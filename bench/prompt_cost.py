"""Benchmark: how much of a long conversation's input a provider's prompt cache can reuse.

One conversation of ``TURNS`` user messages runs through a store built as
``bot.database.open_store`` builds it (``MAX_TURNS`` and ``PRUNE_TO_TURNS`` from
``Settings``' defaults); every second turn the model first calls a tool, then
answers in 250-350 characters. Each model call sends the system prompt, the
tool schemas and the session's history as it is at that moment.

For every request: its tokens (characters / 4 plus 4 per message of framing:
the ratio is what is judged, not the count) and the longest prefix it shares
with any earlier request, of which a provider caches whole steps (OpenAI:
prefixes of at least 1,024 tokens, in 128-token steps). The cacheable share
over the conversation is judged against issue 27's target (>= 85 %), beside
the same conversation pruned one turn at a time (``PRUNE_TO_TURNS=MAX_TURNS``).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from typing import Any

from bench.common import print_table, write_result
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.messages import Message, Role, ToolCall
from bot.core.stores.in_memory import SessionStore

NAME = "prompt_cost"
TURNS = 150
TARGET_SHARE = 0.85
SYSTEM_PROMPT = (
    "You are the order-tracking assistant of an online shop. Answer briefly and politely, "
    "look orders up with the tool before answering questions about them, never invent "
    "tracking numbers, and hand over to a human when the customer asks for one. " * 2
)
TOOLS = [
    {
        "type": "function",
        "name": "check_order_status",
        "description": "Look up an order's shipping status by its number.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string", "description": "The order number"}},
            "required": ["order_id"],
        },
    },
    {
        "type": "function",
        "name": "transfer_to_human",
        "description": "Hand the conversation over to a human agent.",
        "parameters": {"type": "object", "properties": {}},
    },
]
WORDS = (
    "order",
    "parcel",
    "carrier",
    "delivery",
    "tomorrow",
    "tracking",
    "number",
    "warehouse",
    "address",
    "window",
    "neighbour",
    "pick-up",
    "point",
    "e-mail",
    "link",
    "estimate",
    "morning",
    "evening",
    "signature",
    "DHL",
)


def tokens(text: str) -> int:
    return (len(text) + 3) // 4 + 4


def cacheable(prefix: int) -> int:
    """What OpenAI's cache reuses of a shared prefix of ``prefix`` tokens."""
    return 0 if prefix < 1024 else 1024 + (prefix - 1024) // 128 * 128


def wire(message: Message) -> str:
    """A message as a chat-completions body holds it (no ids or timestamps: none is sent)."""
    body: dict[str, Any] = {"role": message.role.value, "content": message.content}
    if message.tool_calls:
        body["tool_calls"] = [
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in message.tool_calls
        ]
    if message.tool_call_id:
        body["tool_call_id"] = message.tool_call_id
    return json.dumps(body, sort_keys=True)


def sentence(rng: random.Random, low: int, high: int) -> str:
    size = rng.randint(low, high)
    words: list[str] = []
    while len(" ".join(words)) < size:
        words.append(rng.choice(WORDS))
    return " ".join(words)[:size]


async def conversation(max_turns: int, prune_to: int, turns: int = TURNS) -> dict[str, Any]:
    """Run the conversation; return its token totals."""
    rng = random.Random(27)
    store = SessionStore(default_max_turns=max_turns, prune_to_turns=prune_to)
    agent = Agent(name="Order Tracking", instructions=SYSTEM_PROMPT)
    fixed = [json.dumps(t, sort_keys=True) for t in TOOLS] + [
        json.dumps({"role": "system", "content": SYSTEM_PROMPT})
    ]
    seen: list[list[str]] = []
    total = cached = 0

    def request(session: Any) -> None:
        nonlocal total, cached
        pieces = fixed + [wire(m) for m in session.history]
        sizes = [tokens(p) for p in pieces]
        best = 0
        for old in seen:
            k = 0
            limit = min(len(old), len(pieces))
            while k < limit and old[k] == pieces[k]:
                k += 1
            best = max(best, sum(sizes[:k]))
        seen.append(pieces)
        total += sum(sizes)
        cached += cacheable(best)

    for n in range(turns):
        async with store.session_lock("chat"):
            session = await store.get_or_create("chat", agent)
            session.add_message(Message(role=Role.USER, content=f"#{n} " + sentence(rng, 30, 90)))
            request(session)
            if n % 2 == 0:
                call = ToolCall(id=f"call_{n}", name="check_order_status", arguments={"n": n})
                session.add_message(Message(role=Role.MODEL, tool_calls=[call]))
                session.add_message(
                    Message(
                        role=Role.TOOL,
                        tool_call_id=call.id,
                        name=call.name,
                        content=f"order {n}: " + sentence(rng, 60, 120),
                    )
                )
                request(session)
            answer = sentence(rng, 250, 350)
            session.add_message(Message(role=Role.MODEL, content=answer, agent=agent.name))
            await store.save(session)
    await store.close()
    return {
        "max_turns": max_turns,
        "prune_to_turns": prune_to,
        "requests": len(seen),
        "input_tokens": total,
        "cacheable_tokens": cached,
        "cacheable_share": cached / total if total else 0.0,
        "cost_at_10pct": total - 0.9 * cached,
    }


async def main() -> int:
    settings = Settings(_env_file=None)  # the product's defaults
    high, low = settings.max_turns, settings.effective_prune_to_turns
    product = await conversation(high, low)
    one_at_a_time = await conversation(high, high)
    rows = [
        [
            f"{label}: keep <= {r['max_turns']}, drop to {r['prune_to_turns']}",
            f"{r['input_tokens']:,}",
            f"{r['cacheable_tokens']:,}",
            f"{r['cacheable_share']:.0%}",
            f"{r['cost_at_10pct']:,.0f}",
        ]
        for label, r in (("product", product), ("one turn at a time", one_at_a_time))
    ]
    print_table(
        f"Prompt caching over {TURNS} turns (tokens ~ characters / 4)",
        ["policy", "input tokens", "cacheable", "share", "cost at 10 % cached price"],
        rows,
    )
    met = product["cacheable_share"] >= TARGET_SHARE
    print(
        f"cacheable share {product['cacheable_share']:.1%} (target >= {TARGET_SHARE:.0%}): "
        f"{'PASS' if met else 'MISS'}"
    )
    write_result(NAME, {"turns": TURNS, "product": product, "one_at_a_time": one_at_a_time})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
