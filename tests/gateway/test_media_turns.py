"""The media step of a turn: download after tx 1, check, read, answer once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.core.media_store import MediaStore
from bot.core.messages import AudioPart, DocumentPart, ImagePart
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.gateway.contract import MediaAttachment
from bot.gateway.events import event_from_dict, event_to_dict
from bot.gateway.media_fetch import MediaFetcher
from tests.fakes.adapter import FakeAdapter, Sent, make_event
from tests.fakes.child_processes import Children
from tests.fakes.media_files import (
    hostile_pdf,
    jpeg_bytes,
    ogg_opus_bytes,
    pdf_bytes,
    unknown_filter_pdf,
)
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


# -- hostile and broken files (review 2026-12-01b, F1 and F2) -------------------------------


class SignallingAdapter(FakeAdapter):
    """A ``FakeAdapter`` that says when files were fetched, and may fail a fetch oddly."""

    def __init__(self) -> None:
        super().__init__()
        self.surprise: dict[str, Exception] = {}
        self._fetches = asyncio.Condition()

    async def fetch_media(self, media: MediaAttachment, *, max_bytes: int) -> bytes:
        try:
            if media.file_id in self.surprise:
                raise self.surprise[media.file_id]
            return await super().fetch_media(media, max_bytes=max_bytes)
        finally:
            async with self._fetches:
                self._fetches.notify_all()

    async def wait_for_fetched(self, ids: set[str], timeout: float = 10.0) -> None:
        async with self._fetches:
            await asyncio.wait_for(
                self._fetches.wait_for(lambda: ids <= set(self.fetched)), timeout
            )


def _document(file_id: str) -> MediaAttachment:
    return MediaAttachment(
        "document", file_id=file_id, mime_type="application/pdf", file_name="report.pdf"
    )


async def _answered(rig: Rig, chat_id: str, timeout: float = 10.0) -> Sent:
    await rig.adapter.wait_for(lambda: any(s.chat_id == chat_id for s in rig.adapter.sent), timeout)
    return next(s for s in rig.adapter.sent if s.chat_id == chat_id)


@pytest.mark.parametrize("filter_name", ["/Foo", "/Fl"], ids=["unknown-filter", "removed-filter"])
async def test_a_pdf_pypdf_chokes_on_is_a_line_and_the_turn_runs_once(
    rigs: Callable[..., object], filter_name: str
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.adapter.files["doc"] = unknown_filter_pdf(filter_name)
    rig.model.add(ScriptedModel.reply("What would you like to know?"))
    assert await rig.adapter.deliver(make_event("what does it say?", media=[_document("doc")]))
    (sent,) = await rig.adapter.wait_for_sent(1)
    assert sent.text.startswith("That PDF seems to be damaged, so I could not read it.")
    assert sent.text.endswith("What would you like to know?")
    assert len(rig.model.requests) == 1
    assert (await rig.gateway.ledger.status()).get("delivered") == 1


async def test_an_unexpected_error_fetching_a_file_is_a_line_not_silence(
    rigs: Callable[..., object], caplog: pytest.LogCaptureFixture
) -> None:
    # pywa raised KeyError('sha256') on a lookup answer without that field.
    adapter = SignallingAdapter()
    adapter.surprise["photo"] = KeyError("sha256")
    rig: Rig = await rigs(adapter=adapter)  # type: ignore[misc]
    rig.adapter.files["doc"] = pdf_bytes("Invoice 4471")
    rig.model.add(ScriptedModel.reply("The invoice is 4471."))
    photo = MediaAttachment("image", file_id="photo", mime_type="image/jpeg")
    assert await rig.adapter.deliver(make_event("and these?", media=[photo, _document("doc")]))
    (sent,) = await rig.adapter.wait_for_sent(1)
    assert sent.text.startswith("I couldn't read your photo, sorry.")
    assert sent.text.endswith("The invoice is 4471.")
    (part,) = _user_parts(rig.model.requests[0])  # the other file still made it
    assert isinstance(part, DocumentPart) and part.text == "Invoice 4471"
    assert "sha256" not in caplog.text  # the type is logged, never the message


async def test_hostile_pdfs_cost_their_own_turns_while_other_chats_are_answered(
    rigs: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    children = Children.record(monkeypatch)
    adapter = SignallingAdapter()
    rig: Rig = await rigs(adapter=adapter, document_timeout_seconds=1.5)  # type: ignore[misc]
    adapter.files["photo"] = jpeg_bytes()
    adapter.files["hostile"] = hostile_pdf()  # minutes of pypdf without the timeout

    async def latency(chat_id: str) -> float:
        # A photo, so the turn needs the thread pool too (the media store), as many do.
        rig.model.add(ScriptedModel.reply("Got it."))
        started = time.monotonic()
        event = make_event("is this broken?", chat_id=chat_id, media=[_photo()])
        assert await adapter.deliver(event)
        try:
            await _answered(rig, chat_id, timeout=10.0)
        except TimeoutError:
            return math.inf
        return time.monotonic() - started

    before = [await latency(f"calm-{n}") for n in range(3)]
    # As many hostile files as the default executor has threads (six on two cores).
    hostile = [f"hostile-{n}" for n in range(min(32, (os.cpu_count() or 1) + 4))]
    for chat_id in hostile:
        rig.model.add(ScriptedModel.reply("Got it."))
        event = make_event("", chat_id=chat_id, media=[_document("hostile")])
        assert await adapter.deliver(event)
    await adapter.wait_for_fetched({"hostile"})
    during = [await latency(f"busy-{n}") for n in range(3)]
    print(f"latency before {before}, while hostile PDFs are read {during}")
    assert max(during) < max(1.0, 3 * max(before)), (before, during)
    assert children.running(), "the probes ran while the PDFs were being read"
    # Each hostile file costs its own turn: a line, and the turn goes on without it.
    for chat_id in hostile:
        sent = await _answered(rig, chat_id, timeout=20.0)
        assert sent.text.startswith(
            "I could not read that PDF: it took too long to open, so I left it out."
        )
    assert children.running() == []


async def test_a_stop_while_pdfs_are_read_ends_within_the_grace_and_leaves_nothing(
    rigs: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    children = Children.record(monkeypatch)
    adapter = SignallingAdapter()
    rig: Rig = await rigs(adapter=adapter, document_timeout_seconds=60)  # type: ignore[misc]
    adapter.files["hostile"] = hostile_pdf()
    for n in range(min(32, (os.cpu_count() or 1) + 4)):
        event = make_event("", chat_id=f"hostile-{n}", media=[_document("hostile")])
        assert await adapter.deliver(event)
    await adapter.wait_for_fetched({"hostile"})
    with contextlib.suppress(TimeoutError):
        await children.wait_for(2, timeout=3.0)
    started = time.monotonic()
    await rig.gateway.stop(grace=1.0)
    assert time.monotonic() - started < 2.5
    # Nothing left behind in the thread pool: asyncio.run() (the process's exit) and
    # every to_thread and DNS lookup of a next start would wait for it.
    assert await asyncio.wait_for(asyncio.to_thread(lambda: 1), 2.0) == 1
    assert len(children.processes) == 2 and children.running() == []


def _photo() -> MediaAttachment:
    return MediaAttachment("image", file_id="photo", mime_type="image/jpeg")
