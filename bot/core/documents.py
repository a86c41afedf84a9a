"""The text of a document a user sent: PDFs through pypdf, plain text as is.

The work runs in a thread (parsing a PDF is CPU work). The text is cut to a
budget at a paragraph or line break where one is near, and the caller shows
the model the file name with it. What cannot be read raises ``MediaError``
with a one-line reason for the user: an encrypted PDF, a broken one, a file
whose bytes are not what its MIME type claims, an empty file.
"""

from __future__ import annotations

import asyncio
import io
import logging
from dataclasses import dataclass

from bot.errors import MediaError

__all__ = ["MAX_DOCUMENT_CHARS", "DocumentText", "extract_text", "is_readable_document"]

logger = logging.getLogger(__name__)

MAX_DOCUMENT_CHARS = 12_000
"""Characters of a document's text shown to the model (about 3,000 tokens)."""
_MAX_PDF_PAGES = 200
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


async def extract_text(
    data: bytes, mime_type: str, file_name: str | None, *, max_chars: int = MAX_DOCUMENT_CHARS
) -> DocumentText:
    """The text of ``data`` cut to ``max_chars``; ``MediaError`` when it cannot be read."""
    if not data:
        raise MediaError("The file you sent is empty.")
    return await asyncio.to_thread(_extract, data, mime_type, file_name, max_chars)


def _extract(data: bytes, mime_type: str, file_name: str | None, max_chars: int) -> DocumentText:
    is_pdf = data.startswith(b"%PDF-")
    claims_pdf = _base(mime_type) == _PDF or (file_name or "").lower().endswith(".pdf")
    if claims_pdf and not is_pdf:
        raise MediaError("That file says it is a PDF, but it is not one, so I could not read it.")
    text = _pdf_text(data, max_chars) if is_pdf else _plain_text(data)
    return _cut(text.strip(), max_chars)


def _pdf_text(data: bytes, max_chars: int) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise MediaError("That PDF is password-protected, so I could not read it.")
        pages: list[str] = []
        total = 0
        for page in reader.pages[:_MAX_PDF_PAGES]:
            page_text = page.extract_text() or ""
            pages.append(page_text)
            total += len(page_text)
            if total > max_chars:
                break  # enough for the budget: the rest would be cut anyway
    except MediaError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, OSError, RecursionError) as exc:
        logger.info("PDF could not be parsed (%s)", type(exc).__name__)
        raise MediaError("That PDF seems to be damaged, so I could not read it.") from exc
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise MediaError("I found no text in that PDF (it may be a scan of images).")
    return text


def _plain_text(data: bytes) -> str:
    if b"\x00" in data[:8192]:
        raise MediaError("That file is not a text document I can read.")
    return data.decode("utf-8", errors="replace")


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
