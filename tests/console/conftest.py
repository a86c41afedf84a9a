"""A console over a running gateway, driven through Starlette's ``TestClient``.

The gateway, its SQLite store and a ``FakeAdapter`` are started in the app's
lifespan, so they live on the test client's event loop (its portal); tests call
async parts through ``ConsoleRig.call``.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from bot.config import Settings
from bot.console import console_routes
from bot.core.agent import Agent
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.events import MessageEvent
from bot.gateway.gateway import Gateway
from bot.platforms.web import WebAdapter
from tests.fakes.adapter import FakeAdapter

TOKEN = "console-token-for-tests-0123456789"
SECRET = b"s" * 32
_T = TypeVar("_T")


@dataclass
class ConsoleRig:
    client: TestClient
    gateway: Gateway
    adapter: FakeAdapter
    model: ScriptedModel
    store: SQLiteSessionStore
    web: WebAdapter

    def call(self, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Run ``fn(*args)`` on the app's loop."""
        portal = self.client.portal
        assert portal is not None
        return portal.call(fn, *args)

    def deliver(self, event: MessageEvent) -> None:
        """Deliver ``event`` and wait until its turn (or takeover bookkeeping) is done."""
        assert self.call(self.adapter.deliver, event)
        assert self.call(self.gateway._dispatcher.drain, 5.0)

    def sign_in(self) -> str:
        """Sign in through the form; returns the CSRF token of the session."""
        response = self.client.post(
            "/console/login", data={"token": TOKEN, "next": "/console"}, follow_redirects=False
        )
        assert response.status_code == 303, response.text
        return csrf_of(self.client.get("/console").text)

    def session_id(self) -> str:
        sessions = self.call(self.store.list_sessions)
        assert len(sessions) == 1
        return str(sessions[0])


def png(width: int = 240, height: int = 180) -> bytes:
    """A small photo-like PNG: a warm gradient with a dark crack across it."""
    rows = bytearray()
    for y in range(height):
        rows.append(0)
        for x in range(width):
            crack = abs((x - 40) * 0.6 - (y - 20)) < 2.2 and 40 < x < 210
            shade = 0.45 if crack else 1.0
            rows += bytes(
                (
                    int((236 - y * 0.25) * shade),
                    int((190 - x * 0.15) * shade),
                    int((150 + x * 0.25) * shade),
                )
            )

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(bytes(rows), 9))
        + chunk(b"IEND", b"")
    )


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, html
    return found.group(1)


@contextmanager
def running_console(
    tmp_path: Path, adapter: FakeAdapter | None = None, agent: Agent | None = None
) -> Iterator[ConsoleRig]:
    """A console over a started gateway whose platform is ``adapter`` (a ``fake`` one),
    running ``agent`` (a tool-less helper by default)."""
    parts: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
        model = ScriptedModel()
        agent_ = agent or Agent(name="Helper", instructions="Be helpful.")
        runner = Runner(agent_, store, model=model)
        platform = adapter or FakeAdapter()
        web = WebAdapter()
        settings = Settings(data_dir=tmp_path)
        gateway = Gateway(runner, store, [platform, web], settings, secret=SECRET)
        await gateway.start()
        await gateway.wait_ready()
        app.router.routes.extend(await console_routes(TOKEN, SECRET, gateway))
        parts.update(gateway=gateway, adapter=platform, model=model, store=store, web=web)
        try:
            yield
        finally:
            await gateway.stop(grace=1)
            await store.close()

    app = Starlette(lifespan=lifespan)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        yield ConsoleRig(client=client, **parts)


@pytest.fixture
def console(tmp_path: Path) -> Iterator[ConsoleRig]:
    with running_console(tmp_path) as rig:
        yield rig
