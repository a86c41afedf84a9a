"""Telegram's formatting check, simplified, for ``FakeTelegramServer``.

``check_entities`` says why Telegram would refuse a text in a ``parse_mode``
(``Markdown``, ``MarkdownV2``, ``HTML``) with the description Telegram gives,
or None: unclosed entities, MarkdownV2's reserved characters, unknown or
mismatched HTML tags and bare ``&``/``<``.
"""

from __future__ import annotations

import re

__all__ = ["check_entities"]

_HTML_TAGS = frozenset(
    {
        "b",
        "strong",
        "i",
        "em",
        "u",
        "ins",
        "s",
        "strike",
        "del",
        "span",
        "tg-spoiler",
        "a",
        "code",
        "pre",
        "blockquote",
        "tg-emoji",
    }
)
_V2_RESERVED = set("_*[]()~`>#+-=|{}.!")


def _byte_offset(text: str, index: int) -> int:
    return len(text[:index].encode("utf-8"))


def _unclosed(text: str, index: int) -> str:
    return f"Can't find end of the entity starting at byte offset {_byte_offset(text, index)}"


def _check_markdown(text: str, *, v2: bool) -> str | None:
    """A simple (not complete) check of Telegram's Markdown rules; error text or None."""
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if text.startswith("```", i):
            end = text.find("```", i + 3)
            if end < 0:
                return _unclosed(text, i)
            i = end + 3
            continue
        delimiters = "*_`~" if v2 else "*_`"
        if ch in delimiters:
            end = i + 1
            while end < len(text) and text[end] != ch:
                end += 2 if text[end] == "\\" else 1
            if end >= len(text):
                return _unclosed(text, i)
            i = end + 1
            continue
        if ch == "[":
            close = text.find("](", i)
            end = text.find(")", close) if close >= 0 else -1
            if close >= 0 and end >= 0:
                i = end + 1
                continue
            if v2:
                return "Character '[' is reserved and must be escaped with the preceding '\\'"
        if v2 and ch in _V2_RESERVED:
            return f"Character '{ch}' is reserved and must be escaped with the preceding '\\'"
        i += 1
    return None


def _check_html(text: str) -> str | None:
    stack: list[str] = []
    for match in re.finditer(r"<(/?)([^\s>/]*)[^>]*>|<|&(?!(?:lt|gt|amp|quot|#\d+);)", text):
        offset = _byte_offset(text, match.start())
        token = match.group(0)
        if token == "<":
            return f"Unsupported start tag at byte offset {offset}"
        if token.startswith("&"):
            return f"Unclosed entity at byte offset {offset}"  # a bare "&"
        closing, name = match.group(1), match.group(2).lower()
        if name not in _HTML_TAGS:
            return f'Unsupported start tag "{name}" at byte offset {offset}'
        if not closing:
            stack.append(name)
        elif not stack or stack.pop() != name:
            return f"Unexpected end tag at byte offset {offset}"
    if stack:
        return f'Can\'t find end tag corresponding to start tag "{stack[-1]}"'
    return None


def check_entities(text: str, parse_mode: str) -> str | None:
    """Why Telegram would refuse ``text`` in ``parse_mode`` (simplified), or None."""
    mode = parse_mode.lower()
    if mode == "markdown":
        return _check_markdown(text, v2=False)
    if mode == "markdownv2":
        return _check_markdown(text, v2=True)
    if mode == "html":
        return _check_html(text)
    return f"Unsupported parse_mode {parse_mode!r}"
