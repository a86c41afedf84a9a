"""An in-process platform adapter for gateway tests: push events in, read sends out.

The classes are the ones operators get from ``bot.testing``; this module keeps
the names the project's tests import.
"""

from __future__ import annotations

from bot.testing import FakeAdapter, Sent, make_event, transient

__all__ = ["FakeAdapter", "Sent", "make_event", "transient"]
