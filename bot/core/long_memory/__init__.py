"""Long-term memory: facts the bot keeps about a person or a chat, across conversations.

Not ``bot.core.memory`` (the seeds' session module). ``scope`` holds the
visibility rule, ``schema`` the table, ``records`` the reads and the writes made
at a turn's commit, ``tools`` the ``remember``/``recall``/``forget`` tools and
``block`` the facts shown to the model after its instructions.
"""

from __future__ import annotations

from bot.core.long_memory.block import block_bound, memory_block, system_prompt
from bot.core.long_memory.records import (
    ForgetRequest,
    Memory,
    RememberRequest,
    apply_memory_in,
    delete_memory,
    list_memories,
    rank,
    visible_memories,
)
from bot.core.long_memory.schema import TABLE, ensure_memory_schema_in
from bot.core.long_memory.scope import (
    About,
    MemoryScope,
    current_scope,
    is_visible,
    speaking_as,
    visible_sql,
)
from bot.core.long_memory.tools import (
    POLICY,
    MemoryPolicy,
    forget,
    memory_tools,
    recall,
    remember,
)

__all__ = [
    "POLICY",
    "TABLE",
    "About",
    "ForgetRequest",
    "Memory",
    "MemoryPolicy",
    "MemoryScope",
    "RememberRequest",
    "apply_memory_in",
    "block_bound",
    "current_scope",
    "delete_memory",
    "ensure_memory_schema_in",
    "forget",
    "is_visible",
    "list_memories",
    "memory_block",
    "memory_tools",
    "rank",
    "recall",
    "remember",
    "speaking_as",
    "system_prompt",
    "visible_memories",
    "visible_sql",
]
