"""Connecting and closing a set of MCP servers, all at once.

Used by ``Runner`` (``async with Runner(...)``, ``Runner.connect_mcp_servers``)
with the servers of its agent graph (``bot.core.agent.servers_of``), so the bot,
``chatflow chat`` and library users start servers the same way: every server
concurrently, each within its timeout; a required server that fails stops
everything with one line naming it; an optional one is skipped with a warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from bot.core.mcp.servers import MCPServer
from bot.errors import MCPServerError

__all__ = ["close_servers", "connect_servers"]

logger = logging.getLogger(__name__)


async def connect_servers(servers: Sequence[MCPServer], within: float | None = None) -> None:
    """Connect every server concurrently (``within`` seconds each, else the server's own).

    A required server that fails closes the others and raises its
    ``MCPServerError``; an optional one logs a warning and keeps retrying in
    the background, its tools absent until it answers.
    """
    results = await asyncio.gather(
        *(server.connect(within) for server in servers), return_exceptions=True
    )
    failure: BaseException | None = None
    for server, result in zip(servers, results, strict=True):
        if result is None:
            continue
        if isinstance(result, MCPServerError) and server.optional:
            logger.warning("%s; it is optional: starting without its tools", result)
            continue
        failure = failure or result
    if failure is not None:
        await close_servers(servers)
        raise failure


async def close_servers(servers: Sequence[MCPServer]) -> None:
    """Close every server (concurrently); a failure to close is logged, not raised."""
    results = await asyncio.gather(*(server.close() for server in servers), return_exceptions=True)
    for server, result in zip(servers, results, strict=True):
        if isinstance(result, Exception):
            logger.warning(
                "MCP server %s did not close cleanly: %s", server.name, type(result).__name__
            )
