"""The fake MCP server over Streamable HTTP, on a free port of 127.0.0.1.

    async with FakeMCPHttpServer() as server:
        MCPServerStreamableHttp(params={"url": server.url, "headers": {...}})

It runs uvicorn in the test's own event loop and records the headers of
every request (to check an ``Authorization`` header arrives).
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from tests.fakes.mcp_server import build_fake_server
from tests.fakes.serving import LocalServer

__all__ = ["FakeMCPHttpServer"]


class _Recorder:
    def __init__(self, app: ASGIApp, seen: list[dict[str, str]]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append({k.decode().lower(): v.decode() for k, v in scope["headers"]})
        await self.app(scope, receive, send)


class FakeMCPHttpServer:
    """``build_fake_server()`` served at ``http://127.0.0.1:<port>/mcp``."""

    def __init__(self, prefix: str = "") -> None:
        self.mcp = build_fake_server("fake-http", prefix)
        """The SDK server (add tools to it in a test)."""
        self.headers: list[dict[str, str]] = []
        """Headers of every HTTP request received, lower-case names."""
        self.port = 0
        self._local: LocalServer | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint."""
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        """Bind a free port and serve."""
        app: Any = _Recorder(self.mcp.streamable_http_app(), self.headers)
        self._local = LocalServer(app, lifespan="on")
        self.port = await self._local.start()

    async def stop(self) -> None:
        """Close connections and the port (clients see the server die)."""
        if self._local is not None:
            # Streamable HTTP keeps streams open: they are cut, not awaited.
            await self._local.stop(cancel_requests=True)

    async def __aenter__(self) -> FakeMCPHttpServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
