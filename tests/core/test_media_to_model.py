"""Media reaching the model: image parts, no-vision agents, transcription, documents, demo model."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from bot.core.agent import Agent
from bot.core.documents import MAX_DOCUMENT_CHARS, extract_text
from bot.core.media_store import MediaStore
from bot.core.messages import (
    AudioPart,
    ContactPart,
    DocumentPart,
    ImagePart,
    LocationPart,
    Message,
    Role,
)
from bot.core.models.base import current_agent_name
from bot.core.models.offline import OfflineModel
from bot.core.models.openai_compat import OpenAICompatibleModel, to_openai_messages
from bot.core.models.scripted import ScriptedModel
from bot.core.models.transcription import OpenAITranscriber
from bot.core.parts import NO_VISION_NOTE
from bot.core.runner import Runner
from bot.errors import MediaError, ModelError
from tests.fakes.media_files import encrypted_pdf, jpeg_bytes, ogg_opus_bytes, pdf_bytes
from tests.fakes.openai_server import FakeOpenAIServer


async def _image(store: MediaStore, data: bytes) -> ImagePart:
    sha = await store.put(data)
    return ImagePart(sha256=sha, mime_type="image/jpeg", size=len(data))


async def test_an_image_goes_as_an_image_url_part_beside_its_caption(tmp_path: Path) -> None:
    store = MediaStore(tmp_path)
    photo = jpeg_bytes()
    part = await _image(store, photo)
    async with FakeOpenAIServer() as server:
        server.add(server.reply("A small white square."))
        model = OpenAICompatibleModel(server.api_key, server.base_url, media_store=store)
        try:
            answer = await model.complete(
                model="gpt-test",
                system="Describe images.",
                messages=[Message(role=Role.USER, content="What is this?", parts=[part])],
                tools=[],
            )
        finally:
            await model.aclose()
    assert answer.content == "A small white square."
    (request,) = server.chat_requests
    assert server.validation_errors == []
    user = request.messages[-1]
    assert user["role"] == "user"
    assert user["content"][0]["type"] == "text"
    assert user["content"][0]["text"].startswith("What is this?")
    assert request.images == [("image/jpeg", photo)]


async def test_only_the_latest_message_resends_its_image(tmp_path: Path) -> None:
    store = MediaStore(tmp_path)
    old = await _image(store, jpeg_bytes(padding=10))
    new = await _image(store, jpeg_bytes())
    history = [
        Message(role=Role.USER, content="first", parts=[old]),
        Message(role=Role.MODEL, content="a photo"),
        Message(role=Role.USER, content="and this?", parts=[new]),
    ]
    url = f"data:image/jpeg;base64,{base64.b64encode(jpeg_bytes()).decode()}"
    messages = to_openai_messages("", history, {new.sha256: url})
    assert isinstance(messages[0]["content"], str)
    assert "no longer attached" in messages[0]["content"]
    assert messages[2]["content"][1] == {"type": "image_url", "image_url": {"url": url}}


async def test_a_text_only_history_is_sent_as_plain_strings() -> None:
    messages = to_openai_messages("sys", [Message(role=Role.USER, content="hi")])
    assert messages[1] == {"role": "user", "content": "hi"}


async def test_an_agent_without_vision_never_gets_the_image_and_the_user_is_told() -> None:
    model = ScriptedModel([ScriptedModel.reply("Nice caption.")])
    agent = Agent(name="Blind", instructions="Help.", vision=False)
    runner = Runner(agent, model=model)
    part = ImagePart(sha256="b" * 64, mime_type="image/jpeg", size=1000)
    result = await runner.run_async("s-1", "my broken kettle", parts=[part])
    (call,) = model.requests
    assert not any(isinstance(p, ImagePart) for m in call.messages for p in m.parts)
    assert "cannot see" in str(call.messages[-1].parts[0])
    assert result.content.startswith(NO_VISION_NOTE)
    assert result.content.endswith("Nice caption.")
    # The stored history keeps the image reference (a vision agent could use it later).
    session = await runner.store.get("s-1")
    assert session is not None and isinstance(session.history[0].parts[0], ImagePart)


async def test_a_vision_agent_gets_the_parts_with_the_user_message() -> None:
    model = ScriptedModel([ScriptedModel.reply("ok")])
    runner = Runner(Agent(name="Eyes", instructions="Help."), model=model)
    part = ImagePart(sha256="c" * 64, mime_type="image/png", size=10)
    result = await runner.run_async("s-1", "", parts=[part])
    assert result.content == "ok"
    user = model.requests[0].messages[-1]
    assert user.content is None and user.parts == [part]


async def test_voice_is_transcribed_through_the_audio_endpoint() -> None:
    audio = ogg_opus_bytes()
    async with FakeOpenAIServer() as server:
        server.transcripts.append("where is my parcel")
        transcriber = OpenAITranscriber(server.api_key, server.base_url, model="whisper-1")
        try:
            text = await transcriber.transcribe(audio, file_name="voice.ogg", mime_type="audio/ogg")
        finally:
            await transcriber.aclose()
    assert text == "where is my parcel"
    assert server.transcription_files == [("whisper-1", "voice.ogg", audio)]


async def test_a_failing_transcription_service_is_a_model_error() -> None:
    async with FakeOpenAIServer() as server:
        server.transcription_faults.extend(
            [server.error(400, "bad audio"), server.error(400, "bad audio")]
        )
        transcriber = OpenAITranscriber(server.api_key, server.base_url, max_retries=0)
        try:
            with pytest.raises(ModelError, match="400"):
                await transcriber.transcribe(b"OggS", file_name="v.ogg", mime_type="audio/ogg")
        finally:
            await transcriber.aclose()


async def test_pdf_text_is_extracted() -> None:
    result = await extract_text(
        pdf_bytes("Invoice 4471", "Total due: 129.00 EUR"), "application/pdf", "invoice.pdf"
    )
    assert "Invoice 4471" in result.text and "129.00" in result.text
    assert not result.truncated


async def test_long_text_is_cut_to_the_budget() -> None:
    body = ("A line of the manual.\n" * 2000).encode()
    result = await extract_text(body, "text/plain", "manual.txt")
    assert result.truncated and len(result.text) <= MAX_DOCUMENT_CHARS
    assert result.text.endswith("manual.")


@pytest.mark.parametrize(
    ("data", "mime", "reason"),
    [
        pytest.param(b"", "application/pdf", "empty", id="zero-bytes"),
        pytest.param(b"%PDF-1.4 not really", "application/pdf", "damaged", id="malformed"),
        pytest.param(jpeg_bytes(), "application/pdf", "not one", id="mime-lies"),
        pytest.param(b"\x00\x01\x02binary", "text/plain", "not a text", id="binary-as-text"),
    ],
)
async def test_unreadable_documents_give_a_reason(data: bytes, mime: str, reason: str) -> None:
    with pytest.raises(MediaError, match=reason):
        await extract_text(data, mime, "file")


async def test_an_encrypted_pdf_gives_a_reason() -> None:
    with pytest.raises(MediaError, match="password"):
        await extract_text(encrypted_pdf(), "application/pdf", "secret.pdf")


async def _offline(message: Message) -> str:
    token = current_agent_name.set("Triage")
    try:
        answer = await OfflineModel().complete(
            model="offline", system="", messages=[message], tools=[]
        )
    finally:
        current_agent_name.reset(token)
    assert answer.content is not None
    return answer.content


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        pytest.param(
            Message(
                role=Role.USER,
                content="What bird is this?",
                parts=[ImagePart(sha256="d" * 64, mime_type="image/jpeg", size=34 * 1024)],
            ),
            'I received a photo (34 KB) with the caption "What bird is this?"; '
            "a vision model would describe it.",
            id="photo",
        ),
        pytest.param(
            Message(
                role=Role.USER,
                parts=[
                    AudioPart(
                        sha256="e" * 64,
                        mime_type="audio/ogg",
                        size=9000,
                        voice=True,
                        transcript="call me back",
                    )
                ],
            ),
            'I received a voice note (9 KB) that says: "call me back".',
            id="voice",
        ),
        pytest.param(
            Message(
                role=Role.USER,
                parts=[
                    DocumentPart(
                        sha256="f" * 64,
                        mime_type="application/pdf",
                        size=2048,
                        file_name="invoice.pdf",
                        text="Invoice 4471",
                    )
                ],
            ),
            'I received the document "invoice.pdf" (2 KB), which begins: "Invoice 4471".',
            id="document",
        ),
        pytest.param(
            Message(role=Role.USER, parts=[LocationPart(latitude=52.52, longitude=13.405)]),
            "I received a location: 52.52000, 13.40500.",
            id="location",
        ),
        pytest.param(
            Message(role=Role.USER, parts=[ContactPart(name="Chandler Bing", phones=["+1 5"])]),
            "I received a contact card for Chandler Bing.",
            id="contact",
        ),
    ],
)
async def test_the_offline_demo_answers_media_plainly(message: Message, expected: str) -> None:
    assert await _offline(message) == "[offline demo] " + expected


async def test_a_model_that_refuses_images_is_asked_again_without_them(tmp_path: Path) -> None:
    store = MediaStore(tmp_path)
    part = await _image(store, jpeg_bytes())
    photo = Message(role=Role.USER, content="What is this?", parts=[part])
    async with FakeOpenAIServer() as server:
        server.add(
            server.error(400, "image input is not supported by this model"),
            server.reply("I only read your question."),
            server.reply("Still blind."),
        )
        model = OpenAICompatibleModel(server.api_key, server.base_url, media_store=store)
        try:
            first = await model.complete(model="text-only", system="", messages=[photo], tools=[])
            later = await model.complete(model="text-only", system="", messages=[photo], tools=[])
        finally:
            await model.aclose()
    assert first.content == f"{NO_VISION_NOTE}\n\nI only read your question."
    assert later.content == f"{NO_VISION_NOTE}\n\nStill blind."  # learned: no second refusal
    refused, retried, third = server.chat_requests
    assert refused.images and not retried.images and not third.images
    assert "cannot see" in retried.messages[-1]["content"]
