"""Text to speech: a ``SpeechModel`` returns an OGG/Opus voice note for a text.

``OpenAISpeech`` calls the OpenAI-compatible ``/audio/speech`` endpoint at
``OPENAI_BASE_URL`` through the openai SDK with ``response_format="opus"``:
OGG/Opus is what Telegram and WhatsApp play as a voice note, so nothing is
converted. What comes back is checked (``check_ogg_opus``: an Ogg page holding
an ``OpusHead``, at most ``MAX_SPEECH_BYTES``) before it is stored or sent.
``SilentSpeech`` (the offline demo and ``bot.testing``) answers with a short,
valid, silent OGG/Opus note built in code, so voice replies can be tried and
tested without a key. Texts are never logged.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from bot.core.models.openai_audio import OpenAIAudioClient
from bot.core.voice import MAX_SPEECH_CHARS
from bot.errors import ModelError

if TYPE_CHECKING:
    import openai

__all__ = [
    "MAX_SPEECH_BYTES",
    "OpenAISpeech",
    "SilentSpeech",
    "SpeechModel",
    "check_ogg_opus",
    "is_ogg_opus",
    "silent_ogg_opus",
]

MAX_SPEECH_BYTES = 16 * 1024 * 1024
"""Largest voice note accepted from a speech service (WhatsApp's audio limit); 4,096
characters of speech are a few minutes, well under 2 MB of Opus."""


@runtime_checkable
class SpeechModel(Protocol):
    """Turns text into a spoken OGG/Opus voice note."""

    async def synthesize(self, text: str, *, voice: str, model: str) -> bytes:
        """The OGG/Opus bytes of ``text`` spoken by ``voice``; ``ModelError`` on failure."""
        ...


def is_ogg_opus(data: bytes) -> bool:
    """Whether ``data`` starts an Ogg stream whose first packet is an ``OpusHead``."""
    if len(data) < 27 + 8 or not data.startswith(b"OggS"):
        return False
    segments = data[26]
    start = 27 + segments
    return data[start : start + 8] == b"OpusHead"


def check_ogg_opus(data: bytes, *, max_bytes: int = MAX_SPEECH_BYTES) -> bytes:
    """``data`` if it is an OGG/Opus file of at most ``max_bytes``, else ``ModelError``."""
    if not data:
        raise ModelError("the speech service returned no audio")
    if len(data) > max_bytes:
        raise ModelError(f"the speech service returned {len(data)} bytes, over {max_bytes}")
    if not is_ogg_opus(data):
        raise ModelError("the speech service did not return OGG/Opus audio")
    return data


class OpenAISpeech(OpenAIAudioClient):
    """A ``SpeechModel`` on the openai SDK's ``audio.speech`` (any compatible server)."""

    def __init__(
        self,
        api_key: str,
        base_url: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
        max_bytes: int = MAX_SPEECH_BYTES,
    ) -> None:
        super().__init__(api_key, base_url, timeout=timeout, max_retries=max_retries)
        self.max_bytes = max_bytes

    async def synthesize(self, text: str, *, voice: str, model: str) -> bytes:
        """POST ``/audio/speech`` for ``text`` (at most ``MAX_SPEECH_CHARS``) and return
        the checked OGG/Opus bytes."""
        if not text.strip():
            raise ValueError("nothing to speak")
        if len(text) > MAX_SPEECH_CHARS:
            raise ValueError(f"speech input is limited to {MAX_SPEECH_CHARS} characters")

        async def speak(client: openai.AsyncOpenAI) -> bytes:
            response = await client.audio.speech.create(
                model=model, voice=voice, input=text, response_format="opus"
            )
            return response.content

        data = await self._request("speech synthesis", speak)
        return check_ogg_opus(data, max_bytes=self.max_bytes)


class SilentSpeech:
    """A ``SpeechModel`` without a service: a silent voice note about as long as the
    text would take to say (the offline demo, tests). Records what it was asked."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str]] = []
        """``(text, voice, model)`` of every call, in order."""

    async def synthesize(self, text: str, *, voice: str, model: str) -> bytes:
        """A valid OGG/Opus file of silence, about one second per 15 characters."""
        if not text.strip():
            raise ValueError("nothing to speak")
        self.requests.append((text, voice, model))
        seconds = min(max(len(text) // 15, 1), 60)
        return silent_ogg_opus(frames=seconds * 50)


# -- a silent OGG/Opus file, built in code (RFC 3533 pages, RFC 7845 headers) ----------


def _crc_table() -> list[int]:
    table = []
    for index in range(256):
        crc = index << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
        table.append(crc & 0xFFFFFFFF)
    return table


_CRC_TABLE = _crc_table()
_SERIAL = 0x43484631  # any stream serial number: one stream per file
_SILENT_FRAME = b"\xf8\xff\xfe"  # 20 ms of CELT silence (TOC 0xf8 + empty frame)
_FRAMES_PER_PAGE = 50  # one second per page
_SAMPLES_PER_FRAME = 960  # 20 ms at 48 kHz
_PRE_SKIP = 312


def _ogg_crc(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) ^ _CRC_TABLE[((crc >> 24) & 0xFF) ^ byte]) & 0xFFFFFFFF
    return crc


def _ogg_page(packets: list[bytes], *, sequence: int, header_type: int, granule: int) -> bytes:
    lacing = bytearray()
    for packet in packets:
        # Each packet below is under 255 bytes: one lacing value, no continuation.
        lacing.append(len(packet))
    header = (
        b"OggS"
        + bytes([0, header_type])
        + struct.pack("<qIII", granule, _SERIAL, sequence, 0)
        + bytes([len(lacing)])
        + bytes(lacing)
    )
    page = header + b"".join(packets)
    crc = _ogg_crc(page)
    return page[:22] + struct.pack("<I", crc) + page[26:]


def silent_ogg_opus(frames: int = 50) -> bytes:
    """An OGG/Opus stream of ``frames`` silent 20 ms frames (mono, 48 kHz)."""
    if frames <= 0:
        raise ValueError("frames must be positive")
    head = b"OpusHead" + bytes([1, 1]) + struct.pack("<HIhB", _PRE_SKIP, 48000, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 8) + b"chatflow" + struct.pack("<I", 0)
    pages = [
        _ogg_page([head], sequence=0, header_type=2, granule=0),
        _ogg_page([tags], sequence=1, header_type=0, granule=0),
    ]
    written = 0
    sequence = 2
    while written < frames:
        count = min(_FRAMES_PER_PAGE, frames - written)
        written += count
        last = written == frames
        pages.append(
            _ogg_page(
                [_SILENT_FRAME] * count,
                sequence=sequence,
                header_type=4 if last else 0,
                granule=_PRE_SKIP + written * _SAMPLES_PER_FRAME,
            )
        )
        sequence += 1
    return b"".join(pages)
