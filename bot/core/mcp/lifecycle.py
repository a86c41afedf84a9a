"""Connecting and closing the MCP servers of a graph of agents, all at once.

Used by ``Runner`` (``async with Runner(...)``, ``Runner.connect_mcp_servers``),
so the bot, ``chatflow chat`` and library users start servers the same way:
every server concurrently, each within its timeout; a required server that
fails stops everything with one line naming it; an optional one is skipped
with a warning. Then every agent's tool names are checked: an MCP tool whose
name another tool of the same agent already has is an error naming both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence

from bot.core.agent import Agent
from bot.core.mcp.servers import MCPServer
from bot.errors import ConfigurationError, MCPServerError

__all__ = ["check_tool_names", "close_servers", "connect_servers", "servers_of"]

logger = logging.getLogger(__name__)


def servers_of(agents: Iterable[Agent]) -> list[MCPServer]:
    """Every distinct MCP server the agents use, in order of first use."""
    found: list[MCPServer] = []
    seen: set[int] = set()
    for agent in agents:
        for server in agent.mcp_servers:
            if id(server) not in seen:
                seen.add(id(server))
                found.append(server)
    return found


def check_tool_names(agents: Iterable[Agent]) -> None:
    """Raise ``ConfigurationError`` for an MCP tool whose name an agent already uses.

    The message names both tools and where each comes from.
    """
    for agent in agents:
        owners: dict[str, str] = {t.name: f"function tool {t.name!r}" for t in agent.function_tools}
        for handoff in agent.handoff_tools:
            owners[handoff.name] = f"handoff {handoff.name!r} (to {handoff.target.name!r})"
        for server in agent.mcp_servers:
            for item in server.tools:
                here = f"MCP server {server.name!r} tool {item.mcp_name!r}"
                other = owners.get(item.name)
                if other is not None:
                    raise ConfigurationError(
                        f"Agent {agent.name!r}: {here} is offered as {item.name!r}, "
                        f"which clashes with {other}"
                    )
                owners[item.name] = here


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
