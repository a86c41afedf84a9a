"""The operator console: conversations, transcripts, the ledger and human takeover.

Served by the bot's own HTTP server under ``/console`` when ``CONSOLE_TOKEN``
is set (``bot.app`` mounts ``console_routes``); without it no console route
exists, so every console path answers 404. One module per concept:
``auth`` (token, cookies, CSRF, rate limit), ``sessions`` (sign-ins recorded
server-side), ``guard`` (the door of every route), ``queries`` (read-only SQL),
``views`` (pages and actions), ``api`` (the same reads as JSON, for scripts),
``webchat`` (the web channel), ``sse`` (live transcripts), ``templating``
(Jinja2 templates and static files, shipped as package data), ``memory_page``
(remembered facts, and ``forget-user`` with a confirmation).
"""

from __future__ import annotations

import functools
from typing import Final

from starlette.routing import BaseRoute

from bot.console import queries
from bot.console.api import ConsoleApi
from bot.console.auth import ConsoleAuth
from bot.console.guard import Guard
from bot.console.memory_page import MemoryViews, forget_person
from bot.console.sessions import ConsoleSessions
from bot.console.templating import ConsoleAssets
from bot.console.views import ConsoleServices, ConsoleViews
from bot.console.webchat import WEB_PLATFORM, WebChannel
from bot.gateway.contract import MessageEvent
from bot.gateway.gateway import Gateway
from bot.gateway.keys import session_id_for
from bot.gateway.takeover import OperatorDesk
from bot.usage_report import read_prices

__all__ = ["CONSOLE_PREFIX", "ConsoleServices", "console_routes"]

CONSOLE_PREFIX: Final = "/console"
"""Where the console is mounted."""


async def console_routes(
    token: str, secret: bytes, gateway: Gateway, *, prefix: str = CONSOLE_PREFIX
) -> list[BaseRoute]:
    """The console's routes over a started ``gateway`` (templates read in a thread).

    ``secret`` (the installation secret) signs the session cookies, so every
    process of one installation accepts them.
    """
    assets = await ConsoleAssets.load()
    takeovers = gateway.turns.takeovers
    await takeovers.open()
    await queries.open_schema(gateway.store)

    web = gateway.adapters.get(WEB_PLATFORM)
    media = gateway.turns.media

    def session_of(event: MessageEvent) -> str:
        return session_id_for(gateway.session_key_for(event))

    async def send_requeued() -> int:
        return await gateway.retry_due(sweep=True)

    services = ConsoleServices(
        store=gateway.store,
        ledger=gateway.ledger,
        takeovers=takeovers,
        desk=OperatorDesk(gateway.store, gateway.ledger, gateway.outbox, gateway.adapters),
        send_requeued=send_requeued,
        platforms=tuple(sorted(gateway.adapters)),
        metrics=gateway.metrics,
        web=web if isinstance(web, WebChannel) else None,
        session_of=session_of,
        read_media=None if media is None else media.store.read,
        prices=await read_prices(gateway.settings.model_prices),
        compact=gateway.turns.runner.compact,
        decide_approval=functools.partial(gateway.approvals.decide, by="operator"),
        forget_person=functools.partial(forget_person, gateway, secret),
    )
    sessions = ConsoleSessions(gateway.store)
    await sessions.open()
    guard = Guard(ConsoleAuth(token, secret), prefix, sessions)
    return [
        *ConsoleViews(services, guard, assets, prefix).routes(),
        *ConsoleApi(services, guard, prefix).routes(),
        *MemoryViews(services, guard, assets, prefix).routes(),
    ]
