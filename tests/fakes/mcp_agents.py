"""Agents for the MCP end-to-end test (``AGENTS_MODULE=tests.fakes.mcp_agents``).

One agent with a stdio MCP server (``tests.fakes.mcp_server`` as a child of
the bot) and, when ``MCP_E2E_HTTP_URL`` is set, a Streamable HTTP one. The
test passes the fake server's files through the environment:
``MCP_E2E_PID_FILE``, ``MCP_E2E_REFUSE_FILE``, ``MCP_E2E_SECRET``.
``MCP_E2E_BROKEN=1`` adds a required server that cannot start.
"""

from __future__ import annotations

import os

from bot import Agent, MCPServer, MCPServerStdio, MCPServerStreamableHttp
from tests.fakes.mcp_server import stdio_params

__all__ = ["starting_agent"]


def _servers() -> list[MCPServer]:
    servers: list[MCPServer] = [
        MCPServerStdio(
            params=stdio_params(
                FAKE_MCP_PID_FILE=os.environ.get("MCP_E2E_PID_FILE", ""),
                FAKE_MCP_REFUSE_FILE=os.environ.get("MCP_E2E_REFUSE_FILE", ""),
                FAKE_MCP_SECRET=os.environ.get("MCP_E2E_SECRET", ""),
            ),
            name="crm",
        )
    ]
    url = os.environ.get("MCP_E2E_HTTP_URL")
    if url:
        servers.append(MCPServerStreamableHttp(params={"url": url}, name="kb"))
    if os.environ.get("MCP_E2E_BROKEN"):
        servers.append(MCPServerStdio(params={"command": "/nonexistent/orders-mcp"}, name="orders"))
    return servers


starting_agent = Agent(
    name="Support",
    instructions="You help with orders. Use the tools.",
    mcp_servers=_servers(),
)
"""What ``python -m bot run`` loads."""
