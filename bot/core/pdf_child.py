"""Reads one PDF's text in a child process that the bot can kill (see ``documents``).

Run as ``python -I pdf_child.py <max_chars> <max_pages> <cpu_seconds> <memory_bytes>``
with the PDF on stdin. It writes one JSON object to stdout:
``{"text": "...", "more": true|false}`` or ``{"error": "<code>"}`` (``encrypted``,
``damaged``, ``no_text``, ``too_complex``). The parent turns that into a sentence
for the user.

It imports nothing from ``bot``: the child starts in about a tenth of a second
(the interpreter and pypdf), and none of the bot's modules, settings or secrets
reach the process that parses untrusted bytes.

Before it parses, the child limits itself: CPU seconds (the kernel ends it with
SIGXCPU if the parent could not, for instance after the parent died), address
space (a decompression bomb ends in ``MemoryError``), no file writes, and a
lower scheduling priority so the bot's event loop wins the CPU. Then it caps the
work: at most ``max_pages`` pages, pages whose decoded content is larger than
``_MAX_PAGE_CONTENT`` are skipped (pypdf spends about a second of CPU per MB of
operators, whether they draw text or not), and it stops once the pages read hold
``_MAX_TOTAL_CONTENT`` bytes of content or more text than the budget.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
from typing import Any

_MAX_PAGE_CONTENT = 2 * 1024 * 1024
"""Decoded content bytes of one page beyond which it is skipped (text pages hold a few KB)."""
_MAX_TOTAL_CONTENT = 16 * 1024 * 1024
"""Decoded content bytes of all pages read beyond which reading stops."""
_NICENESS = 10


def _limit_self(cpu_seconds: int, memory_bytes: int) -> None:
    # Best effort where a platform refuses one (macOS and RLIMIT_AS): the parent's
    # kill at its timeout is the bound that always holds.
    for limit, value in (
        (resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1)),
        (resource.RLIMIT_AS, (memory_bytes, memory_bytes)),
        (resource.RLIMIT_FSIZE, (0, 0)),
    ):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(limit, value)
    with contextlib.suppress(OSError):
        os.nice(_NICENESS)


def _content_size(page: Any) -> int:
    contents = page.get_contents()
    return 0 if contents is None else len(contents.get_data())


def read_pdf(data: bytes, max_chars: int, max_pages: int) -> dict[str, Any]:
    """The answer the parent reads, for ``data``."""
    from pypdf import PdfReader

    reader = PdfReader(io.BytesIO(data))
    if reader.is_encrypted and not reader.decrypt(""):
        return {"error": "encrypted"}
    texts: list[str] = []
    chars = 0
    content = 0
    skipped = 0
    more = False
    for index, page in enumerate(reader.pages):
        if index >= max_pages:
            more = True
            break
        size = _content_size(page)
        if size > _MAX_PAGE_CONTENT:
            skipped += 1
            continue
        content += size
        if content > _MAX_TOTAL_CONTENT:
            more = True
            break
        text = (page.extract_text() or "").strip()
        if text:
            texts.append(text)
            chars += len(text)
            if chars > max_chars:
                more = True
                break
    text = "\n\n".join(texts)
    if not text:
        return {"error": "too_complex" if skipped or more else "no_text"}
    # One character over the budget tells the parent to cut at a paragraph break.
    text = text[: max_chars + 1].encode("utf-8", "replace").decode("utf-8")
    return {"text": text, "more": more}


def main(argv: list[str]) -> int:
    """Read stdin, write the answer; the exit status is 0 whenever an answer was written."""
    max_chars, max_pages, cpu_seconds, memory_bytes = (int(arg) for arg in argv[1:5])
    data = sys.stdin.buffer.read()
    _limit_self(cpu_seconds, memory_bytes)
    try:
        answer = read_pdf(data, max_chars, max_pages)
    except MemoryError:
        answer = {"error": "too_complex"}
    except Exception:  # any parser failure on hostile bytes is "damaged", never a crash
        answer = {"error": "damaged"}
    sys.stdout.buffer.write(json.dumps(answer, ensure_ascii=False).encode("utf-8"))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
