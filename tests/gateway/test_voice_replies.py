"""Voice replies through the gateway: spoken before tx 2, owed with the text, sent as a note."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot import Agent, AudioPart, Runner, Voice
from bot.config import Settings
from bot.core.models.routing import ModelSettings
from bot.core.models.scripted import ScriptedModel
from bot.core.models.speech import SilentSpeech, is_ogg_opus
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import ModelError, PlatformError
from bot.gateway.contract import MediaAttachment
from bot.gateway.gateway import Gateway
from bot.gateway.ledger.obligations import RECOVERED_MARKER, TABLE
from bot.gateway.voice_replies import speakable
from tests.fakes.adapter import FakeAdapter, make_event
from tests.fakes.media_files import ogg_opus_bytes

SECRET = b"v" * 32


def voice_event(chat_type: str = "dm", chat_id: str = "chat-1") -> Any:
    return make_event(
        "",
        chat_id=chat_id,
        chat_type=chat_type,  # type: ignore[arg-type]
        media=[MediaAttachment("voice", file_id="voice-1", mime_type="audio/ogg")],
    )


class Transcript:
    """A speech-to-text service that hears one question."""

    async def transcribe(self, data: bytes, *, file_name: str, mime_type: str) -> str:
        return "when does my parcel arrive"


@dataclass
class VoiceRig:
    gateway: Gateway
    adapter: FakeAdapter
    model: ScriptedModel
    store: SQLiteSessionStore

    @property
    def speech(self) -> SilentSpeech:
        speech = self.gateway.voice.speech
        assert isinstance(speech, SilentSpeech)
        return speech

    async def rows(self) -> list[tuple[Any, ...]]:
        async with self.store.transaction() as tx:
            return await tx.fetchall(f"SELECT obligation_id, state FROM {TABLE}")


@pytest.fixture
async def rigs(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[VoiceRig] = []

    async def make(
        adapter: FakeAdapter | None = None, voice: Voice | None = None, **settings: Any
    ) -> VoiceRig:
        store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
        model = ScriptedModel()
        agent = Agent(name="Helper", instructions="Help.", voice=voice)
        runner = Runner(
            agent, store, model=model, model_settings=ModelSettings(media_dir=str(tmp_path / "m"))
        )
        fake = adapter or FakeAdapter()
        fake.files["voice-1"] = ogg_opus_bytes()
        gateway = Gateway(
            runner, store, [fake], Settings(data_dir=tmp_path, **settings), secret=SECRET
        )
        assert gateway.turns.media is not None
        gateway.turns.media.transcriber = Transcript()
        await gateway.start()
        await gateway.wait_ready()
        rig = VoiceRig(gateway, fake, model, store)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        await rig.gateway.stop(grace=1)
        await rig.store.close()


async def _answer(rig: VoiceRig, event: Any) -> None:
    await rig.adapter.deliver(event)
    await rig.adapter.wait_for(lambda: bool(rig.adapter.voices or rig.adapter.sent))
    await rig.gateway._dispatcher.drain(5)


def voice_counts(rig: VoiceRig) -> dict[str, float]:
    """``chatflow_voice_replies_total`` by outcome, as ``/metrics`` shows it."""
    samples = rig.gateway.metrics.registry.get_sample_value
    outcomes = ("synthesized", "failed", "refused_by_chat")
    counts = {o: samples("chatflow_voice_replies_total", {"outcome": o}) for o in outcomes}
    return {o: n for o, n in counts.items() if n}


async def test_auto_answers_a_voice_note_with_a_captioned_voice_note(
    rigs: Callable[..., Any],
) -> None:
    rig: VoiceRig = await rigs(voice_replies="auto")
    rig.model.add(ScriptedModel.reply("Your **parcel** arrives Friday."))
    await _answer(rig, voice_event())
    ((message, note),) = rig.adapter.voices
    assert message.text == "Your **parcel** arrives Friday."  # the caption: the text as sent
    assert note.kind == "voice" and is_ogg_opus(note.data)
    assert rig.adapter.sent == []  # the caption carried the text
    assert rig.speech.requests == [("Your parcel arrives Friday.", "alloy", "gpt-4o-mini-tts")]
    ((oid, state),) = await rig.rows()
    row = await rig.gateway.ledger.get(str(oid))
    assert row is not None and state == "delivered"
    (part,) = row.attachments
    assert isinstance(part, AudioPart) and part.voice and part.mime_type == "audio/ogg"
    assert rig.gateway.voice.media.path_of(part.sha256).read_bytes() == note.data


async def test_auto_answers_text_with_text_and_off_never_speaks(
    rigs: Callable[..., Any],
) -> None:
    rig: VoiceRig = await rigs(voice_replies="auto")
    rig.model.add(ScriptedModel.reply("Typed answer."))
    await _answer(rig, make_event("typed question"))
    assert [s.text for s in rig.adapter.sent] == ["Typed answer."]
    assert rig.adapter.voices == [] and rig.speech.requests == []


async def test_off_by_default_even_for_a_voice_note(rigs: Callable[..., Any]) -> None:
    rig: VoiceRig = await rigs()
    rig.model.add(ScriptedModel.reply("Heard you."))
    await _answer(rig, voice_event())
    assert [s.text for s in rig.adapter.sent] == ["Heard you."]
    assert rig.adapter.voices == [] and rig.speech.requests == []


async def test_always_speaks_in_private_chats_only(rigs: Callable[..., Any]) -> None:
    rig: VoiceRig = await rigs(voice_replies="always")
    rig.model.add(ScriptedModel.reply("Private answer."), ScriptedModel.reply("Group answer."))
    await _answer(rig, make_event("hi"))
    assert [m.text for m, _ in rig.adapter.voices] == ["Private answer."]
    await rig.adapter.deliver(
        make_event("hi all", chat_type="group", chat_id="g-1", mentions_bot=True)
    )
    await rig.adapter.wait_for(lambda: bool(rig.adapter.sent))
    assert [s.text for s in rig.adapter.sent] == ["Group answer."]


async def test_an_agents_voice_overrides_the_settings(rigs: Callable[..., Any]) -> None:
    rig: VoiceRig = await rigs(voice=Voice(mode="auto", voice="nova", model="tts-1"))
    rig.model.add(ScriptedModel.reply("Spoken by nova."))
    await _answer(rig, voice_event())
    assert rig.speech.requests == [("Spoken by nova.", "nova", "tts-1")]
    assert len(rig.adapter.voices) == 1


async def test_a_long_answer_goes_as_voice_notes_then_the_text(
    rigs: Callable[..., Any],
) -> None:
    rig: VoiceRig = await rigs(voice_replies="auto")
    text = "The parcel left the depot this morning and arrives on Friday. " * 100
    rig.model.add(ScriptedModel.reply(text.strip()))
    await _answer(rig, voice_event())
    await rig.adapter.wait_for(lambda: bool(rig.adapter.sent))
    assert len(rig.speech.requests) == 2  # 6,300 characters: two parts of at most 4,096
    assert [m.text for m, _ in rig.adapter.voices] == ["", ""]  # too long for a caption
    assert [s.text for s in rig.adapter.sent] == [text.strip()]


async def test_without_voice_with_text_the_note_goes_alone(rigs: Callable[..., Any]) -> None:
    rig: VoiceRig = await rigs(voice_replies="auto", voice_with_text=False)
    rig.model.add(ScriptedModel.reply("Only heard."))
    await _answer(rig, voice_event())
    ((message, _),) = rig.adapter.voices
    assert message.text == "" and rig.adapter.sent == []
    ((oid, _),) = await rig.rows()
    row = await rig.gateway.ledger.get(str(oid))
    assert row is not None and row.content == "Only heard."  # kept, though not shown


async def test_a_chat_that_forbids_voice_notes_gets_text_now_and_no_synthesis_later(
    rigs: Callable[..., Any],
) -> None:
    rig: VoiceRig = await rigs(FakeAdapter(refuse_voice=True), voice_replies="auto")
    rig.model.add(ScriptedModel.reply("First."), ScriptedModel.reply("Second."))
    await _answer(rig, voice_event())
    assert [s.text for s in rig.adapter.sent] == ["First."]
    assert len(rig.speech.requests) == 1
    await rig.adapter.deliver(voice_event())
    await rig.adapter.wait_for(lambda: len(rig.adapter.sent) == 2)
    assert [s.text for s in rig.adapter.sent] == ["First.", "Second."]
    assert len(rig.speech.requests) == 1  # remembered: not spoken again
    # Remembered in the database (by a hash of the chat), so a restart knows it too.
    async with rig.store.transaction() as tx:
        rows = await tx.fetchall("SELECT platform, chat_hash FROM chatflow_voice_refusals")
    assert [r[0] for r in rows] == ["fake"] and "chat-1" not in str(rows)
    assert voice_counts(rig) == {"synthesized": 1.0, "refused_by_chat": 1.0}


async def test_a_speech_failure_sends_the_text_and_a_warning_without_text(
    rigs: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    rig: VoiceRig = await rigs(voice_replies="auto")

    class Broken(SilentSpeech):
        async def synthesize(self, text: str, *, voice: str, model: str) -> bytes:
            raise ModelError("speech synthesis service answered HTTP 500", status_code=500)

    rig.gateway.voice.speech = Broken()
    rig.model.add(ScriptedModel.reply("Secret plan."))
    caplog.set_level(logging.INFO)
    await _answer(rig, voice_event())
    assert [s.text for s in rig.adapter.sent] == ["Secret plan."]
    assert rig.adapter.voices == []
    (warning,) = [r for r in caplog.records if "not synthesized" in r.getMessage()]
    assert warning.levelno == logging.WARNING and "ModelError" in warning.getMessage()
    assert all("Secret" not in r.getMessage() for r in caplog.records)
    assert voice_counts(rig) == {"failed": 1.0}


async def test_a_resend_sends_the_stored_note_again_with_the_marker_never_a_new_synthesis(
    rigs: Callable[..., Any],
) -> None:
    rig: VoiceRig = await rigs(voice_replies="auto")
    rig.adapter.fail_next.append(
        PlatformError("timed out", platform="fake", retryable=True, retry_after=0, ambiguous=True)
    )
    rig.model.add(ScriptedModel.reply("Friday."))
    await rig.adapter.deliver(voice_event())
    await rig.gateway._dispatcher.drain(5)
    ((_, state),) = await rig.rows()
    assert state == "failed" and rig.adapter.voices == []
    assert await rig.gateway.outbox.retry_due() == 1
    ((message, note),) = rig.adapter.voices
    assert message.text == RECOVERED_MARKER + "Friday."
    assert is_ogg_opus(note.data)
    assert len(rig.speech.requests) == 1


def test_speakable_drops_marks_a_voice_would_read() -> None:
    assert speakable("**Bold** and `code`, [the site](https://x.test)") == (
        "Bold and code, the site"
    )
