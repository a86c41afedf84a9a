"""The media step of a turn: download after tx 1, check, read, answer once."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.core.media_store import MediaStore
from bot.core.messages import AudioPart, DocumentPart, ImagePart
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.gateway.contract import MediaAttachment
from bot.gateway.events import event_from_dict, event_to_dict
from bot.gateway.media_fetch import MediaFetcher
from tests.fakes.adapter import FakeAdapter, make_event
from tests.fakes.media_files import jpeg_bytes, ogg_opus_bytes, pdf_bytes
from tests.gateway.conftest import Rig


class FakeTranscriber:
    def __init__(self, text: str) -> None:
        self.text = text
        self.calls: list[tuple[str, bytes]] = []

    async def transcribe(self, data: bytes, *, file_name: str, mime_type: str) -> str:
        self.calls.append((mime_type, data))
        return self.text


def _user_parts(call: RecordedCall) -> list[object]:
    return list(call.messages[-1].parts)


async def test_a_photo_with_a_caption_reaches_the_model_as_an_image_part(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    photo = jpeg_bytes()
    rig.adapter.files["photo-1"] = photo
    rig.model.add(ScriptedModel.reply("That is a kettle."))
    event = make_event(
        "Is this broken?",
        media=[MediaAttachment("image", file_id="photo-1", mime_type="image/jpeg", size=333)],
    )
    assert await rig.adapter.deliver(event)
    (sent,) = await rig.adapter.wait_for_sent(1)
    assert sent.text == "That is a kettle."
    (call,) = rig.model.requests
    assert call.messages[-1].content == "Is this broken?"
    (part,) = _user_parts(call)
    assert isinstance(part, ImagePart) and part.size == len(photo)
    media = rig.gateway.turns.media
    assert media is not None and await media.store.read(part.sha256) == photo


async def test_a_voice_note_is_transcribed_and_the_model_reads_the_words(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    media = rig.gateway.turns.media
    assert media is not None
    media.transcriber = FakeTranscriber("where is order 1001")
    rig.adapter.files["voice-1"] = ogg_opus_bytes()
    rig.model.add(ScriptedModel.reply("It ships today."))
    event = make_event(
        "", media=[MediaAttachment("voice", file_id="voice-1", mime_type="audio/ogg")]
    )
    assert await rig.adapter.deliver(event)
    await rig.adapter.wait_for_sent(1)
    (part,) = _user_parts(rig.model.requests[0])
    assert isinstance(part, AudioPart) and part.voice
    assert part.transcript == "where is order 1001"


async def test_a_pdf_is_read_and_its_text_shown_with_the_file_name(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.adapter.files["doc-1"] = pdf_bytes("Invoice 4471", "Total due: 129.00 EUR")
    rig.model.add(ScriptedModel.reply("You owe 129 EUR."))
    event = make_event(
        "",
        media=[
            MediaAttachment(
                "document", file_id="doc-1", mime_type="application/pdf", file_name="inv.pdf"
            )
        ],
    )
    assert await rig.adapter.deliver(event)
    await rig.adapter.wait_for_sent(1)
    (part,) = _user_parts(rig.model.requests[0])
    assert isinstance(part, DocumentPart) and part.file_name == "inv.pdf"
    assert part.text is not None and "Total due: 129.00 EUR" in part.text


async def test_too_big_is_refused_before_download_and_the_turn_runs_on_the_caption(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs(max_media_bytes=1000)  # type: ignore[misc]
    rig.adapter.files["big"] = jpeg_bytes(padding=5000)
    rig.model.add(ScriptedModel.reply("Tell me more."))
    event = make_event(
        "my kettle",
        media=[MediaAttachment("image", file_id="big", mime_type="image/jpeg", size=6000)],
    )
    assert await rig.adapter.deliver(event)
    (sent,) = await rig.adapter.wait_for_sent(1)
    assert sent.text.startswith("Your photo is too big for me")
    assert sent.text.endswith("Tell me more.")
    assert rig.adapter.fetched == []
    assert _user_parts(rig.model.requests[0]) == []


@pytest.mark.parametrize(
    ("files", "media", "expected"),
    [
        pytest.param(
            {},
            MediaAttachment("image", file_id="gone", mime_type="image/jpeg"),
            "I couldn't download your photo; please send it again.",
            id="download-404",
        ),
        pytest.param(
            {"fake": b"<html>not a photo</html>"},
            MediaAttachment("image", file_id="fake", mime_type="image/jpeg"),
            "That photo is not an image I can open, so I couldn't use it.",
            id="mime-lies",
        ),
        pytest.param(
            {"empty": b""},
            MediaAttachment("voice", file_id="empty", mime_type="audio/ogg"),
            "The voice note you sent is empty.",
            id="zero-bytes",
        ),
        pytest.param(
            {"big": b"x" * 2000},
            MediaAttachment("document", file_id="big", mime_type="application/pdf"),
            "Your file is too big for me.",
            id="too-big-while-downloading",
        ),
    ],
)
async def test_media_only_that_cannot_be_used_gets_one_clear_line_and_no_turn(
    rigs: Callable[..., object], files: dict[str, bytes], media: MediaAttachment, expected: str
) -> None:
    rig: Rig = await rigs(max_media_bytes=1000)  # type: ignore[misc]
    rig.adapter.files.update(files)
    assert await rig.adapter.deliver(make_event("", media=[media]))
    (sent,) = await rig.adapter.wait_for_sent(1)
    assert sent.text == expected
    assert rig.model.requests == []
    assert (await rig.gateway.ledger.status()).get("delivered") == 1


async def test_a_location_and_a_contact_need_no_download(rigs: Callable[..., object]) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("Noted."))
    event = make_event(
        "",
        media=[
            MediaAttachment("location", latitude=52.52, longitude=13.405, title="Shop"),
            MediaAttachment("contact", title="Chandler Bing", phones=("+1 555",)),
        ],
    )
    assert await rig.adapter.deliver(event)
    await rig.adapter.wait_for_sent(1)
    kinds = [type(p).__name__ for p in _user_parts(rig.model.requests[0])]
    assert kinds == ["LocationPart", "ContactPart"]
    assert rig.adapter.fetched == []


async def test_a_rerun_after_a_crash_reads_what_the_first_run_fetched(tmp_path: Path) -> None:
    adapter = FakeAdapter()
    adapter.files["voice-1"] = ogg_opus_bytes()
    transcriber = FakeTranscriber("hello")
    fetcher = MediaFetcher(MediaStore(tmp_path), transcriber=transcriber)
    event = make_event("", media=[MediaAttachment("voice", file_id="voice-1", unique_id="u1")])
    first = await fetcher.prepare(event, adapter)
    # The journal re-runs the same event: same bytes, same transcript, no second fetch.
    again = await fetcher.prepare(event_from_dict(event_to_dict(event)), adapter)
    assert first == again
    assert adapter.fetched == ["voice-1"]
    assert len(transcriber.calls) == 1


def test_the_journal_carries_media_and_old_rows_still_load() -> None:
    media = (
        MediaAttachment("document", file_id="d1", mime_type="application/pdf", size=10),
        MediaAttachment("contact", title="Ana", phones=("+34 600",)),
    )
    event = make_event("see attached", media=media)
    row = json.loads(json.dumps(event_to_dict(event)))
    assert event_from_dict(row).media == media
    text_row = event_to_dict(make_event("plain"))
    assert "media" not in text_row  # text messages' rows are as before
    assert event_from_dict(text_row).media == ()


async def test_no_bytes_transcript_or_file_name_reaches_the_log_at_info(
    rigs: Callable[..., object], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    rig: Rig = await rigs()  # type: ignore[misc]
    media = rig.gateway.turns.media
    assert media is not None
    media.transcriber = FakeTranscriber("my secret address is 5 Elm Street")
    rig.adapter.files["v"] = ogg_opus_bytes()
    rig.adapter.files["d"] = pdf_bytes("Confidential salary 90000")
    rig.model.add(ScriptedModel.reply("ok"), ScriptedModel.reply("ok"))
    await rig.adapter.deliver(make_event("", media=[MediaAttachment("voice", file_id="v")]))
    await rig.adapter.deliver(
        make_event(
            "",
            media=[MediaAttachment("document", file_id="d", file_name="salaries-ana.pdf")],
        )
    )
    await rig.adapter.wait_for_sent(2)
    logged = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    for secret in ("Elm Street", "salaries-ana", "90000", "OggS"):
        assert secret not in logged


class StuckAdapter(FakeAdapter):
    """A platform whose file download never answers."""

    async def fetch_media(self, media: MediaAttachment, *, max_bytes: int) -> bytes:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_stuck_download_gives_up_with_a_line_and_the_turn_runs(tmp_path: Path) -> None:
    fetcher = MediaFetcher(MediaStore(tmp_path), timeout=0.05)
    event = make_event("my kettle", media=[MediaAttachment("image", file_id="p")])
    prepared = await fetcher.prepare(event, StuckAdapter())
    assert prepared.parts == ()
    assert prepared.notices == ("Your photo took too long to fetch; please send it again.",)
