"""The memory tools, for ``Agent(tools=[*memory_tools])``: ``remember``, ``recall``, ``forget``.

They live in ``bot.core.long_memory`` (see its docstring for the visibility rule).
"""

from __future__ import annotations

from bot.core.long_memory import MemoryPolicy, MemoryScope, forget, memory_tools, recall, remember

__all__ = ["MemoryPolicy", "MemoryScope", "forget", "memory_tools", "recall", "remember"]
