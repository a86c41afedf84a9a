"""The memory tools: ``remember``, ``recall`` and ``forget`` (``memory_tools``, the three).

Opt-in per agent: ``Agent(..., tools=[*memory_tools])``. Every call is judged in
the scope the host set for the turn (``bot.core.long_memory.scope``): what the
model passes is a fact, a query or an id, never a person or a chat, and an id is
looked up among the memories visible here, never trusted. Writes are requests on
the turn (``ToolContext.effects``), committed with its answer (``records``).

The host hands its limits in ``ToolContext.services[POLICY]`` (``MemoryPolicy``:
``MAX_MEMORIES_PER_PERSON``, ``MAX_MEMORY_CHARS``, ``MEMORY_PROMPT_CHARS``).
Without a scope or a SQL store (``Runner`` alone) the tools answer that memory
is not available here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from bot.core.long_memory.records import (
    ForgetRequest,
    Memory,
    RememberRequest,
    count_remembered_by,
    rank,
    visible_memories,
)
from bot.core.long_memory.scope import MemoryScope, current_scope
from bot.core.stores.base import TransactionalStore
from bot.core.tools import FunctionTool, ToolContext, error_result, tool

__all__ = [
    "DEFAULT_MAX_MEMORIES_PER_PERSON",
    "DEFAULT_MAX_MEMORY_CHARS",
    "DEFAULT_MEMORY_PROMPT_CHARS",
    "POLICY",
    "MemoryPolicy",
    "forget",
    "memory_policy",
    "memory_tools",
    "recall",
    "remember",
]

DEFAULT_MAX_MEMORIES_PER_PERSON: Final = 200
DEFAULT_MAX_MEMORY_CHARS: Final = 500
DEFAULT_MEMORY_PROMPT_CHARS: Final = 2000
POLICY: Final = "memory"
"""Key of the ``MemoryPolicy`` in ``ToolContext.services``."""
RECALL_LIMIT: Final = 10


@dataclass(frozen=True, slots=True)
class MemoryPolicy:
    """The host's limits for the memory tools and the prompt block."""

    max_per_person: int = DEFAULT_MAX_MEMORIES_PER_PERSON
    max_chars: int = DEFAULT_MAX_MEMORY_CHARS
    prompt_chars: int = DEFAULT_MEMORY_PROMPT_CHARS


def memory_policy(services: Mapping[str, object]) -> MemoryPolicy:
    """The host's policy in ``services``, else the defaults."""
    policy = services.get(POLICY)
    return policy if isinstance(policy, MemoryPolicy) else MemoryPolicy()


_UNAVAILABLE: Final = (
    "memory is not available here (it needs the running bot, its database and a person's message)"
)


def _host(ctx: ToolContext) -> tuple[TransactionalStore, MemoryScope] | None:
    store: object = ctx.store
    scope = current_scope()
    if not isinstance(store, TransactionalStore) or scope is None:
        return None
    return store, scope


def _pending(ctx: ToolContext) -> tuple[list[RememberRequest], set[str]]:
    added = [e for e in ctx.effects if isinstance(e, RememberRequest)]
    removed = {e.memory_id for e in ctx.effects if isinstance(e, ForgetRequest)}
    return added, removed


async def _visible(ctx: ToolContext, store: TransactionalStore, scope: MemoryScope) -> list[Memory]:
    """What this turn sees: the committed visible memories and its own pending ones."""
    added, removed = _pending(ctx)
    now = store.now().timestamp()
    found = [m for m in await visible_memories(store, scope) if m.memory_id not in removed]
    found += [
        Memory(
            r.memory_id,
            r.about,
            scope.platform,
            scope.person or "",
            scope.chat,
            scope.thread,
            scope.private,
            r.text,
            ctx.session_id,
            now,
        )
        for r in added
        if r.memory_id not in removed
    ]
    return found


def _shown(memory: Memory) -> dict[str, str]:
    return {"id": memory.memory_id, "text": memory.text, "about": memory.about, "date": memory.date}


@tool(name="remember")
async def _remember(ctx: ToolContext, fact: str, about: Literal["me", "chat"] = "me") -> str:
    """Remember a short fact for later conversations (a preference, a name, a detail the
    user wants kept). Store only what the user told you or asked you to keep.

    Args:
        fact: The fact, short and self-contained (e.g. "prefers email to phone calls").
        about: "me": about the person speaking (shown only to them); "chat": about
            this group or topic (shown to everyone here).
    """
    host = _host(ctx)
    if host is None:
        return error_result(_UNAVAILABLE)
    store, scope = host
    policy = memory_policy(ctx.services)
    text = " ".join(fact.split())
    if not text:
        return error_result("fact is empty: give the fact to remember")
    if len(text) > policy.max_chars:
        return error_result(
            f"fact is {len(text)} characters, over the limit of {policy.max_chars}: "
            "shorten it to the essential"
        )
    if about not in ("me", "chat"):
        return error_result(f'about must be "me" or "chat", not {about!r}')
    if scope.person is None:
        return error_result("nobody is speaking in this turn: there is no one to remember for")
    visible = await _visible(ctx, store, scope)
    for memory in visible:
        if memory.about == about and memory.text.casefold() == text.casefold():
            return json.dumps({"id": memory.memory_id, "status": "already remembered"})
    added, removed = _pending(ctx)
    made = await count_remembered_by(store, scope.platform, scope.person)
    if made + len(added) - len(removed) >= policy.max_per_person:
        return error_result(
            f"this person already has {policy.max_per_person} memories (the limit): "
            "forget one first (recall lists them)"
        )
    memory_id = f"mem_{uuid.uuid4().hex[:12]}"
    ctx.effects.append(RememberRequest(memory_id, text, about))
    return json.dumps({"id": memory_id, "status": "remembered", "about": about})


@tool(name="recall")
async def _recall(ctx: ToolContext, query: str) -> str:
    """Look up what you remember that matches the query (best matches first): each
    memory's id, text, whom it is about and the day it was remembered.

    Args:
        query: Words to look for (e.g. "birthday", "delivery address").
    """
    host = _host(ctx)
    if host is None:
        return error_result(_UNAVAILABLE)
    store, scope = host
    found = rank(await _visible(ctx, store, scope), query, RECALL_LIMIT)
    return json.dumps({"memories": [_shown(m) for m in found]}, ensure_ascii=False)


@tool(name="forget")
async def _forget(ctx: ToolContext, memory_id: str) -> str:
    """Forget one memory (when the user asks, or a fact is no longer true).

    Args:
        memory_id: The memory's id, as remember or recall gave it.
    """
    host = _host(ctx)
    if host is None:
        return error_result(_UNAVAILABLE)
    store, scope = host
    known = {m.memory_id for m in await _visible(ctx, store, scope)}
    if memory_id not in known:
        return error_result(f"no memory {memory_id!r} here (recall lists the ones you can forget)")
    ctx.effects.append(ForgetRequest(memory_id))
    return json.dumps({"id": memory_id, "status": "forgotten"})


remember: FunctionTool = _remember
"""Tool: remember a short fact about the person speaking or about this chat."""
recall: FunctionTool = _recall
"""Tool: the visible memories matching a query, best first."""
forget: FunctionTool = _forget
"""Tool: forget one visible memory by id."""
memory_tools: Final[list[FunctionTool]] = [remember, recall, forget]
"""The three memory tools, to spread into ``Agent(tools=[...])``."""
