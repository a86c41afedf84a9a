"""``MCPServer``: the life of one MCP server's connection, and calls through it.

The transports (``MCPServerStdio``, ``MCPServerStreamableHttp``) are in
``bot.core.mcp.servers``. Each server's connection lives in one supervisor task
(the SDK's client is an anyio context: it is entered and left in that task):
it connects, lists the tools, refreshes them when the server says they
changed, and when the connection dies it reconnects with backoff (doubling,
reset only once a connection has stayed up ``STABLE_AFTER`` seconds). Calls
made meanwhile get an error result, never an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from bot.core.attachments import ToolOutput
from bot.core.mcp.retry import (
    STABLE_AFTER,
    Backoff,
    connection_gone,
    is_connection_closed,
    reason,
)
from bot.core.mcp.tools import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGES,
    DEFAULT_MAX_OUTPUT_CHARS,
    MCPTool,
    ToolFilterStatic,
    build_tools,
    check_tool_filter,
    check_tool_name_prefix,
    render_result,
)
from bot.core.tools import DEFAULT_TOOL_TIMEOUT, error_result
from bot.errors import MCPServerError

if TYPE_CHECKING:
    from mcp import Client
    from mcp.client.session import IncomingMessage

__all__ = ["DEFAULT_CONNECT_TIMEOUT", "STABLE_AFTER", "MCPServer", "MCPServerStatus"]

logger = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 20.0
"""Seconds a server may take to start and list its tools."""

MCPServerStatus = Literal["idle", "connecting", "connected", "reconnecting", "closed"]
"""Where a server's connection stands."""

_CLOSE_GRACE = 5.0
# The SDK's stdio teardown is bounded (flush 0.5 s, stdin closed 2 s, SIGTERM
# 2 s, reap 2 s); cut short by a cancel, it leaves the child running.
_PROCESS_STOP_LIMIT = 10.0
_LIST_PAGES = 100
_CLIENT_NAME = "chatflow"


@functools.cache
def _client_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chatflow-bot")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


