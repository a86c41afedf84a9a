"""Voice replies in the core: the mode's decision, the 4,096 cut, the speech client."""

from __future__ import annotations

import logging
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot import Agent, AudioPart, Voice
from bot.config import Settings
from bot.core.models.speech import (
    MAX_SPEECH_BYTES,
    OpenAISpeech,
    SilentSpeech,
    check_ogg_opus,
    is_ogg_opus,
    silent_ogg_opus,
)
from bot.core.voice import MAX_SPEECH_CHARS, resolve_voice, speech_chunks, wants_voice
from bot.errors import ConfigurationError, ModelError
from tests.fakes.media_files import ogg_opus_bytes
from tests.fakes.openai_server import FakeOpenAIServer

# -- modes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "inbound_voice", "private", "expected"),
    [
        ("off", True, True, False),
        (None, True, True, False),
        ("auto", True, False, True),
        ("auto", False, True, False),
        ("always", False, True, True),
        ("always", False, False, False),
        ("always", True, False, True),
    ],
)
def test_the_mode_decides_which_replies_are_spoken(
    mode: str | None, inbound_voice: bool, private: bool, expected: bool
) -> None:
    assert wants_voice(mode, inbound_voice=inbound_voice, private=private) is expected  # type: ignore[arg-type]


def test_an_agents_voice_overrides_the_settings_field_by_field() -> None:
    default = Voice("off", "alloy", "gpt-4o-mini-tts")
    assert resolve_voice(None, default) == default
    assert resolve_voice(Voice(mode="auto", voice="nova"), default) == Voice(
        "auto", "nova", "gpt-4o-mini-tts"
    )
    assert resolve_voice(Voice(model="tts-1"), default) == Voice("off", "alloy", "tts-1")


def test_a_wrong_voice_is_refused_where_it_is_written() -> None:
    with pytest.raises(ValueError, match="off, auto or always"):
        Voice(mode="loud")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        Voice(voice=" ")
    with pytest.raises(TypeError, match="voice must be a Voice"):
        Agent(name="A", instructions="x", voice="alloy")  # type: ignore[arg-type]
    assert Agent(name="A", instructions="x", voice=Voice(mode="always")).voice == Voice("always")


def test_voice_settings_are_validated_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.config import load_settings

    defaults = Settings()
    assert (defaults.voice_replies, defaults.tts_model, defaults.tts_voice) == (
        "off",
        "gpt-4o-mini-tts",
        "alloy",
    )
    assert defaults.voice_with_text is True
    monkeypatch.setenv("VOICE_REPLIES", "sometimes")
    with pytest.raises(ConfigurationError, match="VOICE_REPLIES"):
        load_settings()


# -- the 4,096 cut --------------------------------------------------------------------


def test_a_long_answer_is_spoken_in_parts_cut_at_sentences() -> None:
    sentence = "The parcel left the depot this morning and arrives on Friday. "
    text = sentence * 150  # about 9,300 characters
    chunks = speech_chunks(text)
    assert len(chunks) == 3
    assert all(len(c) <= MAX_SPEECH_CHARS for c in chunks)
    assert all(c.endswith("Friday.") for c in chunks[:-1])
    assert " ".join(chunks) == text.strip()


def test_a_short_answer_is_one_part_and_blank_is_none() -> None:
    assert speech_chunks("  Hello there.  ") == ["Hello there."]
    assert speech_chunks("   ") == []


@given(st.text(alphabet=st.sampled_from("ab .\n"), max_size=400), st.integers(5, 60))
def test_chunks_keep_every_word_within_the_limit(text: str, limit: int) -> None:
    chunks = speech_chunks(text, limit)
    assert all(0 < len(c) <= limit for c in chunks)
    assert "".join("".join(chunks).split()) == "".join(text.split())


# -- OGG/Opus --------------------------------------------------------------------------


def _crc_ok(data: bytes) -> bool:
    """Every page's CRC, as an Ogg demuxer checks it."""
    from tests.fakes.media_files import _ogg_crc

    offset = 0
    while offset < len(data):
        assert data[offset : offset + 4] == b"OggS"
        segments = data[offset + 26]
        body = sum(data[offset + 27 : offset + 27 + segments])
        end = offset + 27 + segments + body
        page = bytearray(data[offset:end])
        stored = struct.unpack("<I", page[22:26])[0]
        page[22:26] = b"\0\0\0\0"
        if _ogg_crc(bytes(page)) != stored:
            return False
        offset = end
    return True


def test_the_silent_note_is_a_valid_ogg_opus_stream() -> None:
    data = silent_ogg_opus(frames=120)
    assert is_ogg_opus(data) and _crc_ok(data)
    assert data.count(b"OggS") == 2 + 3  # head, tags, then pages of up to one second
    assert is_ogg_opus(ogg_opus_bytes())  # the recorded-style note of the media tests


