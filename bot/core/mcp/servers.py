"""MCP servers an agent takes tools from: a child process or a URL.

``MCPServerStdio`` runs a server as a child process of the bot;
``MCPServerStreamableHttp`` talks to one at a URL. Their ``params`` are spelled
as in openai-agents. The connection's life (connect, refresh, reconnect,
close) and the calls are ``MCPServer``'s, in ``bot.core.mcp.connection``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict
from urllib.parse import urlsplit

from bot.core.mcp.child_stderr import ChildStderr
from bot.core.mcp.connection import DEFAULT_CONNECT_TIMEOUT, MCPServer, MCPServerStatus
from bot.core.mcp.retry import is_connection_closed, reason
from bot.core.mcp.tools import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGES,
    DEFAULT_MAX_OUTPUT_CHARS,
    ToolFilterStatic,
)
from bot.core.tools import DEFAULT_TOOL_TIMEOUT

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "MCPServer",
    "MCPServerStatus",
    "MCPServerStdio",
    "MCPServerStdioParams",
    "MCPServerStreamableHttp",
    "MCPServerStreamableHttpParams",
]


MASK = "***"
"""What ``describe()`` shows instead of a secret."""

# Option and variable names whose value is a credential (``--api-key``, ``TOKEN=``).
_SECRET_NAME = re.compile(
    r"(token|secret|passw|pwd|key|auth|credential|bearer|cookie|session|private|signature)",
    re.IGNORECASE,
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s@]+@")
# A bare value that looks like a generated credential: long, upper and lower case
# and digits mixed (package names and host names are not), or a JWT.
_TOKEN_LIKE = re.compile(
    r"^(?=.*[a-z])(?=.*[A-Z])(?=.*[0-9])[A-Za-z0-9_\-+=~]{24,}$|^eyJ[\w-]+\.[\w-]+\.[\w-]*$"
)


def mask_args(args: list[str]) -> list[str]:
    """``args`` with credentials replaced by ``***``.

    Masked: the value after an option named like a credential (``--token X``),
    ``name=value`` where the name is (``--api-key=X``, ``TOKEN=X``), a URL's
    password, and bare values shaped like generated tokens.
    """
    shown: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not arg.startswith("-"):
            shown.append(MASK)
            hide_next = False
            continue
        hide_next = False
        name, eq, _value = arg.partition("=")
        if eq and _SECRET_NAME.search(name):
            shown.append(f"{name}={MASK}")
        elif arg.startswith("-") and _SECRET_NAME.search(arg):
            shown.append(arg)
            hide_next = True
        elif _TOKEN_LIKE.match(arg):
            shown.append(MASK)
        else:
            shown.append(_URL_PASSWORD.sub(rf"\g<head>{MASK}@", arg))
    return shown


def _default_name(command: str, args: list[str]) -> str:
    """``npx -y crm-mcp`` -> ``npx crm-mcp``: the command and its first real argument."""
    words = [Path(command).name]
    words.extend(
        Path(arg).name for arg in mask_args(args)[:3] if not arg.startswith("-") and MASK not in arg
    )
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

    _stops_a_process = True

    def __init__(
        self,
        params: MCPServerStdioParams,
        *,
        name: str | None = None,
        optional: bool = False,
        connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT,
        client_session_timeout_seconds: float = DEFAULT_TOOL_TIMEOUT,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        tool_filter: ToolFilterStatic | None = None,
        tool_name_prefix: str | None = None,
        max_images: int = DEFAULT_MAX_IMAGES,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    ) -> None:
        """``params``: ``command``, ``args``, ``env``, ``cwd`` (openai-agents' shape).

        ``tool_filter`` (``create_static_tool_filter``) picks the tools offered;
        ``tool_name_prefix`` goes before each tool's name (two servers with one
        tool name on one agent); ``max_images``/``max_image_bytes`` bound the
        images one result sends to the user.
        """
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
            tool_filter=tool_filter,
            tool_name_prefix=tool_name_prefix,
            max_images=max_images,
            max_image_bytes=max_image_bytes,
        )
        self._command = command
        self._args = args
        self._env = env
        self._cwd = params.get("cwd")
        self._encoding = params.get("encoding", "utf-8")
        self._last_words: str | None = None

    def describe(self) -> str:
        """``stdio: <command> <args>``, credentials in the arguments masked (``mask_args``);
        the environment is left out."""
        return "stdio: " + " ".join([self._command, *mask_args(self._args)])

    def _target(self) -> Any:
        return self._transport()

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        params = StdioServerParameters(
            command=self._command,
            args=self._args,
            env=self._env or None,
            cwd=self._cwd,
            encoding=self._encoding,
        )
        stderr = ChildStderr()
        self._last_words = None
        await stderr.start()
        try:
            async with stdio_client(params, errlog=stderr.file) as streams:
                yield streams
        finally:
            await stderr.close()
            self._last_words = stderr.last_line()

    def _failure_reason(self, exc: BaseException) -> str:
        """What the child said last on stderr (a traceback's last line, usually), with
        what the protocol saw: "Connection closed" alone tells the operator nothing."""
        said = reason(exc)
        if self._last_words is None:
            return said
        return f"{self._last_words} (the server's last words on stderr; {said})"


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


_HTTP_ADVICE = {
    401: "HTTP 401 Unauthorized: the server refused the credentials; "
    "check the Authorization header in params['headers']",
    403: "HTTP 403 Forbidden: the credentials are not allowed to use this server; "
    "check the token's scopes or the server's access list",
    404: "HTTP 404 Not Found: no MCP endpoint at this URL; check its path (often /mcp)",
}


def _http_advice(status: int) -> str:
    if status in _HTTP_ADVICE:
        return _HTTP_ADVICE[status]
    if status >= 500:
        return f"HTTP {status}: the server failed; see the MCP server's own logs"
    return f"HTTP {status}: the server refused the request"


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
        tool_filter: ToolFilterStatic | None = None,
        tool_name_prefix: str | None = None,
        max_images: int = DEFAULT_MAX_IMAGES,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    ) -> None:
        """``params``: ``url``, ``headers``, ``timeout``, ``sse_read_timeout``,
        ``terminate_on_close`` (openai-agents' shape). The other options are
        ``MCPServerStdio``'s."""
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
            tool_filter=tool_filter,
            tool_name_prefix=tool_name_prefix,
            max_images=max_images,
            max_image_bytes=max_image_bytes,
        )
        self._url = url
        self._headers = dict(params.get("headers") or {})
        self._timeout = float(params.get("timeout", 30.0))
        self._read_timeout = float(params.get("sse_read_timeout", 300.0))
        self._terminate = bool(params.get("terminate_on_close", True))
        self._refused: int | None = None

    def describe(self) -> str:
        """The URL without credentials, query or fragment; header names, values masked."""
        parts = urlsplit(self._url)
        port = f":{parts.port}" if parts.port else ""
        where = f"http: {parts.scheme}://{parts.hostname}{port}{parts.path}"
        if self._headers:
            where += " (headers: " + ", ".join(f"{k}: {MASK}" for k in self._headers) + ")"
        return where

    def _failure_reason(self, exc: BaseException) -> str:
        """The HTTP status that refused the connection, said so the operator can act on it
        (the SDK reports only "Server returned an error response")."""
        if self._refused is None or is_connection_closed(exc):
            return reason(exc)
        return _http_advice(self._refused)

    async def _note_status(self, response: httpx2.Response) -> None:
        if response.status_code >= 400:
            self._refused = response.status_code

    def _target(self) -> Any:
        return self._transport()

    @contextlib.asynccontextmanager
    async def _transport(self) -> AsyncIterator[Any]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        self._refused = None
        timeout = httpx2.Timeout(self._timeout, read=self._read_timeout)
        async with (
            httpx2.AsyncClient(
                headers=self._headers,
                timeout=timeout,
                event_hooks={"response": [self._note_status]},
            ) as http,
            streamable_http_client(
                self._url, http_client=http, terminate_on_close=self._terminate
            ) as streams,
        ):
            yield streams
