"""WhatsApp media out: upload, then an image or document message, against the fake Graph API."""

from __future__ import annotations

import pytest

from bot.errors import PlatformError
from bot.gateway.contract import OutgoingFile
from bot.platforms.whatsapp.adapter import WhatsAppAdapter
from tests.fakes.media_files import jpeg_bytes, pdf_bytes
from tests.fakes.whatsapp_server import FakeWhatsAppServer

PHOTO = OutgoingFile("image", jpeg_bytes(), "image/jpeg", "chart.jpg")
REPORT = OutgoingFile("document", pdf_bytes("Q3 report"), "application/pdf", "q3.pdf")


async def test_files_are_uploaded_then_sent_as_image_and_document_messages(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    result = await adapter.send_attachments("5491155550000", [PHOTO, REPORT])
    photo, document = graph.uploads
    assert (photo.data, photo.mime_type, photo.filename) == (
        jpeg_bytes(),
        "image/jpeg",
        "chart.jpg",
    )
    assert (document.data, document.mime_type) == (REPORT.data, "application/pdf")
    (image_msg, _), (doc_msg, _) = graph.media_sent
    assert image_msg.json["type"] == "image" and image_msg.json["to"] == "5491155550000"
    assert image_msg.json["image"]["id"] == photo.media_id
    assert doc_msg.json["document"] == {"id": document.media_id, "filename": "q3.pdf"}
    assert result.message_ids == graph.sent_wamids
    # The bot's own file is a message of the bot: a reply quoting it is a reply to the bot.
    assert all(wamid in adapter._sent_ids for wamid in result.message_ids)


async def test_a_refused_second_file_is_ambiguous(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    graph.on_send = lambda record: graph.inject_error(131000)  # after the photo: Meta's 500
    with pytest.raises(PlatformError) as caught:
        await adapter.send_attachments("5491155550000", [PHOTO, REPORT])
    assert caught.value.retryable and caught.value.ambiguous
    assert [r.json["type"] for r, _ in graph.media_sent] == ["image"]


async def test_a_refused_first_file_is_not_ambiguous(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    adapter, graph = whatsapp_on_fake
    graph.inject_error(131026)  # undeliverable: permanent
    with pytest.raises(PlatformError) as caught:
        await adapter.send_attachments("5491155550000", [PHOTO])
    assert not caught.value.retryable and not caught.value.ambiguous
    assert graph.media_sent == []
