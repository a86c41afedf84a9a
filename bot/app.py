"""Assembly: settings -> store, agents, runner, adapters, gateway, HTTP server.

The only module that knows every room of the house; ``bot.cli`` drives it.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from dataclasses import dataclass, field
from typing import IO

from bot.agents_loader import load_agents
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.knowledge.service import KNOWLEDGE
from bot.core.models.routing import ModelSettings, default_model_name
from bot.core.runner import Runner
from bot.core.stores.base import BaseSessionStore
from bot.database import open_store
from bot.errors import ChatflowError, ConfigurationError
from bot.gateway.contract import PlatformAdapter
from bot.gateway.gateway import Gateway
from bot.gateway.instances import InstanceRegistry
from bot.gateway.keys import load_or_create_secret, load_or_create_shared_secret
from bot.heap import settle_after_start
from bot.knowledge_cli import knowledge_settings_from
from bot.logs import writes_json
from bot.metrics import Metrics
from bot.server import HttpServer, build_app, listen_socket
from bot.tracing.setup import configure as configure_tracing

__all__ = [
    "POLLING_CONFLICT_MESSAGE",
    "Bot",
    "build_adapters",
    "check_polling_alone",
    "load_starting_agent",
]

POLLING_CONFLICT_MESSAGE = (
    "TELEGRAM_WEBHOOK_URL: several processes share this database; Telegram long polling "
    "allows one consumer per token — set TELEGRAM_WEBHOOK_URL"
)
"""Why ``run`` stops when it would long-poll Telegram beside another live process."""
HEALTH_DATABASE_TIMEOUT_SECONDS = 1.0
"""``/healthz`` answers 503 when the database does not answer a read within this."""

logger = logging.getLogger(__name__)


def load_starting_agent(module_name: str | None = None) -> Agent:
    """``starting_agent`` of ``AGENTS_MODULE``, the project's ``agents/``, or the examples."""
    return load_agents(module_name).starting_agent


async def check_polling_alone(settings: Settings, instances: InstanceRegistry) -> None:
    """Refuse Telegram long polling while another process is live on the same database.

    Call it after ``instances.start()``: two processes starting together then
    both see each other and both refuse, rather than both polling.
    """
    if not settings.telegram_enabled or settings.telegram_webhook_url:
        return
    if await instances.others():
        raise ConfigurationError(POLLING_CONFLICT_MESSAGE, setting="TELEGRAM_WEBHOOK_URL")


def build_runner(settings: Settings, store: BaseSessionStore) -> Runner:
    """The Runner over the operator's agents; fails early on a model that routes nowhere."""
    starting = load_starting_agent(settings.agents_module)
    runner = Runner(
        starting,
        store,
        model_settings=ModelSettings.from_settings(settings),
        stream_replies=settings.stream_replies,
        compaction=settings.compaction,
    )
    # search_knowledge's embedder (EMBEDDING_MODEL), if any.
    runner.tool_services[KNOWLEDGE] = knowledge_settings_from(settings)
    return runner


