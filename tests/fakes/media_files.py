"""Real media bytes made in the test: a JPEG, an OGG/Opus voice note, a PDF with text.

No Pillow or ffmpeg on the test machine, so each is written by hand in its
real container format: the JPEG is a complete baseline 1x1 image, the OGG
carries valid pages (with their CRCs) holding an Opus header and tags, and the
PDF has a text content stream that pypdf reads back.

Hostile PDFs (review 2026-12-01b, F1 and F2) are made here too, never checked in:
``hostile_pdf`` is a few dozen KB that keeps pypdf busy for minutes, and
``unknown_filter_pdf`` names a stream filter pypdf raises an unexpected error for.
"""

from __future__ import annotations

import struct
import zlib

__all__ = [
    "encrypted_pdf",
    "hostile_pdf",
    "jpeg_bytes",
    "ogg_opus_bytes",
    "pdf_bytes",
    "unknown_filter_pdf",
]

_JPEG_HEX = (
    "FFD8FFE000104A46494600010100000100010000FFDB004300080606070605080707070909080A0C14"
    "0D0C0B0B0C1912130F141D1A1F1E1D1A1C1C20242E2720222C231C1C2837292C30313434341F27393D"
    "38323C2E333432FFC0000B080001000101011100FFC4001F0000010501010101010100000000000000"
    "000102030405060708090A0BFFC400B5100002010303020403050504040000017D0102030004110512"
    "2131410613516107227114328191A1082342B1C1155252D1F02433627282090A161718191A25262728"
    "292A3435363738393A434445464748494A535455565758595A636465666768696A737475767778797A"
    "838485868788898A92939495969798999AA2A3A4A5A6A7A8A9AAB2B3B4B5B6B7B8B9BAC2C3C4C5C6C7"
    "C8C9CAD2D3D4D5D6D7D8D9DAE1E2E3E4E5E6E7E8E9EAF1F2F3F4F5F6F7F8F9FAFFDA0008010100003F"
    "00FBD3FFD9"
)


def jpeg_bytes(padding: int = 0) -> bytes:
    """A 1x1 baseline JPEG; ``padding`` bytes of a COM segment make it bigger."""
    data = bytes.fromhex(_JPEG_HEX)
    if padding <= 0:
        return data
    chunks = []
    left = padding
    while left > 0:
        size = min(left, 65533)
        chunks.append(b"\xff\xfe" + struct.pack(">H", size + 2) + b"c" * size)
        left -= size
    return data[:2] + b"".join(chunks) + data[2:]


def _ogg_crc(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def _ogg_page(packet: bytes, *, sequence: int, header_type: int, granule: int) -> bytes:
    lacing = [255] * (len(packet) // 255) + [len(packet) % 255]
    header = (
        b"OggS"
        + bytes([0, header_type])
        + struct.pack("<qII", granule, 0x43464C57, sequence)
        + b"\x00\x00\x00\x00"
        + bytes([len(lacing)])
        + bytes(lacing)
    )
    page = header + packet
    crc = _ogg_crc(page)
    return page[:22] + struct.pack("<I", crc) + page[26:]


def ogg_opus_bytes(frames: int = 20) -> bytes:
    """An OGG/Opus stream (Telegram's and WhatsApp's voice-note format): head, tags,
    then ``frames`` pages of silent 20 ms Opus frames."""
    head = b"OpusHead" + bytes([1, 1]) + struct.pack("<HIhB", 312, 48000, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 8) + b"chatflow" + struct.pack("<I", 0)
    pages = [
        _ogg_page(head, sequence=0, header_type=2, granule=0),
        _ogg_page(tags, sequence=1, header_type=0, granule=0),
    ]
    silent_frame = b"\xf8\xff\xfe"  # TOC: CELT 20 ms, one frame, the silence payload
    for index in range(frames):
        last = index == frames - 1
        pages.append(
            _ogg_page(
                silent_frame,
                sequence=2 + index,
                header_type=4 if last else 0,
                granule=960 * (index + 1),
            )
        )
    return b"".join(pages)


def _pdf(objects: list[bytes], trailer_extra: bytes = b"") -> bytes:
    out = bytearray(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R %s>>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        trailer_extra,
        xref,
    )
    return bytes(out)


def pdf_bytes(*lines: str) -> bytes:
    """A one-page PDF showing ``lines`` in Helvetica (ASCII only)."""
    text_ops = (
        b"BT /F1 12 Tf 72 720 Td 14 TL "
        + b" ".join(
            b"("
            + line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode()
            + b") '"
            for line in lines
        )
        + b" ET"
    )
    return _pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 5 0 R >> >> /Contents 4 0 R >>",
            b"<< /Length %d >>\nstream\n" % len(text_ops) + text_ops + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        ]
    )


def _shared_stream_pdf(content: bytes, pages: int, filter_name: bytes) -> bytes:
    """``pages`` pages that all draw the one stream ``content`` (compressed, or left as
    is under an arbitrary ``filter_name``)."""
    if filter_name == b"/FlateDecode":
        content = zlib.compress(content, 9)
    kids = b" ".join(b"%d 0 R" % (5 + page) for page in range(pages))
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>"
    )
    return _pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
            b"<< /Length %d /Filter %s >>\nstream\n" % (len(content), filter_name)
            + content
            + b"\nendstream",
            *([page] * pages),
        ]
    )


def hostile_pdf(page_content: int = 1024 * 1024, pages: int = 100) -> bytes:
    """A small PDF that costs pypdf about a second of CPU per page (per MB of
    ``page_content``) and yields no text: every page draws one shared, compressed
    content stream of empty text runs. The defaults (35 KB) take minutes to read."""
    run = b"BT /F1 12 Tf () Tj ET\n"
    return _shared_stream_pdf(run * (page_content // len(run)), pages, b"/FlateDecode")


def unknown_filter_pdf(filter_name: str = "/Foo") -> bytes:
    """A one-page PDF whose content stream names a filter pypdf does not know:
    ``/Foo`` makes it raise ``NotImplementedError``, ``/Fl`` a ``DeprecationError``
    (neither is a ``PyPdfError``)."""
    text = b"BT /F1 12 Tf 72 700 Td (Hello) Tj ET\n"
    return _shared_stream_pdf(text, 1, filter_name.encode())


def encrypted_pdf() -> bytes:
    """A PDF whose trailer says it is encrypted with a password (pypdf cannot open it)."""
    import io

    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf_bytes("secret"))))
    writer.encrypt(user_password="hunter2", owner_password="owner", algorithm="RC4-128")
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()
