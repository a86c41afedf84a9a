"""The text of a document a user sent: PDFs through pypdf in a child process, plain text as is.

A PDF is parsed by ``pdf_child.py`` in a child process, never in a thread of
the bot: pypdf is pure Python and a crafted file of a few KB can keep it busy
for many minutes, which a thread cannot be stopped from doing (it would hold a
default-executor slot, and every ``to_thread`` and DNS lookup of the bot after
it, until it finished). The child is killed when ``timeout`` runs out or the
caller is cancelled (the media step's timeout, a stop), limits its own CPU time
and memory, and runs at a lower priority; at most ``max_parallel`` parse at once
per reader. Starting one costs about a tenth of a second.

The text is cut to a budget at a paragraph or line break where one is near,
and the caller shows the model the file name with it. What cannot be read
raises ``MediaError`` with a one-line reason for the user: an encrypted PDF, a
broken or too complex one, one that took too long, a file whose bytes are not
what its MIME type claims, an empty file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.errors import MediaError

__all__ = [
    "DOCUMENT_TIMEOUT",
    "MAX_DOCUMENT_CHARS",
    "DocumentReader",
    "DocumentText",
    "extract_text",
    "is_readable_document",
]

logger = logging.getLogger(__name__)

MAX_DOCUMENT_CHARS = 12_000
"""Characters of a document's text shown to the model (about 3,000 tokens)."""
DOCUMENT_TIMEOUT = 20.0
"""Default ``DOCUMENT_TIMEOUT_SECONDS``: the longest one PDF may take to read. A text
PDF of a hundred pages takes a second or two; the user waits for the answer."""
MAX_PARALLEL_READS = 2
"""PDFs parsed at once per reader; more wait for a slot (the media step's timeout
bounds the wait). Each parse may use a whole CPU core."""
_MAX_PDF_PAGES = 100
_CHILD = Path(__file__).with_name("pdf_child.py")
_CHILD_MEMORY = 512 * 1024 * 1024
"""Address space of the child (the interpreter and pypdf take about 45 MB of it)."""
_TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/csv",
        "application/x-yaml",
        "application/yaml",
    }
)
_TEXT_SUFFIXES = (".txt", ".md", ".csv", ".json", ".log", ".xml", ".yaml", ".yml")
_PDF = "application/pdf"
_REASONS = {
    "encrypted": "That PDF is password-protected, so I could not read it.",
    "damaged": "That PDF seems to be damaged, so I could not read it.",
    "no_text": "I found no text in that PDF (it may be a scan of images).",
    "too_complex": "I could not read that PDF: it is too complex for me to open.",
}
_TOO_LONG = "I could not read that PDF: it took too long to open, so I left it out."


@dataclass(frozen=True)
class DocumentText:
    """What was read from a document."""

    text: str
    """The text, cut to the budget."""
    truncated: bool
    """True when more text was there than the budget kept."""


def _base(mime_type: str) -> str:
    return mime_type.split(";", 1)[0].strip().lower()


def is_readable_document(mime_type: str, file_name: str | None) -> bool:
    """Whether ``extract_text`` reads this type (PDF or text)."""
    base = _base(mime_type)
    name = (file_name or "").lower()
    return (
        base == _PDF
        or base.startswith("text/")
        or base in _TEXT_TYPES
        or name.endswith((".pdf", *_TEXT_SUFFIXES))
    )


