"""The garbage collector's settings for a long-running bot process.

Python's cycle collector is tuned for short scripts: a young collection every
700 net allocations, and a full collection that walks every object the
process holds. A bot holds tens of thousands of objects from start-up
(modules, classes, the agents, settings, compiled schemas) that live until it
stops, and every message allocates a few hundred short-lived ones (events,
messages, futures, tasks) that die by reference counting, not by the
collector. With the defaults, the pipeline of ``bench/`` ran about 590
collections in 4 s at 10 sessions (4 of them full walks of the start-up heap,
about 35 ms each) and they collected nothing: 50-70 µs of each message's CPU
(docs/ARCHITECTURE.md, "Decisions").

``settle_after_start`` runs once the bot is up: one full collection, then
``gc.freeze()`` moves what survived into the permanent generation (never
walked again, as the CPython docs advise for a server after start-up), and the
young threshold rises to ``YOUNG_THRESHOLD``. Cycles are still collected: the
collector still runs, only less often and over fewer objects.

Only the process's entry point calls it (``bot run``, ``bot chat``): it is a
setting of the whole interpreter, which a test or an embedding program owns.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "settle_after_start"]

YOUNG_THRESHOLD = 10_000
"""Net allocations between young collections (CPython's default is 700; 3.13 uses 2,000).
Large enough that a message's short-lived objects die by reference count in between."""


def settle_after_start() -> None:
    """Collect once, freeze the start-up heap and raise the young threshold."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, gc.get_threshold()[0]), middle, old)
