"""WhatsApp media: recorded pywa payloads to attachments, downloads from the fake Graph API."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from bot.errors import MediaError
from bot.gateway.contract import MediaAttachment, MessageEvent
from bot.platforms.whatsapp import WhatsAppAdapter
from bot.platforms.whatsapp_payload import parse_webhook
from tests.fakes.media_files import jpeg_bytes, ogg_opus_bytes
from tests.fakes.whatsapp_server import FakeWhatsAppServer

DATA = Path(__file__).resolve().parents[1] / "data" / "whatsapp"
PYWA_PHONE_ID = "1122334455667"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return data


def event_of(name: str, phone_id: str = PYWA_PHONE_ID) -> MessageEvent:
    (event,) = parse_webhook(load(name), phone_id=phone_id).events
    return event


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param(
            "image",
            MediaAttachment("image", file_id="65463453", mime_type="image/jpeg"),
            id="image",
        ),
        pytest.param(
            "voice",
            MediaAttachment(
                "voice", file_id="1234567890987654321", mime_type="audio/ogg; codecs=opus"
            ),
            id="voice-note",
        ),
        pytest.param(
            "audio",
            MediaAttachment(
                "audio", file_id="1234567890987654321", mime_type="audio/ogg; codecs=opus"
            ),
            id="audio-file",
        ),
        pytest.param(
            "document",
            MediaAttachment(
                "document",
                file_id="1234567890987654321",
                mime_type="application/pdf",
                file_name="filename.pdf",
            ),
            id="document",
        ),
        pytest.param(
            "location",
            MediaAttachment(
                "location",
                latitude=37.4611978,
                longitude=-122.2164385,
                title="Facebook HQ",
                address="1 Hacker Way, Menlo Park, CA 94025",
            ),
            id="venue",
        ),
    ],
)
def test_recorded_payloads_give_attachments(name: str, expected: MediaAttachment) -> None:
    assert event_of(name).media == (expected,)


def test_a_document_keeps_its_caption_as_text() -> None:
    assert event_of("document").text == "caption"


def test_contacts_give_one_card_each() -> None:
    cards = event_of("contacts").media
    assert [(c.title, c.phones) for c in cards] == [
        ("Chandler Bing", ("+1 555-555-5555",)),
        ("Monica", ("+1 666-666-6666",)),
        ("Rachel Green", ("+1 777-777-7777",)),
    ]


def test_a_sticker_is_answered_in_a_dm_and_ignored_in_a_group() -> None:
    dm = event_of("sticker")
    assert dm.media_kind == "sticker" and dm.media == ()
    group = copy.deepcopy(load("sticker"))
    group["entry"][0]["changes"][0]["value"]["messages"][0]["group_id"] = "Y2FwaV9ncm91cDox"
    assert parse_webhook(group, phone_id=PYWA_PHONE_ID).events == []


async def test_media_id_then_url_then_bytes_with_the_token(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    graph.add_media("m-1", ogg_opus_bytes(), "audio/ogg")
    media = MediaAttachment("voice", file_id="m-1")
    assert await adapter.fetch_media(media, max_bytes=10**6) == ogg_opus_bytes()
    # The URL lasts minutes; a re-run (after a crash) asks for a fresh one by the id.
    graph.expire_media_urls()
    assert await adapter.fetch_media(media, max_bytes=10**6) == ogg_opus_bytes()
    assert graph.media_lookups == ["m-1", "m-1"]
    assert graph.media_downloads == ["m-1", "m-1"]


@pytest.mark.parametrize(
    ("stored", "max_bytes", "message"),
    [
        pytest.param(None, 10**6, "couldn't download", id="unknown-media-id"),
        pytest.param(jpeg_bytes(padding=4000), 1000, "too big", id="over-the-limit"),
    ],
)
async def test_unusable_media_are_media_errors(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
    stored: bytes | None,
    max_bytes: int,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    adapter, graph = whatsapp_on_fake
    if stored is not None:
        graph.add_media("m-2", stored, "image/jpeg")
    with pytest.raises(MediaError, match=message):
        await adapter.fetch_media(MediaAttachment("image", file_id="m-2"), max_bytes=max_bytes)
    assert graph.media_downloads == []
    assert "media-download" not in caplog.text  # the short-lived URL is never logged