class DocumentReader:
    """Reads documents; PDFs in killable child processes, ``max_parallel`` at a time."""

    def __init__(
        self, *, timeout: float = DOCUMENT_TIMEOUT, max_parallel: int = MAX_PARALLEL_READS
    ) -> None:
        if not timeout > 0:
            raise ValueError("timeout must be positive")
        if max_parallel < 1:
            raise ValueError("max_parallel must be at least 1")
        self.timeout = timeout
        self._slots = asyncio.Semaphore(max_parallel)

    async def read(
        self,
        data: bytes,
        mime_type: str,
        file_name: str | None,
        *,
        max_chars: int = MAX_DOCUMENT_CHARS,
    ) -> DocumentText:
        """The text of ``data`` cut to ``max_chars``; ``MediaError`` when it cannot be read."""
        if not data:
            raise MediaError("The file you sent is empty.")
        is_pdf = data.startswith(b"%PDF-")
        claims_pdf = _base(mime_type) == _PDF or (file_name or "").lower().endswith(".pdf")
        if claims_pdf and not is_pdf:
            raise MediaError(
                "That file says it is a PDF, but it is not one, so I could not read it."
            )
        if not is_pdf:
            return _plain_text(data, max_chars)
        async with self._slots:
            answer = await self._parse_pdf(data, max_chars)
        text, more = answer
        cut = _cut(text, max_chars)
        return DocumentText(cut.text, cut.truncated or more)

    async def _parse_pdf(self, data: bytes, max_chars: int) -> tuple[str, bool]:
        cpu_seconds = math.ceil(self.timeout) + 1
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            str(_CHILD),
            str(max_chars),
            str(_MAX_PDF_PAGES),
            str(cpu_seconds),
            str(_CHILD_MEMORY),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            env={},
        )
        try:
            async with asyncio.timeout(self.timeout):
                out, _ = await process.communicate(data)
        except TimeoutError:
            logger.info("PDF not read within %.0f s; its reader was stopped", self.timeout)
            raise MediaError(_TOO_LONG) from None
        finally:
            await _end(process)
        return _answer(out, process.returncode)


def _answer(out: bytes, returncode: int | None) -> tuple[str, bool]:
    """The child's answer as text and "more", or the ``MediaError`` it stands for."""
    if returncode == -signal.SIGXCPU:
        logger.info("PDF reader ran out of CPU time")
        raise MediaError(_TOO_LONG)
    try:
        answer: Any = json.loads(out)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        logger.info("PDF reader gave no answer (exit status %s)", returncode)
        raise MediaError(_REASONS["too_complex"])
    text = answer.get("text")
    if isinstance(text, str) and text:
        return text, bool(answer.get("more"))
    code = answer.get("error")
    if code != "no_text":
        logger.info("PDF could not be read (%s)", code)
    raise MediaError(_REASONS.get(str(code), _REASONS["damaged"]))


async def _end(process: asyncio.subprocess.Process) -> None:
    """Kill the child if it still runs and reap it; also when the caller is cancelled."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    # A cancelled communicate() may leave stdin half written: close it, so the pipe
    # transports end with the process instead of warning about it at exit.
    if process.stdin is not None:
        process.stdin.close()
    # Cancelled here too, the child is dead already and the child watcher reaps it.
    await process.wait()


async def extract_text(
    data: bytes,
    mime_type: str,
    file_name: str | None,
    *,
    max_chars: int = MAX_DOCUMENT_CHARS,
    reader: DocumentReader | None = None,
) -> DocumentText:
    """The text of ``data`` cut to ``max_chars``; ``MediaError`` when it cannot be read.

    ``reader`` bounds the parses running at once (``MediaFetcher`` keeps one);
    without it a reader with the default timeout is used for this call.
    """
    return await (reader or DocumentReader()).read(data, mime_type, file_name, max_chars=max_chars)


def _plain_text(data: bytes, max_chars: int) -> DocumentText:
    if b"\x00" in data[:8192]:
        raise MediaError("That file is not a text document I can read.")
    # A UTF-8 character is at most 4 bytes: decoding more than this could not add to
    # what is kept, and keeps the decode small enough to run on the event loop.
    limit = max_chars * 4 + 4
    cut = _cut(data[:limit].decode("utf-8", errors="replace").strip(), max_chars)
    return DocumentText(cut.text, cut.truncated or len(data) > limit)


def _cut(text: str, max_chars: int) -> DocumentText:
    if len(text) <= max_chars:
        return DocumentText(text, False)
    head = text[:max_chars]
    # Prefer a paragraph, then a line break, in the last fifth of the budget.
    for sep in ("\n\n", "\n", ". "):
        at = head.rfind(sep)
        if at >= max_chars * 4 // 5:
            head = head[:at]
            break
    return DocumentText(head.rstrip(), True)
