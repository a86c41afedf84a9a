"""Splitting long replies into platform-sized parts.

Platforms cap the length of one message (Telegram: 4096 UTF-16 code units,
WhatsApp: 4096 characters). ``split_text`` cuts a text into ordered parts that
each fit, preferring the most natural boundary: paragraph, then line, then
sentence, then word. It cuts inside a word only when no boundary fits, and
even then never between a character and the combining mark, variation
selector, skin-tone modifier or zero-width joiner that belongs to it, never
inside a flag (regional-indicator pair) and never between CR and LF.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

__all__ = ["split_text", "utf16_len"]

_PARAGRAPH = re.compile(r"\n[^\S\n]*\n")
_LINE = re.compile(r"\n")
# Western sentence ends need following whitespace ("3.14" is not a sentence end);
# CJK full-width punctuation ends a sentence by itself.
_SENTENCE = re.compile(r"(?<=[.!?…])\s|(?<=[。！？])")
# Word boundaries: whitespace except the no-break spaces, which exist to prevent a cut.
_WORD = re.compile(r"[^\S\u00a0\u2007\u202f]")

_ZWJ = "\u200d"
_MIN_FILL = 0.5
"""A paragraph, line or sentence boundary is used only if the part it makes
fills at least this share of the room; otherwise a later, finer boundary wins
so parts do not come out needlessly short."""


def utf16_len(text: str) -> int:
    """Length of ``text`` in UTF-16 code units, the unit Telegram counts in."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _is_regional_indicator(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _extends_previous(ch: str) -> bool:
    """True when ``ch`` belongs to the grapheme of the character before it."""
    if ch == _ZWJ:
        return True
    if "\ufe00" <= ch <= "\ufe0f" or "\U000e0100" <= ch <= "\U000e01ef":
        return True  # variation selectors (emoji vs text presentation)
    if "\U0001f3fb" <= ch <= "\U0001f3ff":
        return True  # skin-tone modifiers
    if "\U000e0020" <= ch <= "\U000e007f":
        return True  # tag characters (subdivision flags)
    return unicodedata.category(ch) in ("Mn", "Mc", "Me")


def _is_safe_cut(text: str, index: int) -> bool:
    """Whether cutting ``text`` before ``index`` keeps every grapheme whole."""
    if index <= 0 or index >= len(text):
        return True
    before, after = text[index - 1], text[index]
    if before == _ZWJ or _extends_previous(after):
        return False
    if before == "\r" and after == "\n":
        return False
    if _is_regional_indicator(before) and _is_regional_indicator(after):
        # Inside a flag when an odd number of indicators precede the cut.
        run = 0
        i = index - 1
        while i >= 0 and _is_regional_indicator(text[i]):
            run += 1
            i -= 1
        return run % 2 == 0
    return True


def _fitting_prefix(text: str, limit: int, length: Callable[[str], int]) -> int:
    """Largest ``n`` with ``length(text[:n]) <= limit`` (binary search)."""
    lo, hi = 0, min(len(text), limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if length(text[:mid]) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _boundary_cut(text: str, room: int, pattern: re.Pattern[str], min_cut: int) -> int | None:
    """Start of the last ``pattern`` match at or before ``room`` that makes a useful part."""
    best: int | None = None
    for match in pattern.finditer(text, 0, room + 1):
        start = match.start()
        if start < min_cut or start > room:
            continue
        if text[:start].strip() and _is_safe_cut(text, start):
            best = start
    return best


def _hard_cut(text: str, room: int) -> int:
    """Last grapheme-safe position at or before ``room``; a code point cut if none."""
    for index in range(room, 0, -1):
        if _is_safe_cut(text, index):
            return index
    # A single grapheme longer than the limit: a code-point cut is all that is left.
    return room


def _skip_cut_whitespace(text: str) -> str:
    """Drop the whitespace at a cut, but keep the indentation of the next line."""
    stripped = text.lstrip()
    run = text[: len(text) - len(stripped)]
    newline = run.rfind("\n")
    if newline >= 0:
        return text[newline + 1 :]
    return stripped


def split_text(text: str, limit: int, *, length: Callable[[str], int] = len) -> list[str]:
    """Split ``text`` into ordered, non-empty parts with ``length(part) <= limit``.

    Boundaries are tried in order paragraph, line, sentence, word; a word is
    cut only when it alone is longer than the limit. The whitespace at a cut
    is dropped (the indentation of a following line is kept), so the parts
    joined back give the input up to that whitespace. A text that fits is
    returned unchanged as the only part; a blank text gives no parts.

    ``length`` must grow with the prefix and count at least 1 per character
    (``len``, ``utf16_len`` and UTF-8 byte counts all do).

    Raises ``ValueError`` if ``limit < 1`` or a single character is longer
    than ``limit``.
    """
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    if not text.strip():
        return []
    parts: list[str] = []
    rest = text
    while rest:
        if length(rest) <= limit:
            if rest.strip():
                parts.append(rest)
            break
        room = _fitting_prefix(rest, limit, length)
        if room == 0:
            raise ValueError(f"character {rest[0]!r} is longer than the limit {limit}")
        cut: int | None = None
        for pattern, min_cut in (
            (_PARAGRAPH, int(room * _MIN_FILL)),
            (_LINE, int(room * _MIN_FILL)),
            (_SENTENCE, int(room * _MIN_FILL)),
            (_WORD, 1),
        ):
            cut = _boundary_cut(rest, room, pattern, max(min_cut, 1))
            if cut is not None:
                break
        if cut is None:
            cut = _hard_cut(rest, room)
            part = rest[:cut]
            rest = rest[cut:]
        else:
            part = rest[:cut].rstrip()
            # From the end of the part, so the whole whitespace run at the cut is seen.
            rest = _skip_cut_whitespace(rest[len(part) :])
        if part.strip():
            parts.append(part)
    return parts