def build_adapters(
    settings: Settings,
    *,
    console: bool = False,
    console_in: IO[str] | None = None,
    console_out: IO[str] | None = None,
    web: bool = False,
) -> list[PlatformAdapter]:
    """One adapter per configured platform, the terminal console when asked for, and
    the browser console's web channel with ``web``."""
    adapters: list[PlatformAdapter] = []
    if settings.telegram_bot_token is not None:
        from bot.platforms.telegram.adapter import TelegramAdapter

        secret = settings.telegram_webhook_secret
        adapters.append(
            TelegramAdapter(
                settings.telegram_bot_token.get_secret_value(),
                base_url=settings.telegram_api_base_url,
                file_base_url=settings.telegram_file_base_url,
                webhook_url=settings.telegram_webhook_url,
                webhook_secret=None if secret is None else secret.get_secret_value(),
                allow_channels=settings.telegram_allow_channels,
                stop_timeout=settings.shutdown_grace_seconds,
            )
        )
    if settings.whatsapp_phone_id:
        from bot.platforms.whatsapp.adapter import WhatsAppAdapter

        assert settings.whatsapp_token is not None  # checked by Settings
        assert settings.whatsapp_verify_token is not None
        app_secret = settings.whatsapp_app_secret
        adapters.append(
            WhatsAppAdapter(
                settings.whatsapp_phone_id,
                settings.whatsapp_token.get_secret_value(),
                verify_token=settings.whatsapp_verify_token.get_secret_value(),
                app_secret=None if app_secret is None else app_secret.get_secret_value(),
                api_base_url=settings.whatsapp_api_base_url,
                insecure_dev=settings.whatsapp_insecure_dev,
                media_hosts=settings.whatsapp_media_hosts,
                messages_per_second=settings.whatsapp_messages_per_second,
                template_name=settings.whatsapp_template_name,
                template_language=settings.whatsapp_template_language,
            )
        )
    if console:
        from bot.platforms.console import ConsoleAdapter

        adapters.append(ConsoleAdapter(input_stream=console_in, output_stream=console_out))
    if web:
        # The browser console's own channel: try the agents without a platform.
        from bot.platforms.web import WebAdapter

        adapters.append(WebAdapter())
    return adapters


