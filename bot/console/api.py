"""The console's JSON reads, for scripts and monitoring (``Authorization: Bearer``).

The same data as the pages, behind the same guard; read-only (every change
is a form POST of the pages, which scripts may send with the bearer token).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from bot.console import queries
from bot.console.auth import Principal
from bot.console.guard import Guard
from bot.console.views import ConsoleServices

__all__ = ["ConsoleApi"]


class ConsoleApi:
    """``GET {prefix}/api/conversations`` and ``GET {prefix}/api/ledger``."""

    def __init__(self, services: ConsoleServices, guard: Guard, prefix: str) -> None:
        self.services = services
        self.guard = guard
        self.prefix = prefix

    def routes(self) -> list[BaseRoute]:
        """The API's routes, behind the guard."""
        p, wrap = self.prefix, self.guard.wrap
        return [
            Route(f"{p}/api/conversations", wrap(self.conversations), methods=["GET"]),
            Route(f"{p}/api/ledger", wrap(self.ledger), methods=["GET"]),
        ]

    async def conversations(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """A page of conversations: ``platform``, ``q`` and ``before`` as on the page;
        each with its ``title`` and ``state`` (``bot``, ``human``, ``waiting``)."""
        params = request.query_params
        platform = params.get("platform", "").strip()
        rows, cursor = await queries.list_conversations(
            self.services.store,
            platform=platform if platform in self.services.platforms else None,
            search=params.get("q", "").strip()[:200] or None,
            before=params.get("before", "").strip() or None,
        )
        listed = [{**asdict(r), "title": r.title, "state": r.state} for r in rows]
        return JSONResponse({"conversations": listed, "next": cursor})

    async def ledger(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Undelivered replies by state, the newest of them, and this process's metrics."""
        store = self.services.store
        await self.services.ledger.flush()
        now = datetime.now(UTC)
        rows: list[dict[str, Any]] = [
            {
                "obligation_id": o.obligation_id,
                "session_id": o.session_id,
                "platform": o.platform,
                "state": o.state,
                "attempts": o.attempts,
                "last_error": o.last_error,
                "age_seconds": int((now - o.created_at).total_seconds()),
            }
            for o in await queries.ledger_rows(store)
        ]
        return JSONResponse(
            {
                "counts": await queries.ledger_counts(store),
                "undelivered": rows,
                "metrics": queries.metric_totals(self.services.metrics),
            }
        )
