"""Tests for platforms.text: splitting long replies into platform-sized parts."""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.platforms.text import split_text, utf16_len

Length = Callable[[str], int]


def _assert_rejoins(text: str, parts: list[str]) -> None:
    """Parts appear in order in ``text`` with only whitespace around and between them."""
    pos = 0
    for part in parts:
        index = text.find(part, pos)
        assert index >= 0, f"part {part!r} not found in order"
        assert text[pos:index].strip() == "", f"non-whitespace dropped before {part!r}"
        pos = index + len(part)
    assert text[pos:].strip() == ""
    squeeze = "".join(ch for ch in text if not ch.isspace())
    assert "".join(ch for part in parts for ch in part if not ch.isspace()) == squeeze


def _assert_graphemes_whole(parts: list[str]) -> None:
    """No part starts with a mark that belongs to the previous part's last character."""
    for previous, part in itertools.pairwise(parts):
        first = part[0]
        assert unicodedata.category(first) not in ("Mn", "Mc", "Me"), part
        assert not ("\ufe00" <= first <= "\ufe0f"), part
        assert first != "\u200d" and previous[-1] != "\u200d", (previous, part)
        assert not ("\U0001f3fb" <= first <= "\U0001f3ff"), part


def test_utf16_len_counts_astral_characters_twice() -> None:
    assert utf16_len("") == 0
    assert utf16_len("abc") == 3
    assert utf16_len("漢字") == 2
    assert utf16_len("😀") == 2
    assert utf16_len("👍🏽") == 4
    assert utf16_len("\ud800") == 1  # a lone surrogate does not crash


def test_short_text_is_returned_unchanged() -> None:
    text = "  hello, world  \n"
    assert split_text(text, 100) == [text]


@pytest.mark.parametrize("text", ["", "   ", "\n\n\t"], ids=["empty", "spaces", "newlines"])
def test_blank_text_gives_no_parts(text: str) -> None:
    assert split_text(text, 10) == []


@pytest.mark.parametrize("limit", [0, -5], ids=["zero", "negative"])
def test_limit_below_one_is_rejected(limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        split_text("abc", limit)


def test_character_longer_than_limit_is_rejected() -> None:
    with pytest.raises(ValueError, match="longer than the limit"):
        split_text("a😀", 1, length=utf16_len)


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        (
            "First paragraph here.\n\nSecond one, also short.",
            30,
            ["First paragraph here.", "Second one, also short."],
        ),
        (
            "line one is here\nline two is here\nline three",
            36,
            ["line one is here\nline two is here", "line three"],
        ),
        (
            "One sentence here. Another one and more",
            30,
            ["One sentence here.", "Another one and more"],
        ),
        ("alpha beta gamma delta", 12, ["alpha beta", "gamma delta"]),
        ("abcdefghij", 4, ["abcd", "efgh", "ij"]),
        ("这是第一句。这是第二句。", 8, ["这是第一句。", "这是第二句。"]),
        ("Pi is 3.14159 and e is 2.71828", 16, ["Pi is 3.14159", "and e is 2.71828"]),
        (
            "para one is long\n\n    indented code\nmore",
            22,
            ["para one is long", "    indented code\nmore"],
        ),
        ("word word word\n    indented", 16, ["word word word", "    indented"]),
    ],
    ids=[
        "paragraph",
        "line",
        "sentence",
        "word",
        "hard-split-long-word",
        "cjk-sentence",
        "decimal-point-is-not-sentence-end",
        "indentation-kept",
        "indentation-kept-after-line-cut",
    ],
)
def test_preferred_boundaries(text: str, limit: int, expected: list[str]) -> None:
    assert split_text(text, limit) == expected


def test_paragraph_beats_line_when_it_fills_the_part() -> None:
    text = "aaaa aaaa aaaa\nbbbb\n\ncccc"
    assert split_text(text, 22) == ["aaaa aaaa aaaa\nbbbb", "cccc"]


