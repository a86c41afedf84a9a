"""The control-character check of ``bot.core.paths`` against Unicode's own category."""

from __future__ import annotations

import sys
import unicodedata

from bot.core.paths import is_path_unsafe, is_session_key_unsafe


def test_every_control_character_and_only_those_is_refused() -> None:
    controls = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) == "Cc"]
    others = "aZ09-_.é中😀\u200b\u2028\ufeff"
    assert all(is_path_unsafe(f"a{ch}b") for ch in controls)
    assert all(is_session_key_unsafe(f"a{ch}b") for ch in controls)
    assert not any(is_path_unsafe(f"a{ch}b") for ch in others)
    assert not any(is_session_key_unsafe(f"a{ch}b") for ch in others)
