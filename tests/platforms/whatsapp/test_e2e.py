"""WhatsApp end to end over real HTTP on 127.0.0.1.

The adapter's webhook route runs in the bot's own ``HttpServer`` (uvicorn), Meta's side is a
``WebhookSender`` posting signed bodies, and replies go to the fake Graph API.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent
from bot.platforms.whatsapp.adapter import WEBHOOK_PATH, WhatsAppAdapter
from bot.server import HttpServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import GROUP_ID, PHONE_NUMBER_ID, USER_WA_ID, WebhookSender

APP_SECRET = "e2e-app-secret"
TOKEN = "e2e-token"
API_VERSION = "23.0"


class Gateway:
    """Records events and, like the real gateway, answers them outside the webhook call."""

    def __init__(self, adapter: WhatsAppAdapter, *, reply: bool) -> None:
        self.adapter = adapter
        self.reply = reply
        self.events: list[MessageEvent] = []
        self.results: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Condition()

    async def on_event(self, event: MessageEvent) -> bool:
        async with self._changed:
            self.events.append(event)
            self._changed.notify_all()
        if self.reply:
            task = asyncio.create_task(self._answer(event))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return True

    async def _answer(self, event: MessageEvent) -> None:
        try:
            result: Any = await self.adapter.send(
                event.source.chat_id,
                f"Recibido: {event.text}",
                reply_to=event.platform_message_id,
            )
        except PlatformError as exc:
            result = exc
        async with self._changed:
            self.results.append(result)
            self._changed.notify_all()

    async def wait_for_events(self, n: int) -> list[MessageEvent]:
        async with asyncio.timeout(5), self._changed:
            await self._changed.wait_for(lambda: len(self.events) >= n)
        return list(self.events)

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks)


@dataclass
class Rig:
    graph: FakeWhatsAppServer
    adapter: WhatsAppAdapter
    gateway: Gateway
    sender: WebhookSender


@contextlib.asynccontextmanager
async def rig(*, reply: bool = True, read_timeout: float = 10.0) -> AsyncIterator[Rig]:
    async with FakeWhatsAppServer(
        phone_id=PHONE_NUMBER_ID, token=TOKEN, api_version=API_VERSION
    ) as graph:
        adapter = WhatsAppAdapter(
            PHONE_NUMBER_ID,
            TOKEN,
            verify_token="e2e-verify",
            app_secret=APP_SECRET,
            api_base_url=graph.base_url,
            api_version=API_VERSION,
            send_pause=0,
            timeout=read_timeout,
        )
        gateway = Gateway(adapter, reply=reply)
        await adapter.start(gateway.on_event)
        # The bot's own server, on a free port.
        server = HttpServer(Starlette(routes=list(adapter.routes())), "127.0.0.1", 0)
        try:
            await server.start()
            try:
                url = f"http://127.0.0.1:{server.port}{WEBHOOK_PATH}"
                yield Rig(graph, adapter, gateway, WebhookSender(url, APP_SECRET))
                await gateway.drain()
            finally:
                await server.stop()
        finally:
            await adapter.stop()


async def test_signed_text_is_answered_through_the_graph_api() -> None:
    async with rig() as r:
        payload = r.sender.text("¿Abrís hoy?")
        wamid = payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
        (response,) = await r.sender.post(payload)
        assert response.status_code == 200
        (sent,) = await r.graph.wait_for_sent(1)
    assert sent.path == f"/v{API_VERSION}/{PHONE_NUMBER_ID}/messages"
    assert sent.authorization == f"Bearer {TOKEN}"
    assert sent.json["to"] == USER_WA_ID
    assert sent.json["recipient_type"] == "individual"
    assert sent.json["context"] == {"message_id": wamid}
    assert sent.json["text"]["body"] == "Recibido: ¿Abrís hoy?"
    (result,) = r.gateway.results
    assert result.message_ids[0].startswith("wamid.")
    assert result.message_ids[0] in r.adapter._sent_ids  # a reply quoting it is to the bot


async def test_verify_handshake_over_http() -> None:
    async with rig(reply=False) as r, httpx.AsyncClient() as client:
        params = {"hub.mode": "subscribe", "hub.verify_token": "e2e-verify", "hub.challenge": "42"}
        good = await client.get(r.sender.url, params=params)
        bad = await client.get(r.sender.url, params={**params, "hub.verify_token": "nope"})
    assert (good.status_code, good.text) == (200, "42")
    assert bad.status_code == 403


async def test_same_body_posted_five_times_concurrently_is_handed_over_five_times() -> None:
    async with rig(reply=False) as r:
        payload = r.sender.text("hola")
        responses = await r.sender.post(payload, times=5, concurrent=True)
        assert [resp.status_code for resp in responses] == [200] * 5
        events = await r.gateway.wait_for_events(5)
    assert len(events) == 5
    assert len({e.message_id for e in events}) == 1


@pytest.mark.parametrize(
    ("signature", "status"), [("bad", 403), ("missing", 401)], ids=["bad-403", "missing-401"]
)
async def test_bad_signature_hands_nothing_over(signature: str, status: int) -> None:
    async with rig() as r:
        (response,) = await r.sender.post(r.sender.text("intruso"), signature=signature)
        assert response.status_code == status
    assert r.gateway.events == []
    assert r.graph.requests == []


async def test_batched_body_hands_over_every_message() -> None:
    async with rig() as r:
        payload = r.sender.batched([[["uno", "dos"], ["tres"]], [["cuatro", "cinco"]]])
        (response,) = await r.sender.post(payload)
        assert response.status_code == 200
        assert [e.text for e in r.gateway.events] == ["uno", "dos", "tres", "cuatro", "cinco"]
        sent = await r.graph.wait_for_sent(5)
    assert sorted(s.json["to"] for s in sent) == sorted(e.source.chat_id for e in r.gateway.events)


async def test_group_message_is_answered_in_the_group() -> None:
    async with rig() as r:
        payload = r.sender.group_text("@15550783881 ¿mesa para 4?", wa_id="447700900123")
        wamid = payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
        (response,) = await r.sender.post(payload)
        assert response.status_code == 200
        (sent,) = await r.graph.wait_for_sent(1)
    assert sent.json["recipient_type"] == "group"
    assert sent.json["to"] == GROUP_ID
    assert sent.json["context"] == {"message_id": wamid}
    assert "447700900123" not in str(sent.json)


async def test_failed_status_for_our_reply_reaches_the_hook() -> None:
    async with rig() as r:
        failures: list[tuple[str, str]] = []

        async def on_failed(wamid: str, error: str) -> None:
            failures.append((wamid, error))

        r.adapter.on_status_failed = on_failed
        await r.sender.post(r.sender.text("hola"))
        await r.graph.wait_for_sent(1)
        await r.gateway.drain()
        (result,) = r.gateway.results
        ours = result.message_ids[0]
        (response,) = await r.sender.post(r.sender.status(ours, "failed", error_code=131047))
        assert response.status_code == 200
    assert len(r.gateway.events) == 1
    assert failures and failures[0][0] == ours and "131047" in failures[0][1]


async def test_reply_to_our_message_is_a_reply_to_the_bot() -> None:
    async with rig(reply=False) as r:
        ours = (await r.adapter.send(USER_WA_ID, "¿Confirmas?")).message_ids[0]
        payload = r.sender.text("sí", context={"from": USER_WA_ID, "id": ours})
        await r.sender.post(payload)
        (event,) = await r.gateway.wait_for_events(1)
    assert event.replies_to_bot
    assert event.reply_to_id == ours


async def test_typing_indicator_reaches_the_graph_api() -> None:
    async with rig(reply=False) as r:
        await r.sender.post(r.sender.text("hola"))
        (event,) = await r.gateway.wait_for_events(1)
        await r.adapter.indicate_typing(event)
        await r.adapter.indicate_typing(event)
        (read,) = await r.graph.wait_for_reads(1)
        assert len(r.graph.reads) == 1
    assert read.json["message_id"] == event.message_id
    assert read.json["typing_indicator"] == {"type": "text"}
    assert r.graph.sent == []


async def test_text_over_4096_is_split_and_accepted() -> None:
    async with rig(reply=False) as r:
        text = ("Una frase bastante larga para el límite. " * 250).strip()
        assert len(text) > 4096
        result = await r.adapter.send(USER_WA_ID, text)
        sent = await r.graph.wait_for_sent(len(result.message_ids))
    assert len(sent) == len(result.message_ids) == 3
    assert r.graph.rejected == []


async def test_fake_graph_api_rejects_text_over_4096_like_meta() -> None:
    async with (
        FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token=TOKEN) as graph,
        httpx.AsyncClient() as client,
    ):
        response = await client.post(
            f"{graph.base_url}/v{API_VERSION}/{PHONE_NUMBER_ID}/messages",
            headers={"Authorization": f"Bearer {TOKEN}"},
            json={
                "messaging_product": "whatsapp",
                "to": USER_WA_ID,
                "type": "text",
                "text": {"body": "x" * 4097},
            },
        )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 100
    assert error["type"] == "OAuthException"
    assert error["fbtrace_id"]
    assert graph.sent == []


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (130429, True),
        (131056, True),
        (4, True),
        (80007, True),
        (131047, False),
        (131026, False),
        (190, False),
    ],
    ids=["130429", "131056", "4", "80007", "131047", "131026", "190-auth"],
)
async def test_injected_meta_errors_map_over_http(code: int, retryable: bool) -> None:
    async with rig(reply=False) as r:
        r.graph.inject_error(code)
        with pytest.raises(PlatformError) as info:
            await r.adapter.send(USER_WA_ID, "hola")
        # The next send works again: the injection was for one request only.
        assert (await r.adapter.send(USER_WA_ID, "otra vez")).message_ids
    assert info.value.code == code
    assert info.value.retryable is retryable
    assert not info.value.ambiguous


async def test_retry_after_from_the_server() -> None:
    async with rig(reply=False) as r:
        r.graph.inject_error(130429, status=429, retry_after=12)
        with pytest.raises(PlatformError) as info:
            await r.adapter.send(USER_WA_ID, "hola")
    assert info.value.retry_after == 12.0


async def test_wrong_token_is_a_permanent_auth_error() -> None:
    async with rig(reply=False) as r:
        r.graph.token = "another-token"
        with pytest.raises(PlatformError) as info:
            await r.adapter.send(USER_WA_ID, "hola")
    assert info.value.code == 190
    assert not info.value.retryable


async def test_read_timeout_is_ambiguous() -> None:
    async with rig(reply=False, read_timeout=0.3) as r:
        r.graph.inject_hang()
        with pytest.raises(PlatformError) as info:
            await r.adapter.send(USER_WA_ID, "hola")
        assert len(r.graph.hung) == 1
        r.graph.release_hangs()
    assert info.value.ambiguous
    assert info.value.retryable


async def test_unreachable_graph_api_is_retryable_and_not_ambiguous() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    adapter = WhatsAppAdapter(
        PHONE_NUMBER_ID,
        TOKEN,
        verify_token="vt",
        app_secret=APP_SECRET,
        api_base_url=f"http://127.0.0.1:{port}",
        send_pause=0,
    )

    async def ignore(event: MessageEvent) -> bool:
        return True

    await adapter.start(ignore)
    try:
        with pytest.raises(PlatformError) as info:
            await adapter.send(USER_WA_ID, "hola")
    finally:
        await adapter.stop()
    assert info.value.retryable
    assert not info.value.ambiguous