def test_no_break_space_is_not_a_cut() -> None:
    parts = split_text("aaaa\u00a0bbbb cccc", 10)
    assert parts == ["aaaa\u00a0bbbb", "cccc"]


@pytest.mark.parametrize(
    ("text", "limit", "length"),
    [
        ("x" * 4095 + "😀" + "tail", 4096, utf16_len),
        ("x" * 4094 + "👍🏽" + "tail", 4096, utf16_len),
        ("x" * 4093 + "👨\u200d👩\u200d👧" + "y" * 10, 4096, utf16_len),
        ("x" * 4095 + "e\u0301\u0302" + "y" * 10, 4096, len),
        ("x" * 4095 + "❤\ufe0f" + "y", 4096, len),
        ("x" * 4095 + "🇪🇸🇫🇷" + "y", 4096, utf16_len),
        ("x" * 4094 + "🇪🇸🇫🇷" + "y", 4096, len),
        ("x" * 4095 + "\r\n" + "y", 4096, len),
        ("漢" * 5000, 4096, utf16_len),
        ("שלום עולם " * 500, 4096, utf16_len),
        ("مرحبا بالعالم " * 400, 4096, utf16_len),
    ],
    ids=[
        "emoji-straddles-limit",
        "skin-tone-modifier",
        "zwj-family",
        "combining-marks",
        "variation-selector",
        "flags-utf16",
        "flags-odd-offset",
        "crlf",
        "cjk-no-spaces",
        "hebrew-rtl",
        "arabic-rtl",
    ],
)
def test_boundary_cases_near_telegram_limit(text: str, limit: int, length: Length) -> None:
    parts = split_text(text, limit, length=length)
    assert len(parts) >= 2
    assert all(0 < length(part) <= limit for part in parts)
    _assert_rejoins(text, parts)
    _assert_graphemes_whole(parts)
    for previous, part in itertools.pairwise(parts):
        assert not (previous.endswith("\r") and part.startswith("\n"))


def test_flag_pairs_stay_together() -> None:
    flags = "🇪🇸🇫🇷🇩🇪🇯🇵"
    parts = split_text(flags, 5, length=utf16_len)
    assert parts == ["🇪🇸", "🇫🇷", "🇩🇪", "🇯🇵"]


def test_grapheme_longer_than_limit_is_cut_at_code_points() -> None:
    family = "👨\u200d👩\u200d👧\u200d👦"  # 11 UTF-16 units
    parts = split_text(family, 4, length=utf16_len)
    assert "".join(parts) == family
    assert all(utf16_len(part) <= 4 for part in parts)


_ALPHABET = st.sampled_from(
    [
        *"abcxyz .!?,\n\t",
        *("\n\n", "。", "漢", "字", "😀", "👍🏽", "\u0301", "\ufe0f", "\u200d", "🇪", "🇸"),
        *("ש", "ل", "\u00a0", "\r\n", "  "),
    ]
)
_TEXTS = st.lists(_ALPHABET, max_size=200).map("".join)


@settings(max_examples=300, deadline=None)
@given(text=_TEXTS, limit=st.integers(min_value=2, max_value=40), utf16=st.booleans())
def test_split_invariants(text: str, limit: int, utf16: bool) -> None:
    length: Length = utf16_len if utf16 else len
    parts = split_text(text, limit, length=length)
    assert all(part for part in parts), "empty part"
    assert all(part.strip() for part in parts), "blank part"
    assert all(length(part) <= limit for part in parts)
    _assert_rejoins(text, parts)
    if length(text) <= limit and text.strip():
        assert parts == [text]


@settings(max_examples=100, deadline=None)
@given(
    words=st.lists(st.text(alphabet="abcdefgh", min_size=1, max_size=8), min_size=1),
    limit=st.integers(min_value=8, max_value=30),
)
def test_words_are_never_cut_when_they_fit(words: list[str], limit: int) -> None:
    text = " ".join(words)
    parts = split_text(text, limit)
    assert [w for part in parts for w in part.split(" ")] == words