def test_what_is_not_ogg_opus_is_refused() -> None:
    with pytest.raises(ModelError, match="no audio"):
        check_ogg_opus(b"")
    with pytest.raises(ModelError, match="OGG/Opus"):
        check_ogg_opus(b"ID3\x04" + b"\0" * 100)
    vorbis = silent_ogg_opus().replace(b"OpusHead", b"\x01vorbis\0", 1)
    with pytest.raises(ModelError, match="OGG/Opus"):
        check_ogg_opus(vorbis)
    with pytest.raises(ModelError, match="over 100"):
        check_ogg_opus(silent_ogg_opus(), max_bytes=100)


async def test_silent_speech_records_what_it_was_asked() -> None:
    speech = SilentSpeech()
    data = await speech.synthesize("hello there", voice="alloy", model="m")
    assert is_ogg_opus(data)
    assert speech.requests == [("hello there", "alloy", "m")]


# -- the OpenAI-compatible client --------------------------------------------------------
# The openai SDK sends through its own HTTP stack, which respx does not see: the
# requests go to the fake server's /v1/audio/speech on 127.0.0.1 instead.


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as fake:
        yield fake


def _client(server: FakeOpenAIServer) -> OpenAISpeech:
    return OpenAISpeech(server.api_key, server.base_url, max_retries=0, timeout=10)


async def test_the_speech_request_asks_for_opus_with_the_model_voice_and_text(
    server: FakeOpenAIServer,
) -> None:
    bodies: list[dict[str, Any]] = []
    server.speech.hook = bodies.append
    speech = _client(server)
    try:
        data = await speech.synthesize("Your parcel arrives Friday.", voice="nova", model="tts-1")
    finally:
        await speech.aclose()
    (call,) = server.speech.calls
    assert data == call.audio and is_ogg_opus(data)
    assert bodies == [
        {
            "model": "tts-1",
            "voice": "nova",
            "input": "Your parcel arrives Friday.",
            "response_format": "opus",
        }
    ]
    assert server.api_key not in repr(speech)


@pytest.mark.parametrize(
    ("failures", "key", "status", "retryable"), [(1, None, 500, True), (0, "sk-wrong", 401, False)]
)
async def test_speech_errors_become_model_errors_by_type(
    server: FakeOpenAIServer, failures: int, key: str | None, status: int, retryable: bool
) -> None:
    server.speech.failures = failures
    speech = OpenAISpeech(key or server.api_key, server.base_url, max_retries=0, timeout=10)
    try:
        with pytest.raises(ModelError) as caught:
            await speech.synthesize("hi", voice="alloy", model="tts-1")
    finally:
        await speech.aclose()
    assert caught.value.retryable is retryable
    assert caught.value.status_code == status
    assert caught.value.__cause__ is not None
    assert server.speech.calls == []


async def test_a_wrong_format_and_a_dead_server_are_model_errors(
    server: FakeOpenAIServer,
) -> None:
    server.speech.not_ogg = True
    speech = _client(server)
    try:
        with pytest.raises(ModelError, match="OGG/Opus"):
            await speech.synthesize("hi", voice="alloy", model="tts-1")
    finally:
        await speech.aclose()
    url = server.base_url
    await server.stop()
    dead = OpenAISpeech(server.api_key, url, max_retries=0, timeout=10)
    try:
        with pytest.raises(ModelError, match="speech synthesis failed"):
            await dead.synthesize("hi", voice="alloy", model="tts-1")
    finally:
        await dead.aclose()


async def test_the_input_limit_is_kept_before_any_request() -> None:
    speech = OpenAISpeech("sk-test", "http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="4096"):
        await speech.synthesize("a" * (MAX_SPEECH_CHARS + 1), voice="alloy", model="tts-1")
    assert MAX_SPEECH_BYTES >= 1024 * 1024


# -- the voice part in the ledger --------------------------------------------------------


def test_a_voice_part_round_trips_through_the_attachments_column() -> None:
    from bot.gateway.ledger.obligations import _ATTACHMENTS, attachments_json

    note = AudioPart(
        sha256="a" * 64, mime_type="audio/ogg", size=1234, file_name="voice.ogg", voice=True
    )
    column = attachments_json([note])
    assert column is not None
    (back,) = _ATTACHMENTS.validate_json(column)
    assert back == note and isinstance(back, AudioPart) and back.voice


def test_the_obligation_id_covers_the_voice_by_its_hash() -> None:
    from bot.gateway.ledger.obligations import compute_obligation_id

    def note(sha: str) -> AudioPart:
        return AudioPart(sha256=sha, mime_type="audio/ogg", size=1, voice=True)

    plain = compute_obligation_id("k", "m", "hello")
    one = compute_obligation_id("k", "m", "hello", [note("a" * 64)])
    other = compute_obligation_id("k", "m", "hello", [note("b" * 64)])
    assert len({plain, one, other}) == 3
    assert one == compute_obligation_id("k", "m", "hello", [note("a" * 64)])


def test_no_warning_names_the_text(caplog: pytest.LogCaptureFixture) -> None:
    # The speech module logs nothing itself: errors carry types and statuses only.
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ModelError) as caught:
        check_ogg_opus(b"secret words")
    assert "secret" not in str(caught.value)
