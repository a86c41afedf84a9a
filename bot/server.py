"""The bot's one HTTP server: platform webhooks, ``/healthz`` and ``/metrics``.

Behind a reverse proxy, ``X-Forwarded-For`` and ``X-Forwarded-Proto`` are
believed only from the peers ``FORWARDED_ALLOW_IPS`` names (uvicorn's proxy
headers middleware): the console's throttle counts the real client, and its
cookie gets ``Secure`` when the proxy says the browser spoke https.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator, Sequence

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from bot.config import DEFAULT_FORWARDED_ALLOW_IPS
from bot.errors import ConfigurationError
from bot.metrics import Metrics

__all__ = ["HealthCheck", "HttpServer", "build_app"]

logger = logging.getLogger(__name__)

HealthCheck = Callable[[], Awaitable[dict[str, object]]]
"""Returns the health report; a report whose ``"ok"`` is false answers 503."""


def build_app(routes: Sequence[BaseRoute], *, health: HealthCheck, metrics: Metrics) -> Starlette:
    """A Starlette app with the adapters' routes plus ``/healthz`` and ``/metrics``."""

    async def healthz(request: Request) -> Response:
        report = await health()
        return JSONResponse(report, status_code=200 if report.get("ok") else 503)

    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return Starlette(
        routes=[
            *routes,
            Route("/healthz", healthz, methods=["GET"]),
            Route("/metrics", metrics_route, methods=["GET"]),
        ]
    )


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers: the bot owns SIGTERM/SIGINT and stops us."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or ``ConfigurationError`` naming the setting.

    Bound by us rather than by uvicorn, which exits the process when a port is
    taken; and bound first thing at start-up, so a busy port is said before the
    banner and before any input is read.
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(
            f"HTTP_HOST/HTTP_PORT: cannot listen on {host}:{port} ({exc.strerror})",
            setting="HTTP_PORT",
        ) from exc
    sock.listen(128)
    sock.setblocking(False)
    return sock


class HttpServer:
    """uvicorn serving an app inside the bot's own event loop (no signal handlers of its own)."""

    def __init__(
        self,
        app: Starlette,
        host: str,
        port: int,
        *,
        forwarded_allow_ips: str = DEFAULT_FORWARDED_ALLOW_IPS,
    ) -> None:
        """``forwarded_allow_ips``: ``FORWARDED_ALLOW_IPS``, the proxies whose
        ``X-Forwarded-For``/``-Proto`` set ``request.client`` and ``request.url.scheme``."""
        trusted = forwarded_allow_ips.strip()
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
            # Passed explicitly: uvicorn would otherwise read the variable itself, and
            # miss the value when it comes from .env.
            proxy_headers=True,
            forwarded_allow_ips="*"
            if trusted == "*"
            else [part.strip() for part in trusted.split(",") if part.strip()],
        )
        self._server = _QuietServer(config)
        self._task: asyncio.Task[None] | None = None
        self._host = host
        self._port = port
        self._sock: socket.socket | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        if self._sock is not None:
            return int(self._sock.getsockname()[1])
        return self._port

    async def start(self, sock: socket.socket | None = None) -> None:
        """Serve in the background on ``sock`` (from ``listen_socket``; bound here when
        not given); return once listening."""
        if sock is None:
            sock = listen_socket(self._host, self._port)
        self._sock = sock
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("HTTP server stopped before it started")
            await asyncio.sleep(0.01)
        logger.info("HTTP server listening on %s:%s", self._host, self.port)

    async def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        except Exception as exc:
            logger.warning("HTTP server did not stop cleanly: %r", exc)
        self._task = None
