"""MCP servers an agent takes tools from: a child process or a URL.

``MCPServerStdio`` runs a server as a child process of the bot;
``MCPServerStreamableHttp`` talks to one at a URL. Their ``params`` are spelled
as in openai-agents. The connection's life (connect, refresh, reconnect,
close) and the calls are ``MCPServer``'s, in ``bot.core.mcp_connection``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, NotRequired, TypedDict
from urllib.parse import urlsplit

from bot.core.mcp_connection import DEFAULT_CONNECT_TIMEOUT, MCPServer, MCPServerStatus
from bot.core.mcp_tools import DEFAULT_MAX_OUTPUT_CHARS
from bot.core.tools import DEFAULT_TOOL_TIMEOUT

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "MCPServer",
    "MCPServerStatus",
    "MCPServerStdio",
    "MCPServerStdioParams",
    "MCPServerStreamableHttp",
    "MCPServerStreamableHttpParams",
]


def _default_name(command: str, args: list[str]) -> str:
    """``npx -y crm-mcp`` -> ``npx crm-mcp``: the command and its first real argument."""
    words = [Path(command).name]
    words.extend(Path(arg).name for arg in args[:3] if not arg.startswith("-"))
    return " ".join(words[:2])


class MCPServerStdioParams(TypedDict):
    """``MCPServerStdio(params=...)``, as in openai-agents."""

    command: str
    """The executable (``"python"``, ``"npx"``, a path)."""
    args: NotRequired[list[str]]
    """Its arguments."""
    env: NotRequired[dict[str, str]]
    """Variables added to a minimal environment (``PATH``, ``HOME``...); never logged."""
    cwd: NotRequired[str | Path]
    """Working directory of the child process."""
    encoding: NotRequired[str]
    """Text encoding of the pipes (default UTF-8)."""


class MCPServerStdio(MCPServer):
    """An MCP server run as a child process of the bot, spoken to over its stdin/stdout."""

    def __init__(
        self,
        params: MCPServerStdioParams,
        *,
        name: str | None = None,
        optional: bool = False,
        connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT,
        client_session_timeout_seconds: float = DEFAULT_TOOL_TIMEOUT,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        """``params``: ``command``, ``args``, ``env``, ``cwd`` (openai-agents' shape)."""
        command = params.get("command")
        if not isinstance(command, str) or not command:
            raise ValueError("MCPServerStdio: params['command'] must be a non-empty string")
        args = list(params.get("args") or [])
        if not all(isinstance(arg, str) for arg in args):
            raise ValueError("MCPServerStdio: params['args'] must be strings")
        env = dict(params.get("env") or {})
        bad = sorted(key for key, value in env.items() if not isinstance(value, str))
        if bad:  # names only: the values are secrets
            raise ValueError(f"MCPServerStdio: env values must be strings ({', '.join(bad)})")
        super().__init__(
            name=name or _default_name(command, args),
            optional=optional,
            connect_timeout_seconds=connect_timeout_seconds,
            client_session_timeout_seconds=client_session_timeout_seconds,
            max_output_chars=max_output_chars,
        )
        self._command = command
        self._args = args
        self._env = env
        self._cwd = params.get("cwd")
        self._encoding = params.get("encoding", "utf-8")

    def describe(self) -> str:
        """``stdio: <command> <args>`` (the environment is left out)."""
        return "stdio: " + " ".join([self._command, *self._args])

    def _target(self) -> Any:
        from mcp import StdioServerParameters

        return StdioServerParameters(
            command=self._command,
            args=self._args,
            env=self._env or None,
            cwd=self._cwd,
            encoding=self._encoding,
        )


class MCPServerStreamableHttpParams(TypedDict):
    """``MCPServerStreamableHttp(params=...)``, as in openai-agents."""

    url: str
    """The server's endpoint, e.g. ``http://127.0.0.1:8000/mcp``."""
    headers: NotRequired[dict[str, str]]
    """Sent with every request (an ``Authorization`` header, say); never logged."""
    timeout: NotRequired[float]
    """Seconds for connecting and writing (default 30)."""
    sse_read_timeout: NotRequired[float]
    """Seconds a response stream may stay silent (default 300)."""
    terminate_on_close: NotRequired[bool]
    """End the server's session when closing (default true)."""


class MCPServerStreamableHttp(MCPServer):
    """An MCP server at a URL, over Streamable HTTP."""

    def __init__(
        self,
        params: MCPServerStreamableHttpParams,
        *,
        name: str | None = None,
        optional: bool = False,
        connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT,
        client_session_timeout_seconds: float = DEFAULT_TOOL_TIMEOUT,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> None:
        """``params``: ``url``, ``headers``, ``timeout``, ``sse_read_timeout``,
        ``terminate_on_close`` (openai-agents' shape)."""
        url = params.get("url")
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("MCPServerStreamableHttp: params['url'] must be an http(s) URL")
        assert isinstance(url, str)
        super().__init__(
            name=name or parts.hostname,
            optional=optional,
            connect_timeout_seconds=connect_timeout_seconds,
            client_session_timeout_seconds=client_session_timeout_seconds,
            max_output_chars=max_output_chars,
        )
        self._url = url
        self._headers = dict(params.get("headers") or {})
        self._timeout = float(params.get("timeout", 30.0))
        self._read_timeout = float(params.get("sse_read_timeout", 300.0))
        self._terminate = bool(params.get("terminate_on_close", True))

    def describe(self) -> str:
        """The URL without credentials, query or fragment."""
        parts = urlsplit(self._url)
        port = f":{parts.port}" if parts.port else ""
        return f"http: {parts.scheme}://{parts.hostname}{port}{parts.path}"

    def _target(self) -> Any:
        return self._transport()

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        timeout = httpx2.Timeout(self._timeout, read=self._read_timeout)
        async with (
            httpx2.AsyncClient(headers=self._headers, timeout=timeout) as http,
            streamable_http_client(
                self._url, http_client=http, terminate_on_close=self._terminate
            ) as streams,
        ):
            yield streams