@dataclass
class Bot:
    """A running bot: gateway, adapters and HTTP server over one store."""

    settings: Settings
    """What it was started with."""
    console: bool = False
    """Also talk through the terminal."""
    serve_http: bool = True
    """Run the HTTP server (webhooks, health, metrics)."""
    console_in: IO[str] | None = None
    """Console input (default stdin)."""
    console_out: IO[str] | None = None
    """Console output (default stdout)."""
    metrics: Metrics = field(default_factory=Metrics)
    """The process's metrics."""
    settle_heap: bool = False
    """Tune the garbage collector once started (``bot.heap``): the process's entry point
    sets it; a test or an embedding program owns its interpreter's settings."""

    async def run(self) -> None:
        """Start everything, serve until SIGTERM/SIGINT (or console EOF), stop gracefully."""
        settings = self.settings
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        # First: a busy port is said before the banner and before any input is read.
        sock = listen_socket(settings.http_host, settings.http_port) if self.serve_http else None
        # OTEL_* switches tracing on (off: nothing of OpenTelemetry is even imported).
        tracing = configure_tracing(json_logs=writes_json(settings.log_format))
        try:
            await self._run(sock)
        finally:
            if sock is not None:
                sock.close()  # a no-op once the server closed it
            if tracing is not None:  # the batch's last spans exported (a thread, not the loop)
                await asyncio.to_thread(tracing.shutdown)

    async def _run(self, sock: socket.socket | None) -> None:
        settings = self.settings
        store = open_store(settings)
        instances: InstanceRegistry | None = None
        runner: Runner | None = None
        try:
            if store.dialect == "postgres":
                # Several processes: one secret for all (in the database).
                await store.open()
                secret = await load_or_create_shared_secret(store)
            else:
                secret = await asyncio.to_thread(load_or_create_secret, settings.data_dir)
            # Importing the operator's agents and the platform libraries blocks the
            # loop for seconds on a busy host: done before the lease is taken, or the
            # lease expires unrenewed and another process takes this one's first turns.
            runner = build_runner(settings, store)
            adapters = build_adapters(
                settings,
                console=self.console,
                console_in=self.console_in,
                console_out=self.console_out,
                web=self.serve_http and settings.console_token is not None,
            )
            if store.dialect == "postgres":
                # Leases tell the other processes this one is alive.
                instances = InstanceRegistry(store, lease_seconds=settings.instance_lease_seconds)
                await instances.start()
                await check_polling_alone(settings, instances)
            # Before any platform takes traffic: a required MCP server that cannot
            # start (within its connect timeout) stops the bot with one line.
            await runner.connect_mcp_servers()
            gateway = Gateway(
                runner,
                store,
                adapters,
                settings,
                secret=secret,
                metrics=self.metrics,
                instances=instances,
            )
            await self._serve(gateway, adapters, secret, sock)
        finally:
            if runner is not None:  # after the gateway drained: no turn needs a tool now
                await runner.compactor.aclose()  # before the store closes; one tx: no half-write
                await runner.close_mcp_servers()
            if instances is not None:
                await instances.stop()
            await store.close()

    async def _serve(
        self,
        gateway: Gateway,
        adapters: list[PlatformAdapter],
        secret: bytes,
        sock: socket.socket | None,
    ) -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server: HttpServer | None = None
        self._banner(adapters)
        try:
            await gateway.start()
            if self.serve_http:
                routes = [route for adapter in adapters for route in adapter.routes()]
                console_token = self.settings.console_token
                if console_token is not None:  # unset: no console route, /console is 404
                    from bot.console import console_routes

                    routes += await console_routes(
                        console_token.get_secret_value(), secret, gateway
                    )

                async def health() -> dict[str, object]:
                    return await self._health(gateway)

                app = build_app(routes, health=health, metrics=self.metrics)
                server = HttpServer(
                    app,
                    self.settings.http_host,
                    self.settings.http_port,
                    forwarded_allow_ips=self.settings.forwarded_allow_ips,
                )
                await server.start(sock)
            if self.settle_heap:
                settle_after_start()
            waiters = [asyncio.create_task(stop.wait())]
            for adapter in adapters:
                if adapter.closed is not None:
                    waiters.append(asyncio.create_task(adapter.closed.wait()))
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waiters:
                waiter.cancel()
            logger.info("shutting down")
        finally:
            await gateway.stop()
            if server is not None:
                await server.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def _health(self, gateway: Gateway) -> dict[str, object]:
        database = "ok"
        try:
            # Within a second: a load balancer's check must not hang on a silent database.
            async with asyncio.timeout(HEALTH_DATABASE_TIMEOUT_SECONDS):
                await gateway.store.ping()
        except TimeoutError:
            database = "error: no answer within 1 s"
        except ChatflowError as exc:
            database = f"error: {type(exc).__name__}"
        platforms = {name: a.is_connected for name, a in gateway.adapters.items()}
        ok = database == "ok" and gateway.ready and all(platforms.values())
        return {"ok": ok, "ready": gateway.ready, "database": database, "platforms": platforms}

    def _banner(self, adapters: list[PlatformAdapter]) -> None:
        names = ", ".join(a.name for a in adapters) or "no platform"
        model = default_model_name(ModelSettings.from_settings(self.settings))
        where = (
            f"http://{self.settings.http_host}:{self.settings.http_port}"
            if self.serve_http
            else "no HTTP server"
        )
        lines = [
            f"Chatflow: {names}; model {model}; database {self.settings.database_label}; "
            f"streamed replies {'on' if self.settings.stream_replies else 'off'}",
            f"Webhooks, /healthz and /metrics: {where}.",
        ]
        if self.settings.database_dialect == "postgres":
            lines.append(
                f"PostgreSQL: at most {max(2, self.settings.database_connections)} connections "
                "from this process (DATABASE_CONNECTIONS; turns hold none while the model "
                f"thinks); pooler mode {self.settings.database_pooler}."
            )
        missing = []  # only what is not set up yet
        if not self.settings.telegram_enabled:
            missing.append("Telegram with TELEGRAM_BOT_TOKEN")
        if not self.settings.whatsapp_enabled:
            missing.append(
                "WhatsApp with WHATSAPP_PHONE_ID, WHATSAPP_TOKEN, WHATSAPP_VERIFY_TOKEN "
                "and WHATSAPP_APP_SECRET"
            )
        if model == "offline":
            missing.append("a real model with OPENAI_API_KEY or GEMINI_API_KEY")
        if missing:
            lines.append(f"Connect {', '.join(missing)} (.env.example).")
        if self.serve_http and self.settings.console_token is not None:
            lines.insert(2, f"Operator console: {where}/console (sign in with CONSOLE_TOKEN).")
            if not self.console:
                # The prompt is gone once the web chat is on: say so, and how to keep it.
                lines.insert(
                    3,
                    "Terminal chat off (the console's web chat is on); "
                    "`python -m bot run --console` keeps both.",
                )
        print("\n".join(lines), file=sys.stderr, flush=True)