class MCPServer:
    """An MCP server whose tools an ``Agent`` offers (base of the transports).

    One object may serve several agents; it is connected once. ``connect()`` and
    ``close()`` are called by the ``Runner`` (``async with Runner(...)``), the
    bot and ``chatflow chat``; ``async with server:`` works on its own too.
    ``tool_filter`` (``create_static_tool_filter``, openai-agents' shape) picks
    the tools offered, by the names the server lists; ``tool_name_prefix`` is
    put before each offered name.
    """

    _stops_a_process = False
    """Whether leaving the SDK's client stops a child process (then it is never cut short)."""

    def __init__(
        self,
        *,
        name: str,
        optional: bool = False,
        connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT,
        client_session_timeout_seconds: float = DEFAULT_TOOL_TIMEOUT,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        tool_filter: ToolFilterStatic | None = None,
        tool_name_prefix: str | None = None,
        max_images: int = DEFAULT_MAX_IMAGES,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    ) -> None:
        if not name or not name.strip():
            raise ValueError("an MCP server needs a non-empty name")
        if connect_timeout_seconds <= 0 or client_session_timeout_seconds <= 0:
            raise ValueError(f"MCP server {name!r}: timeouts must be positive")
        if max_output_chars < 100:
            raise ValueError(f"MCP server {name!r}: max_output_chars must be at least 100")
        if max_images < 0 or max_image_bytes < 0:
            raise ValueError(f"MCP server {name!r}: max_images and max_image_bytes must be >= 0")
        self._allowed, self._blocked = check_tool_filter(name, tool_filter)
        self.name = name
        """Names the server in logs, errors and ``doctor``."""
        self.optional = optional
        """If true, the bot starts without this server's tools when it cannot start."""
        self.connect_timeout_seconds = connect_timeout_seconds
        """Seconds allowed to start, connect and list the tools."""
        self.client_session_timeout_seconds = client_session_timeout_seconds
        """Seconds one tool call may take before the model gets a timeout error."""
        self.max_output_chars = max_output_chars
        """Characters of a result the model sees; the rest is cut."""
        self.max_images = max_images
        """Images one result may send to the user; the rest are left out with a note."""
        self.max_image_bytes = max_image_bytes
        """Bytes of images (decoded) one result may send to the user."""
        self.tool_name_prefix = check_tool_name_prefix(name, tool_name_prefix)
        """Put before each tool's name (``"crm_"``: ``lookup`` is offered as ``crm_lookup``)."""
        self.status: MCPServerStatus = "idle"
        """Where the connection stands."""
        self.last_error: str | None = None
        """Why the last connection attempt failed or ended (no secrets: a type and a message)."""
        self._tools: tuple[MCPTool, ...] = ()
        self._client: Client | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._refresh_wanted = asyncio.Event()
        self._closing = False
        self._leaving = False
        self._left_out: set[tuple[str, str]] = set()
        self._backoff = Backoff()

    def __repr__(self) -> str:
        # Never the params: env and headers carry secrets.
        return f"{type(self).__name__}(name={self.name!r}, status={self.status!r})"

    @property
    def tools(self) -> tuple[MCPTool, ...]:
        """The tools as last listed (kept while reconnecting, so calls get an error)."""
        return self._tools

    @property
    def is_connected(self) -> bool:
        """Whether a call would reach the server now."""
        return self._client is not None

    def describe(self) -> str:
        """Where the server is, for ``doctor`` (no env, no headers)."""
        return self.name

    def _target(self) -> Any:
        """What ``mcp.Client`` connects to (a transport, parameters or a URL)."""
        raise NotImplementedError

    def _new_client(self) -> Client:
        from mcp import Client
        from mcp_types import Implementation

        return Client(
            self._target(),
            message_handler=self._on_message,
            client_info=Implementation(name=_CLIENT_NAME, version=_client_version()),
        )

    def _failure_reason(self, exc: BaseException) -> str:
        """One line on why connecting failed (a transport may know more than the SDK says)."""
        return reason(exc)

    # -- life cycle --------------------------------------------------------------

    async def connect(self, within: float | None = None) -> None:
        """Start the server, connect and list its tools, in ``within`` seconds.

        Raises ``MCPServerError`` naming the server and the reason. A required
        server is then closed; an optional one keeps trying in the background.
        Calling it on a connected server does nothing.
        """
        if self._task is not None and not self._task.done():
            if self.is_connected:
                return
            await self.close()
        limit = within if within is not None else self.connect_timeout_seconds
        self._closing = False
        self._wake = asyncio.Event()  # bound to this loop: a server may outlive one
        first: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._supervise(first), name=f"mcp-server:{self.name}")
        try:
            async with asyncio.timeout(limit):
                await asyncio.shield(first)
        except TimeoutError:
            first.cancel()
            self.last_error = f"no answer within {limit:g} s"
            await self._give_up()
            raise MCPServerError(
                f"MCP server {self.name!r} failed to start: {self.last_error}", server=self.name
            ) from None
        except MCPServerError:
            await self._give_up()
            raise

    async def _give_up(self) -> None:
        if not self.optional:
            await self.close()

    async def close(self) -> None:
        """Close the connection (and stop a child process). Safe to call twice."""
        task, self._task = self._task, None
        self._closing = True
        self._wake.set()
        if task is not None and not task.done():
            # Connected: leave the SDK's context in order (it stops a child process
            # politely). Still connecting or stuck: nothing to be polite to.
            done: set[asyncio.Task[None]] = set()
            if self.is_connected or self._leaving:
                done, _ = await asyncio.wait({task}, timeout=_CLOSE_GRACE)
                if not done and self._leaving and self._stops_a_process:
                    # A cancel now would cut the SDK's own (bounded) kill short.
                    done, _ = await asyncio.wait({task}, timeout=_PROCESS_STOP_LIMIT)
            if not done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self.status = "closed"

    async def __aenter__(self) -> Self:
        """Connect (``connect()``) and return the server."""
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close it."""
        await self.close()

    def _stopped(self) -> bool:
        return self._closing

    async def _supervise(self, first: asyncio.Future[None]) -> None:
        """Keep a connection up until ``close()``; reconnect with backoff when it dies."""
        backoff = self._backoff
        while not self._stopped():
            self._wake.clear()
            # A change announced while the first list is still on its way is not lost.
            self._refresh_wanted = asyncio.Event()
            self.status = "connecting" if not first.done() else "reconnecting"
            connected = False
            try:
                async with self._new_client() as client:
                    try:
                        await self._refresh(client)
                        connected = True
                        self._client = client
                        self.status = "connected"
                        self.last_error = None
                        backoff.up()
                        if first.done():
                            logger.info(
                                "MCP server %s reconnected (%d tools)", self.name, len(self._tools)
                            )
                        else:
                            first.set_result(None)
                            logger.info(
                                "MCP server %s connected (%d tools)", self.name, len(self._tools)
                            )
                        await self._watch(client)
                    finally:
                        self._client = None
                        self._leaving = True
            except Exception as exc:
                self.last_error = reason(exc) if connected else self._failure_reason(exc)
                if not first.done():
                    first.set_exception(
                        MCPServerError(
                            f"MCP server {self.name!r} failed to start: {self.last_error}",
                            server=self.name,
                        )
                    )
                    # A required server is closed by connect(); an optional one retries.
                    if not self.optional:
                        return
            finally:
                self._client = None
                self._leaving = False
            if self._stopped():
                break
            self.status = "reconnecting"
            delay = backoff.delay()
            logger.warning(
                "MCP server %s unavailable (%s); retrying in %.3g s",
                self.name,
                self.last_error or "connection ended",
                delay,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _watch(self, client: Client) -> None:
        """Return (or raise) once the connection is lost or ``close()`` was called."""
        listener = asyncio.create_task(self._listen(client))
        refresher = asyncio.create_task(self._refresher(client))
        woken = asyncio.create_task(self._wake.wait())
        tasks = {listener, refresher, woken}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in (listener, refresher):
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        if not self._closing and self.last_error is None:
            self.last_error = "connection lost"

    async def _listen(self, client: Client) -> None:
        """Ask for a refresh on each change event (2026-07-28 ``subscriptions/listen``).

        A stream the server ends (or drops) while the connection stays is
        opened again, with backoff, and the list fetched again (no event is
        replayed); only a closed connection ends this (by raising). Servers of
        the earlier protocol send ``notifications/tools/list_changed`` on the
        session instead (``_on_message``); for them this waits forever.
        """
        from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
        from mcp.shared.exceptions import MCPError

        backoff = dataclasses.replace(self._backoff)  # same timings, its own count
        opened = False
        while True:
            try:
                async with client.listen(tools_list_changed=True) as subscription:
                    opened = True
                    backoff.up()
                    # Changes between the last list and this stream were not announced.
                    self._refresh_wanted.set()
                    async for _event in subscription:
                        self._refresh_wanted.set()
                why = "the server closed its change stream"
            except ListenNotSupportedError:
                break
            except (MCPError, SubscriptionLost, TimeoutError) as exc:
                if connection_gone(exc):
                    raise
                if not opened:
                    logger.info("MCP server %s sends no change events (%s)", self.name, reason(exc))
                    break
                why = reason(exc)
            delay = backoff.delay()
            # A server that keeps ending its stream costs a DEBUG line per retry, not INFO.
            logger.log(
                logging.INFO if delay == backoff.first else logging.DEBUG,
                "MCP server %s: change stream ended (%s); listening again in %.3g s",
                self.name,
                why,
                delay,
            )
            await asyncio.sleep(delay)
        await asyncio.Event().wait()

    async def _refresher(self, client: Client) -> None:
        """Refresh the tools whenever asked; requests made meanwhile make one more refresh."""
        while True:
            await self._refresh_wanted.wait()
            self._refresh_wanted.clear()
            try:
                await self._refresh(client)
            except Exception as exc:
                if connection_gone(exc):
                    raise
                logger.warning("MCP server %s: tool refresh failed (%s)", self.name, reason(exc))

    async def _on_message(self, message: IncomingMessage) -> None:
        import mcp_types as types

        if isinstance(message, types.ToolListChangedNotification):
            self._refresh_wanted.set()

    def _note_left_out(self, tool: str, why: str) -> None:
        if (tool, why) not in self._left_out:  # once, not at every refresh
            self._left_out.add((tool, why))
            logger.warning("MCP server %s: tool %r is left out: %s", self.name, tool, why)

    async def _refresh(self, client: Client) -> None:
        listed = []
        cursor: str | None = None
        for _ in range(_LIST_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode="refresh")
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        before = {tool.name for tool in self._tools}
        self._tools = tuple(
            build_tools(
                self,
                listed,
                allowed=self._allowed,
                blocked=self._blocked,
                prefix=self.tool_name_prefix,
                left_out=self._note_left_out,
            )
        )
        for tool in self._tools:
            if tool.name != tool.mcp_name and tool.name not in before:
                logger.info(
                    "MCP server %s: tool %r offered as %r", self.name, tool.mcp_name, tool.name
                )
        after = {tool.name for tool in self._tools}
        if self.status == "connected" and before != after:
            logger.info("MCP server %s: tools changed (%d tools)", self.name, len(after))

    # -- calls -------------------------------------------------------------------

    async def call_tool(
        self, tool: MCPTool, arguments: dict[str, Any], meta: Mapping[str, Any]
    ) -> str | ToolOutput:
        """Call ``tool`` and return what the model reads; every failure is an error result."""
        client = self._client
        if client is None:
            return error_result(
                f"MCP server '{self.name}' is not available right now ({self.status}); "
                "tell the user and try again later"
            )
        timeout = self.client_session_timeout_seconds
        try:
            async with asyncio.timeout(timeout) as scope:
                result = await client.call_tool(tool.mcp_name, arguments, meta=dict(meta))  # type: ignore[arg-type]
        except TimeoutError as exc:
            if not scope.expired():
                return self._failed(tool, exc)
            logger.warning("MCP tool %s on %s timed out after %s s", tool.name, self.name, timeout)
            return error_result(f"tool '{tool.name}' timed out after {timeout:g} s")
        except Exception as exc:
            if is_connection_closed(exc):
                if self._client is client:
                    # The supervisor reconnects. Only for this connection: a late
                    # wake-up would tear down the next one as soon as it is made.
                    self._wake.set()
                logger.warning("MCP server %s: connection lost during a call", self.name)
                return error_result(f"MCP server '{self.name}' is not reachable: connection lost")
            return self._failed(tool, exc)
        return render_result(
            result,
            self.max_output_chars,
            max_images=self.max_images,
            max_image_bytes=self.max_image_bytes,
        )

    def _failed(self, tool: MCPTool, exc: Exception) -> str:
        logger.warning("MCP tool %s on %s failed: %s", tool.name, self.name, type(exc).__name__)
        return error_result(f"tool '{tool.name}' failed: {reason(exc)}")
