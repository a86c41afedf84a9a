"""What a file's first bytes say it is: a declared MIME type is a claim, the signature a fact."""

from __future__ import annotations

__all__ = ["sniff_mime"]


def sniff_mime(data: bytes) -> str | None:
    """The MIME type the bytes' own signature says (images, PDF, common audio), else ``None``."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    if data.startswith(b"OggS"):
        return "audio/ogg"
    if data.startswith(b"ID3") or data[:2] in (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2"):
        return "audio/mpeg"
    if data[:2] in (b"\xff\xf1", b"\xff\xf9"):
        return "audio/aac"
    if data[4:8] == b"ftyp":
        return "audio/mp4"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    if data.startswith(b"#!AMR"):
        return "audio/amr"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        return "audio/webm"
    return None
