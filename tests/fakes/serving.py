"""One way to serve a fake's ASGI app on 127.0.0.1 inside the test's own event loop.

uvicorn's start-up and shutdown steps are driven directly instead of
``Server.serve()``: no signal handlers of the process are taken, and there is
no 0.1 s polling loop, so a test pays milliseconds, not tenths of a second,
per server, and ``start`` returns once the port accepts connections.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, Literal

import uvicorn

__all__ = ["LocalServer"]


class LocalServer:
    """``app`` on a free 127.0.0.1 port, from ``start`` to ``stop``."""

    backlog = 64
    """Pending connections the port queues (a load test raises it: ``bench.realistic``)."""

    def __init__(self, app: Any, *, lifespan: Literal["on", "off"] = "off") -> None:
        self._app = app
        self._lifespan = lifespan
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self.port = 0

    @property
    def running(self) -> bool:
        """True between ``start`` and ``stop``."""
        return self._server is not None

    async def start(self) -> int:
        """Bind a free port and serve; returns the port."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(self.backlog)
        sock.setblocking(False)
        self._socket = sock
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            log_level="warning",
            lifespan=self._lifespan,
            ws="none",
            http="h11",
            timeout_graceful_shutdown=1,
            access_log=False,
            backlog=self.backlog,
        )
        server = uvicorn.Server(config)
        config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        self._server = server
        return self.port

    async def stop(self, *, cancel_requests: bool = False) -> None:
        """Close the port and every connection; requests in flight finish first
        (release whatever they wait on before), or are cancelled with ``cancel_requests``
        (streams that never end by themselves)."""
        server, self._server = self._server, None
        if server is not None:
            for listener in server.servers:
                listener.close()
            for connection in list(server.server_state.connections):
                connection.shutdown()
            tasks = list(server.server_state.tasks)
            if cancel_requests:
                for task in tasks:
                    task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            for listener in server.servers:
                await listener.wait_closed()
            await server.lifespan.shutdown()
        if self._socket is not None:
            self._socket.close()
            self._socket = None
