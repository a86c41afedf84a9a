"""Telegram media out: ``sendPhoto`` / ``sendDocument`` uploads against the fake Bot API."""

from __future__ import annotations

import pytest

from bot.errors import PlatformError
from bot.gateway.contract import OutgoingFile
from bot.platforms.telegram import send_media as telegram_send_media
from bot.platforms.telegram.adapter import TelegramAdapter
from tests.fakes.media_files import jpeg_bytes, pdf_bytes
from tests.fakes.telegram_server import FakeTelegramServer, Fault

PHOTO = OutgoingFile("image", jpeg_bytes(), "image/jpeg", "chart.jpg")
REPORT = OutgoingFile("document", pdf_bytes("Q3 report"), "application/pdf", "q3.pdf")


async def test_images_go_as_photos_and_files_as_documents_with_their_bytes(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    telegram, server = telegram_on_fake
    result = await telegram.send_attachments("111111111", [PHOTO, REPORT], thread_id="7")
    photo, document = server.files_sent
    assert (photo.method, photo.chat_id, photo.message_thread_id) == ("sendPhoto", 111111111, 7)
    assert photo.file.data == jpeg_bytes() and photo.file.filename == "chart.jpg"
    assert document.method == "sendDocument" and document.file.data == REPORT.data
    assert document.file.filename == "q3.pdf"
    assert result.message_ids == [str(photo.message_id), str(document.message_id)]


async def test_a_failure_after_a_file_went_out_is_ambiguous(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    telegram, server = telegram_on_fake
    server.inject("sendDocument", Fault.server_error())
    with pytest.raises(PlatformError) as caught:
        await telegram.send_attachments("111111111", [PHOTO, REPORT])
    assert caught.value.ambiguous and caught.value.retryable
    assert [f.method for f in server.files_sent] == ["sendPhoto"]


async def test_a_refused_first_file_is_not_ambiguous(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer],
) -> None:
    telegram, server = telegram_on_fake
    lying = OutgoingFile("image", b"not an image at all", "image/jpeg", "x.jpg")
    with pytest.raises(PlatformError) as caught:
        await telegram.send_attachments("111111111", [lying])
    assert not caught.value.ambiguous and not caught.value.retryable
    assert server.files_sent == []


async def test_an_image_over_telegrams_photo_limit_goes_as_a_document(
    telegram_on_fake: tuple[TelegramAdapter, FakeTelegramServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    telegram, server = telegram_on_fake
    monkeypatch.setattr(telegram_send_media, "MAX_PHOTO_BYTES", len(PHOTO.data) - 1)
    await telegram.send_attachments("111111111", [PHOTO])
    (sent,) = server.files_sent
    assert sent.method == "sendDocument" and sent.file.data == PHOTO.data
