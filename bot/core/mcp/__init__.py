"""MCP tool servers: an agent's ``mcp_servers``.

- ``servers``: ``MCPServerStdio`` and ``MCPServerStreamableHttp``, what an operator writes;
- ``connection``: one supervised connection (reconnects, list-changed refreshes, calls);
- ``tools``: a server's tools as the model sees them (schemas, validation, results),
  typed against the ``ToolServer`` protocol, so it never imports the connection;
- ``lifecycle``: connecting and closing an agent graph's servers together;
- ``retry``: the reconnect back-off.
"""

from __future__ import annotations

from bot.core.mcp.servers import (
    MCPServer,
    MCPServerStdio,
    MCPServerStdioParams,
    MCPServerStreamableHttp,
    MCPServerStreamableHttpParams,
)
from bot.core.mcp.tools import ToolFilterStatic, create_static_tool_filter

__all__ = [
    "MCPServer",
    "MCPServerStdio",
    "MCPServerStdioParams",
    "MCPServerStreamableHttp",
    "MCPServerStreamableHttpParams",
    "ToolFilterStatic",
    "create_static_tool_filter",
]
