"""WhatsApp media: recorded pywa payloads to attachments, downloads from the fake Graph API."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bot.errors import ConfigurationError, MediaError
from bot.gateway.contract import MediaAttachment, MessageEvent
from bot.platforms.whatsapp import media as whatsapp_media
from bot.platforms.whatsapp.adapter import WhatsAppAdapter
from bot.platforms.whatsapp.payload import parse_webhook
from tests.fakes.media_files import jpeg_bytes, ogg_opus_bytes
from tests.fakes.serving import LocalServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer

DATA = Path(__file__).resolve().parents[2] / "data" / "whatsapp"
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


# -- where the Graph token goes (review 2026-12-01b, F8) ------------------------------------


class Elsewhere:
    """Another origin than the Graph API's: records what reaches it, serves a photo."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []
        self.server = LocalServer(Starlette(routes=[Route("/{path:path}", self._serve)]))
        self.origin = ""

    async def _serve(self, request: Request) -> Response:
        self.seen.append((request.url.path, request.headers.get("authorization")))
        return Response(jpeg_bytes(), media_type="image/jpeg")

    async def __aenter__(self) -> Elsewhere:
        self.origin = f"http://127.0.0.1:{await self.server.start()}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop()


@pytest.fixture
async def elsewhere() -> AsyncIterator[Elsewhere]:
    async with Elsewhere() as made:
        yield made


@pytest.fixture
async def graph() -> AsyncIterator[FakeWhatsAppServer]:
    async with FakeWhatsAppServer() as server:
        yield server


@asynccontextmanager
async def adapter_for(graph: FakeWhatsAppServer, *hosts: str) -> AsyncIterator[WhatsAppAdapter]:
    extra: dict[str, Any] = {"media_hosts": hosts} if hosts else {}
    adapter = WhatsAppAdapter(
        graph.phone_id,
        "test-token",
        verify_token="vt",
        app_secret="secret",
        api_base_url=graph.base_url,
        send_pause=0,
        **extra,
    )

    async def accept(event: MessageEvent) -> bool:
        return True

    await adapter.start(accept)
    try:
        yield adapter
    finally:
        await adapter.stop()


async def test_the_token_never_goes_to_a_host_the_lookup_names_unless_allowed(
    graph: FakeWhatsAppServer, elsewhere: Elsewhere, caplog: pytest.LogCaptureFixture
) -> None:
    graph.add_media("m-1", jpeg_bytes(), "image/jpeg")
    graph.media_lookup_url["m-1"] = f"{elsewhere.origin}/steal"
    async with adapter_for(graph) as adapter:
        with pytest.raises(MediaError, match="couldn't download"):
            await adapter.fetch_media(MediaAttachment("image", file_id="m-1"), max_bytes=10**6)
    assert elsewhere.seen == []
    assert "/steal" not in caplog.text  # the host may be logged, never the URL
    # Listed by the operator (WHATSAPP_MEDIA_HOSTS), the same answer is fetched.
    async with adapter_for(graph, elsewhere.origin) as adapter:
        data = await adapter.fetch_media(MediaAttachment("image", file_id="m-1"), max_bytes=10**6)
    assert data == jpeg_bytes()
    assert elsewhere.seen == [("/steal", "Bearer test-token")]


async def test_a_redirect_to_another_host_never_carries_the_token(
    graph: FakeWhatsAppServer, elsewhere: Elsewhere
) -> None:
    graph.add_media("m-1", jpeg_bytes(), "image/jpeg")
    graph.media_redirects["m-1"] = f"{elsewhere.origin}/after-redirect"
    async with adapter_for(graph) as adapter:
        with pytest.raises(MediaError, match="couldn't download"):
            await adapter.fetch_media(MediaAttachment("image", file_id="m-1"), max_bytes=10**6)
    assert elsewhere.seen == []  # not followed at all to a host that is not allowed
    async with adapter_for(graph, elsewhere.origin) as adapter:
        data = await adapter.fetch_media(MediaAttachment("image", file_id="m-1"), max_bytes=10**6)
    assert data == jpeg_bytes()
    assert elsewhere.seen == [("/after-redirect", None)]  # allowed, but without the token


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1", True),
        ("https://scontent.xx.fbcdn.net/v/t1/abc", True),
        ("https://mmg.whatsapp.net/d/f/abc.enc", True),
        ("https://graph.facebook.com/v23.0/media", True),  # the API base's own origin
        ("http://lookaside.fbsbx.com/whatsapp_business/attachments/?mid=1", False),
        ("https://lookaside.fbsbx.com.evil.example/x", False),
        ("https://evilfbcdn.net/x", False),
        ("https://fbcdn.net.evil.example/x", False),
        ("http://graph.facebook.com/v23.0/media", False),
        ("https://127.0.0.1:8443/x", False),
    ],
)
def test_metas_media_hosts_over_https_are_the_default_allow_list(url: str, allowed: bool) -> None:
    hosts = whatsapp_media.MediaHosts.build("https://graph.facebook.com")
    assert hosts.allows(httpx.URL(url)) is allowed


@pytest.mark.parametrize("entry", ["ftp://files.example", "https://x.example/path", "*", "a b"])
def test_a_wrong_media_host_entry_stops_start_up_naming_the_setting(entry: str) -> None:
    with pytest.raises(ConfigurationError, match="WHATSAPP_MEDIA_HOSTS"):
        whatsapp_media.MediaHosts.build("https://graph.facebook.com", [entry])


async def test_a_lookup_answer_without_sha256_still_downloads(
    whatsapp_on_fake: tuple[WhatsAppAdapter, FakeWhatsAppServer],
) -> None:
    # Review 2026-12-01b, F2: pywa's typed answer raised KeyError('sha256').
    adapter, graph = whatsapp_on_fake
    graph.add_media("m-1", ogg_opus_bytes(), "audio/ogg")
    graph.media_lookup_omits.update({"sha256", "file_size", "messaging_product"})
    media = MediaAttachment("voice", file_id="m-1")
    assert await adapter.fetch_media(media, max_bytes=10**6) == ogg_opus_bytes()
