"""The console's Memory page: the facts agents remembered, and erasing one person.

Lists every memory (``bot.core.long_memory``) with a Forget button each, and
offers ``forget-user`` (``bot.gateway.erasure``): the operator types the person
(``PLATFORM:USER_ID``) and ticks the confirmation; the page then shows what was
removed per kind. Without the confirmation nothing is removed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from bot.console.auth import Principal
from bot.console.views import ConsoleViews
from bot.core.long_memory.records import delete_memory, list_memories
from bot.gateway.erasure import erase_person
from bot.gateway.gateway import Gateway
from bot.gateway.keys import parse_person

__all__ = ["MemoryViews", "forget_person"]

_MEMORY_ID_RE: Final = re.compile(r"mem_[0-9a-f]{12}")


async def forget_person(gateway: Gateway, secret: bytes, person: str) -> list[str]:
    """Erase ``person`` from ``gateway``'s database and media; the removed counts per kind."""
    erasure = await erase_person(
        gateway.store,
        parse_person(person),
        secret,
        media_dir=gateway.settings.data_dir / "media",
        transcription_model=gateway.settings.transcription_model,
    )
    return erasure.lines()


class MemoryViews(ConsoleViews):
    """The Memory page and its two actions."""

    def routes(self) -> list[BaseRoute]:
        p, wrap = self.prefix, self.guard.wrap
        return [
            Route(f"{p}/memory", wrap(self.memory, page=True), methods=["GET"]),
            Route(f"{p}/memory/{{mid}}/forget", wrap(self.forget_one), methods=["POST"]),
            Route(f"{p}/memory/forget-user", wrap(self.forget_user), methods=["POST"]),
        ]

    async def memory(self, request: Request, who: Principal, form: Mapping[str, str]) -> Response:
        """Every memory, oldest first, and the form that erases a person."""
        memories = await list_memories(self.services.store)
        return await self._page(
            "memory.html",
            who,
            memories=memories,
            erasure=None,
            can_erase=self.services.forget_person is not None,
            error=request.query_params.get("error"),
        )

    async def forget_one(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """``memory forget ID``."""
        mid = str(request.path_params["mid"])
        if _MEMORY_ID_RE.fullmatch(mid):
            await delete_memory(self.services.store, mid)
        return self._back("/memory")

    async def forget_user(
        self, request: Request, who: Principal, form: Mapping[str, str]
    ) -> Response:
        """``forget-user``, once the confirmation box is ticked."""
        person = form.get("person", "").strip()
        erase = self.services.forget_person
        if erase is None:
            return self._back("/memory")
        if form.get("confirm") != "yes":
            return self._back("/memory", "unconfirmed")
        try:
            parse_person(person)
        except ValueError:
            return self._back("/memory", "badperson")
        lines = await erase(person)
        memories = await list_memories(self.services.store)
        return await self._page(
            "memory.html",
            who,
            memories=memories,
            erasure=(person, lines),
            can_erase=True,
            error=None,
        )
