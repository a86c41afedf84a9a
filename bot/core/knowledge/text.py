"""Passages from documents: Markdown, plain text and HTML cut into headed chunks.

A document becomes a list of ``Passage`` (heading, text): Markdown is cut at
its headings (a passage's heading is the path of headings above it, ``Returns
› Refunds``), then each section at paragraph breaks into passages of about
``TARGET_CHARS``; a paragraph longer than ``MAX_CHARS`` is cut at sentence or
word breaks. HTML is turned into the same Markdown-like text first (headings
kept, scripts, styles and markup dropped) with the standard library's parser.
Plain text and a PDF's text are cut like a Markdown file without headings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Final

__all__ = ["MAX_CHARS", "TARGET_CHARS", "Passage", "html_to_text", "split_passages"]

TARGET_CHARS: Final = 900
"""A passage grows by paragraphs until it would pass this many characters."""
MAX_CHARS: Final = 1500
"""No passage is longer (a longer paragraph is cut at a sentence or word break)."""
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^(```|~~~)")
_SEPARATOR: Final = " › "


@dataclass(frozen=True, slots=True)
class Passage:
    """One chunk of a document: the headings above it and its text."""

    heading: str
    text: str


def split_passages(text: str) -> list[Passage]:
    """``text`` (Markdown or plain) as passages, in document order; none for blank text."""
    passages: list[Passage] = []
    trail: list[tuple[int, str]] = []
    lines: list[str] = []
    fenced = False

    def flush() -> None:
        heading = _SEPARATOR.join(title for _, title in trail)
        for piece in _pieces("\n".join(lines)):
            passages.append(Passage(heading, piece))
        lines.clear()

    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if _FENCE.match(line.strip()):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match is None:
            lines.append(line)
            continue
        flush()
        level = len(match.group(1))
        while trail and trail[-1][0] >= level:
            trail.pop()
        trail.append((level, match.group(2).strip()))
    flush()
    return passages


def _pieces(section: str) -> list[str]:
    """A section's paragraphs packed into pieces of about ``TARGET_CHARS``."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", section) if p.strip()]
    pieces: list[str] = []
    current = ""
    for paragraph in paragraphs:
        for part in _cut_long(paragraph):
            if current and len(current) + 2 + len(part) > TARGET_CHARS:
                pieces.append(current)
                current = part
            else:
                current = f"{current}\n\n{part}" if current else part
    if current:
        pieces.append(current)
    return pieces


def _cut_long(paragraph: str) -> list[str]:
    """``paragraph`` in parts of at most ``MAX_CHARS``, cut at a sentence, else a word."""
    parts: list[str] = []
    rest = paragraph
    while len(rest) > MAX_CHARS:
        head = rest[:MAX_CHARS]
        at = max(head.rfind(". "), head.rfind("\n"))
        if at < MAX_CHARS // 2:
            at = head.rfind(" ")
        if at < MAX_CHARS // 2:
            at = MAX_CHARS - 1
        parts.append(rest[: at + 1].strip())
        rest = rest[at + 1 :].strip()
    if rest:
        parts.append(rest)
    return parts


_BLOCKS: Final = frozenset(
    {"p", "div", "br", "li", "tr", "table", "section", "article", "pre", "blockquote", "dd", "dt"}
)
_SKIPPED: Final = frozenset({"script", "style", "head", "title", "noscript", "template"})


class _TextParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self._skip = 0
        self._heading: list[str] | None = None
        self._level = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _SKIPPED:
            self._skip += 1
        elif _heading_level(tag):
            self._heading, self._level = [], _heading_level(tag)
        elif tag == "li":
            self.out.append("\n- ")
        elif tag in _BLOCKS:
            self.out.append("\n\n" if tag != "br" else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIPPED:
            self._skip = max(self._skip - 1, 0)
        elif _heading_level(tag) and self._heading is not None:
            # A heading is one line, however its HTML was wrapped.
            title = " ".join("".join(self._heading).split())
            if title:
                self.out.append(f"\n\n{'#' * self._level} {title}\n\n")
            self._heading = None
        elif tag in _BLOCKS:
            self.out.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._heading is not None:
            self._heading.append(data)
        else:
            self.out.append(data)


def _heading_level(tag: str) -> int:
    return int(tag[1]) if len(tag) == 2 and tag[0] == "h" and tag[1] in "123456" else 0


def html_to_text(html: str) -> str:
    """The readable text of an HTML page, headings as Markdown headings, markup dropped."""
    parser = _TextParser()
    parser.feed(html)
    parser.close()
    text = "".join(parser.out)
    # Whitespace inside a heading line or paragraph collapses to one space.
    lines = [" ".join(line.split()) for line in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
