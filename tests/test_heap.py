"""The garbage collector's settings once the bot is up (``bot.heap``)."""

from __future__ import annotations

import json
import subprocess
import sys

from bot.heap import YOUNG_THRESHOLD

_PROBE = """
import gc, json
from bot.heap import settle_after_start
before = gc.get_threshold()
settle_after_start()
after = gc.get_threshold()
# A cycle made after start-up is still collected.
class Node: pass
node = Node(); node.self = node; del node
found = gc.collect()
print(json.dumps({"before": before, "after": after, "frozen": gc.get_freeze_count(),
                  "collected": found}))
"""


def test_settling_freezes_the_start_up_heap_and_raises_only_the_young_threshold() -> None:
    # In a child: the setting is the whole interpreter's, not this test run's.
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=True
    )
    seen = json.loads(done.stdout)
    assert seen["after"] == [YOUNG_THRESHOLD, *seen["before"][1:]]
    assert seen["frozen"] > 1000  # the modules, classes and functions imported so far
    assert seen["collected"] >= 1  # the cycle


def test_the_bot_leaves_its_hosts_collector_alone_unless_asked() -> None:
    from bot.app import Bot
    from bot.config import Settings

    assert Bot(Settings(_env_file=None)).settle_heap is False
