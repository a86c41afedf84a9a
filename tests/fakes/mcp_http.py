"""The fake MCP server over Streamable HTTP, on a free port of 127.0.0.1.

    async with FakeMCPHttpServer() as server:
        MCPServerStreamableHttp(params={"url": server.url, "headers": {...}})

It runs uvicorn in the test's own event loop and records the headers of
every request (to check an ``Authorization`` header arrives).
"""

from __future__ import annotations

import socket
from types import TracebackType
from typing import Any

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.fakes.mcp_server import build_fake_server

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
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None

    @property
    def url(self) -> str:
        """The MCP endpoint."""
        return f"http://127.0.0.1:{self.port}/mcp"

    async def start(self) -> None:
        """Bind a free port and serve."""
        app: Any = _Recorder(self.mcp.streamable_http_app(), self.headers)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        sock.setblocking(False)
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            lifespan="on",
            ws="none",
            http="h11",
            timeout_graceful_shutdown=1,
            access_log=False,
        )
        server = uvicorn.Server(config)
        config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        self._server = server

    async def stop(self) -> None:
        """Close connections and the port (clients see the server die)."""
        server, self._server = self._server, None
        if server is not None:
            for listener in server.servers:
                listener.close()
            for connection in list(server.server_state.connections):
                connection.shutdown()
            for task in list(server.server_state.tasks):
                task.cancel()
            for listener in server.servers:
                await listener.wait_closed()
            await server.lifespan.shutdown()
        if self._socket is not None:
            self._socket.close()
            self._socket = None

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
