"""Telegram media: recorded payloads to attachments, and downloads from the fake Bot API."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bot.errors import MediaError, PlatformError
from bot.gateway.contract import MediaAttachment, MessageEvent
from bot.platforms.telegram.adapter import TelegramAdapter
from bot.platforms.telegram.mapping import map_update
from tests.fakes.media_files import jpeg_bytes, ogg_opus_bytes
from tests.fakes.telegram_server import FakeTelegramServer

DATA = Path(__file__).resolve().parents[2] / "data" / "telegram"
BOT_ID = 5000000001
PERSON = {"id": 111111111, "is_bot": False, "first_name": "Alice"}


def load(name: str, **message: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    data["message"].update(message)
    return data


def mapped(update: dict[str, Any]) -> MessageEvent:
    event = map_update(update, bot_id=BOT_ID, bot_username="chatflow_test_bot")
    assert event is not None
    return event


def test_a_photo_gives_its_largest_size_and_keeps_the_caption() -> None:
    event = mapped(load("photo_caption"))
    assert event.text == "What is this bird?"
    assert event.media == (
        MediaAttachment(
            "image",
            file_id="AgACAgQAAxkBAAIBsmbE2",
            unique_id="AQADsmbE2",
            mime_type="image/jpeg",
            size=45012,
        ),
    )


def test_a_voice_note() -> None:
    (media,) = mapped(load("voice")).media
    assert (media.kind, media.file_id, media.mime_type, media.size) == (
        "voice",
        "AwACAgQAAxkBAAIBtG",
        "audio/ogg",
        9000,
    )


def test_a_document_keeps_its_name_and_claimed_type() -> None:
    # Recorded in a supergroup by Telegram.Bot's tests; its MIME type is "plain/text".
    event = mapped(load("document"))
    (media,) = event.media
    assert media.kind == "document" and media.file_name == "test_file.txt"
    assert media.mime_type == "plain/text" and media.size == 123456
    assert event.text == "Test Document Description"


def test_an_audio_file() -> None:
    (media,) = mapped(load("audio", **{"from": PERSON})).media
    assert (media.kind, media.mime_type, media.size) == ("audio", "audio/mpeg", 20096)


def test_a_location_needs_no_download() -> None:
    (media,) = mapped(load("location", **{"from": PERSON})).media
    assert media.kind == "location" and media.file_id is None
    assert (media.latitude, media.longitude) == (26.090577, 127.479471)


def test_a_bare_sticker_in_a_group_is_ignored_but_answered_in_a_dm() -> None:
    dm = load("sticker")
    assert map_update(dm, bot_id=BOT_ID, bot_username="chatflow_test_bot") is not None
    group = load("sticker", chat={"id": -100123, "type": "supergroup", "title": "Club"})
    assert map_update(group, bot_id=BOT_ID, bot_username="chatflow_test_bot") is None


async def test_get_file_then_the_file_endpoint_serve_the_bytes(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    telegram, server = telegram_on_fake
    server.add_file("voice-1", ogg_opus_bytes())
    data = await telegram.fetch_media(
        MediaAttachment("voice", file_id="voice-1"), max_bytes=1_000_000
    )
    assert data == ogg_opus_bytes()
    assert server.downloads == ["files/voice-1.bin"]


async def test_the_file_base_url_is_configurable(tmp_path: Path) -> None:
    async with FakeTelegramServer() as server, FakeTelegramServer() as files:
        files.token = server.token
        files.add_file("p", jpeg_bytes())
        telegram = TelegramAdapter(
            server.token,
            base_url=server.base_url,
            file_base_url=f"http://127.0.0.1:{files.port}/file/bot",
            poll_timeout=1,
        )
        server.add_file("p", b"not these bytes")

        async def on_event(event: MessageEvent) -> bool:
            return True

        await telegram.start(on_event)
        try:
            data = await telegram.fetch_media(
                MediaAttachment("image", file_id="p"), max_bytes=10**6
            )
        finally:
            await telegram.stop()
    assert data == jpeg_bytes()
    assert server.downloads == [] and files.downloads == ["files/p.bin"]


@pytest.mark.parametrize(
    ("size", "file_id", "error"),
    [
        pytest.param(2000, "big", MediaError, id="over-our-limit"),
        pytest.param(21 * 1024 * 1024, "huge", MediaError, id="over-telegrams-20mb"),
        pytest.param(10, "unknown", MediaError, id="forged-file-id"),
    ],
)
async def test_unusable_files_are_media_errors(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
    size: int,
    file_id: str,
    error: type[Exception],
) -> None:
    telegram, server = telegram_on_fake
    if file_id != "unknown":
        server.add_file(file_id, b"x" * size)
    with pytest.raises(error) as raised:
        await telegram.fetch_media(MediaAttachment("image", file_id=file_id), max_bytes=1000)
    assert not isinstance(raised.value, PlatformError)
    assert server.downloads == []


def test_a_contact_card_and_a_venue() -> None:
    # No recorded Telegram contact or venue exists in ../shared/payloads: these are the
    # photo_caption.json DM with its media swapped for the Bot API's Contact and Venue.
    base = load("photo_caption")
    del base["message"]["photo"], base["message"]["caption"]
    contact = copy.deepcopy(base)
    contact["message"]["contact"] = {
        "phone_number": "+34600000000",
        "first_name": "Ana",
        "last_name": "García",
    }
    (card,) = mapped(contact).media
    assert (card.kind, card.title, card.phones) == ("contact", "Ana García", ("+34600000000",))
    venue = copy.deepcopy(base)
    location = {"latitude": 40.4168, "longitude": -3.7038}
    venue["message"]["venue"] = {
        "location": location,
        "title": "Tienda Sol",
        "address": "Puerta del Sol 1",
    }
    venue["message"]["location"] = location
    (place,) = mapped(venue).media
    assert (place.kind, place.title, place.latitude) == ("location", "Tienda Sol", 40.4168)


async def test_the_size_limit_holds_while_a_file_of_unknown_size_streams_in(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    # Review 2026-12-01b, F9: without file_size the whole file was read, then refused.
    telegram, server = telegram_on_fake
    server.add_file("big", jpeg_bytes(padding=3 * 1024 * 1024))
    server.file_size_known = False
    server.download_stall_after = 2 * 1024 * 1024  # the rest of it never comes
    with pytest.raises(MediaError, match="too big"):
        await asyncio.wait_for(
            telegram.fetch_media(MediaAttachment("image", file_id="big"), max_bytes=1024 * 1024),
            5.0,
        )
    assert server.downloads == ["files/big.bin"]
    assert server.download_bytes_sent <= 2 * 1024 * 1024


async def test_a_file_of_unknown_size_under_the_limit_streams_whole(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    telegram, server = telegram_on_fake
    photo = jpeg_bytes(padding=300_000)
    server.add_file("photo", photo)
    server.file_size_known = False
    server.download_stall_after = 10 * 1024 * 1024  # streamed in chunks, never held
    media = MediaAttachment("image", file_id="photo")
    assert await telegram.fetch_media(media, max_bytes=1024 * 1024) == photo
