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

Memory (issue 39): a ``MEMORY_TURNS``-turn conversation of an agent with the
memory tools, where the person has a new fact remembered every
``MEMORY_EVERY`` turns: each request's system prompt carries the memory block
(``bot.core.long_memory.memory_block``, ``MEMORY_PROMPT_CHARS``' default bound)
after the instructions. Its cost in prompt tokens and the cacheable share are
set beside the same conversation without memory; the share must stay >= 85 %.
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
from bot.core.long_memory import Memory, memory_block
from bot.core.messages import Message, Role, ToolCall
from bot.core.stores.in_memory import SessionStore

NAME = "prompt_cost"
TURNS = 150
MEMORY_TURNS = 100
MEMORY_EVERY = 10
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


def _fact(n: int, rng: random.Random) -> Memory:
    text = "prefers " + sentence(rng, 20, 60)
    return Memory(f"mem_{n:012x}", "me", "telegram", "u", "c", "", True, text, "s", 1.8e9 + n)


async def conversation(
    max_turns: int, prune_to: int, turns: int = TURNS, memory_every: int = 0, bound: int = 0
) -> dict[str, Any]:
    """Run the conversation; return its token totals.

    ``memory_every``: a fact is remembered every that many turns (0: no memory), shown
    in a block of at most ``bound`` characters after the instructions.
    """
    rng = random.Random(27)
    store = SessionStore(default_max_turns=max_turns, prune_to_turns=prune_to)
    agent = Agent(name="Order Tracking", instructions=SYSTEM_PROMPT)
    tools = [json.dumps(t, sort_keys=True) for t in TOOLS]
    memories: list[Memory] = []
    seen: list[list[str]] = []
    total = cached = block_tokens = 0

    def request(session: Any) -> None:
        nonlocal total, cached, block_tokens
        block = memory_block(memories, bound)
        system = f"{SYSTEM_PROMPT}\n\n{block}" if block else SYSTEM_PROMPT
        block_tokens += tokens(system) - tokens(SYSTEM_PROMPT)
        fixed = [*tools, json.dumps({"role": "system", "content": system})]
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
            if memory_every and n % memory_every == memory_every - 1:
                memories.append(_fact(n, rng))  # remembered in this turn: shown from the next
    await store.close()
    return {
        "memories": len(memories),
        "memory_block_tokens": block_tokens,
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
    memory = await _memory_figures(settings, high, low)
    write_result(
        NAME,
        {"turns": TURNS, "product": product, "one_at_a_time": one_at_a_time, "memory": memory},
    )
    return 0


async def _memory_figures(settings: Settings, high: int, low: int) -> dict[str, Any]:
    bound = settings.memory_prompt_chars
    plain = await conversation(high, low, MEMORY_TURNS)
    kept = await conversation(high, low, MEMORY_TURNS, MEMORY_EVERY, bound)
    rows = [
        [
            label,
            f"{r['input_tokens']:,}",
            f"{r['memory_block_tokens']:,} ({r['memory_block_tokens'] / r['input_tokens']:.1%})",
            f"{r['cacheable_share']:.1%}",
        ]
        for label, r in (
            ("no memory", plain),
            (
                f"a fact every {MEMORY_EVERY} turns ({kept['memories']}, block <= {bound} chars)",
                kept,
            ),
        )
    ]
    print_table(
        f"The memory block over {MEMORY_TURNS} turns",
        ["conversation", "input tokens", "memory block tokens", "cacheable share"],
        rows,
    )
    met = kept["cacheable_share"] >= TARGET_SHARE
    print(
        f"cacheable share with memory {kept['cacheable_share']:.1%} "
        f"(target >= {TARGET_SHARE:.0%}): {'PASS' if met else 'MISS'}"
    )
    return {"turns": MEMORY_TURNS, "every": MEMORY_EVERY, "without": plain, "with": kept}


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
