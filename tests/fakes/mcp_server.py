"""A real MCP server (the SDK's ``MCPServer``) with the tools the MCP tests call.

In-process: ``build_fake_server()`` (unit tests connect to it with the SDK's
in-memory client). As a child process: ``python -m tests.fakes.mcp_server``
serves it over stdio (``MCPServerStdio``); ``tests.fakes.mcp_http`` serves it
over Streamable HTTP on 127.0.0.1.

Environment of the stdio process:
- ``FAKE_MCP_PID_FILE``: the process writes its pid there once it serves
  (tests wait for it, then kill the process).
- ``FAKE_MCP_REFUSE_FILE``: while that file exists the process exits at once
  with status 3, as a server that stays dead does.
- ``FAKE_MCP_SECRET``: a "secret" the ``secret_length`` tool proves it received.
- ``FAKE_MCP_EXIT_AFTER_LIST``: the process exits (status 1) right after it
  has answered ``tools/list``, as a server that crashes once it is used does.
- ``FAKE_MCP_STUBBORN``: the process ignores SIGTERM and the end of its stdin
  (only SIGKILL stops it), as a wedged server does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.utilities.types import Image

from bot.core.mcp.servers import MCPServerStdioParams

__all__ = ["ROOT", "build_fake_server", "stdio_params"]

ROOT = Path(__file__).resolve().parents[2]


def _meta_of(ctx: Context) -> dict[str, Any]:
    meta = ctx.request_context.meta or {}
    return {key: value for key, value in dict(meta).items() if key.startswith("chatflow/")}


def build_fake_server(
    name: str = "fake-crm", prefix: str = "", cls: type[MCPServer] = MCPServer
) -> MCPServer:
    """The server (a ``cls``) with every test tool registered, each name starting with
    ``prefix``."""
    server = cls(name)

    @server.tool(name=prefix + "crm.lookup_order")
    def lookup_order(order_id: str, ctx: Context) -> str:
        """Look up an order in the CRM.

        Args:
            order_id: The order number, digits only.
        """
        meta = _meta_of(ctx)
        return (
            f"order {order_id} is in transit via FakeCarrier "
            f"(session={meta.get('chatflow/session_id')}, "
            f"inbound={meta.get('chatflow/inbound_message_id')}, pid={os.getpid()})"
        )

    @server.tool(name=prefix + "count_items")
    def count_items(count: int) -> dict[str, int]:
        """Return a number twice (structured output)."""
        return {"count": count, "double": count * 2}

    @server.tool(name=prefix + "big_report")
    def big_report() -> str:
        """A result far over any sane size."""
        return "x" * 100_000

    @server.tool(name=prefix + "slow")
    async def slow(seconds: float) -> str:
        """Answer after ``seconds``."""
        await asyncio.sleep(seconds)
        return "done"

    @server.tool(name=prefix + "broken")
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("the CRM database is down")

    @server.tool(name=prefix + "secret_length")
    def secret_length() -> int:
        """Length of FAKE_MCP_SECRET, proving the env reached the process."""
        return len(os.environ.get("FAKE_MCP_SECRET", ""))

    @server.tool(name=prefix + "add_discount_tool")
    async def add_discount_tool(ctx: Context) -> str:
        """Register one more tool and tell the client the list changed."""

        def apply_discount(code: str) -> str:
            return f"discount {code} applied"

        server.add_tool(apply_discount, name=prefix + "apply_discount", description="Apply a code.")
        await ctx.notify_tools_changed()
        return "added"

    @server.tool(name=prefix + "sales_chart")
    def sales_chart() -> Image:
        """Draw this month's sales as a chart (a photo for the user)."""
        from tests.fakes.media_files import jpeg_bytes

        return Image(data=jpeg_bytes(), format="jpeg")

    @server.tool(name=prefix + "client_name")
    def client_name(ctx: Context) -> str:
        """How the client introduced itself (``name/version``)."""
        return describe_client(ctx)

    return server


def describe_client(ctx: Context) -> str:
    """``name/version`` of the client: from the handshake (2025) or the request's
    ``_meta`` envelope (2026-07-28)."""
    params = getattr(ctx.session, "client_params", None)
    info: Any = getattr(params, "client_info", None)
    if info is None:
        meta = dict(ctx.request_context.meta or {})
        info = next((v for k, v in meta.items() if k.endswith("clientInfo")), None)
    if isinstance(info, dict):
        return f"{info.get('name')}/{info.get('version')}"
    return f"{getattr(info, 'name', None)}/{getattr(info, 'version', None)}"


class _ExitAfterList(MCPServer):
    """Answers ``tools/list``, then dies at once (a crash loop for the reconnect backoff)."""

    async def list_tools(self) -> list[types.Tool]:
        listed = await super().list_tools()
        # After the answer is written: a timer thread, not this request's task.
        threading.Timer(0.05, os._exit, args=(1,)).start()
        return listed


def stdio_params(**env: str) -> MCPServerStdioParams:
    """``MCPServerStdio`` params that run this module as a child process."""
    return {
        "command": sys.executable,
        "args": ["-m", "tests.fakes.mcp_server"],
        "env": {"PYTHONPATH": str(ROOT), **env},
        "cwd": str(ROOT),
    }


def main() -> None:
    """Serve over stdio (refusing to start while the refuse file exists)."""
    refuse = os.environ.get("FAKE_MCP_REFUSE_FILE")
    if refuse and Path(refuse).exists():
        print("fake MCP server: refusing to start", file=sys.stderr)
        raise SystemExit(3)
    pid_file = os.environ.get("FAKE_MCP_PID_FILE")
    if pid_file:
        tmp = Path(pid_file + ".tmp")
        tmp.write_text(str(os.getpid()))
        tmp.replace(pid_file)
    if os.environ.get("FAKE_MCP_EXIT_AFTER_LIST"):
        build_fake_server(cls=_ExitAfterList).run("stdio")
        return
    if os.environ.get("FAKE_MCP_STUBBORN"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            build_fake_server().run("stdio")
        finally:
            threading.Event().wait()  # stdin closed: stay anyway
    build_fake_server().run("stdio")


if __name__ == "__main__":
    main()
