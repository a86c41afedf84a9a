"""How the PostgreSQL store opens a connection: per-host timeouts, keepalives, names.

asyncpg applies one connect timeout to all the hosts of a multi-host URL
together, so a first host that swallows packets (a dead machine, a failed-over
primary) eats the whole budget and the next host is never tried. It sets no
TCP keepalive on its sockets either, so a statement sent to a host that went
silent waits for the kernel (about 15 minutes), or forever once the request
was acknowledged. ``connector`` fixes both, as the pool's ``connect`` hook:

- each host of ``postgresql://u@h1:5432,h2:5432/db?target_session_attrs=read-write``
  is tried in order with ``connect_timeout`` of its own (asyncpg checks
  ``target_session_attrs`` on each), so a silent or read-only first host is
  skipped within that time;
- every socket gets ``SO_KEEPALIVE`` with short probes and ``TCP_USER_TIMEOUT``
  (Linux): a connection whose peer stopped answering fails within
  ``tcp_user_timeout`` whether data is in flight or not, which bounds even a
  COMMIT without a cancelling timeout on it (a cancelled COMMIT may be durable
  locally and lost by a failover: never cancel one).

``server_settings`` gives the server side the same: its keepalives and
``tcp_user_timeout`` drop the backends of a host that vanished (and with them
their session locks), ``idle_in_transaction_session_timeout`` ends a
transaction its frozen client no longer drives, and ``application_name``
names the process, so a process taking a dead one's work over can end the
dead one's backends (``bot.gateway.fencing``).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import asyncpg

from bot.core.sql import dsn_hosts

__all__ = ["APPLICATION_PREFIX", "ConnectionOptions", "application_name", "connector"]

logger = logging.getLogger(__name__)

APPLICATION_PREFIX: Final = "chatflow/"
"""``application_name`` of every connection a bot process opens: this, then its instance id."""


def application_name(instance_id: str) -> str:
    """The ``application_name`` of the connections of the process ``instance_id``."""
    return f"{APPLICATION_PREFIX}{instance_id}"[:63]  # NAMEDATALEN - 1


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Every limit on the PostgreSQL store's waits (``bot.config`` has the settings)."""

    connect_timeout: float = 5.0
    """Seconds one host may take to accept a connection and finish the handshake."""
    statement_timeout: float = 30.0
    """Seconds one statement (never COMMIT) may take before it is cancelled."""
    acquire_timeout: float = 10.0
    """Seconds to wait for a free pooled connection."""
    keepalive_idle: int = 5
    """Seconds a connection may be idle before TCP keepalive probes start."""
    keepalive_interval: int = 2
    """Seconds between keepalive probes."""
    keepalive_count: int = 3
    """Unanswered probes before the connection is dropped."""
    tcp_user_timeout: float = 15.0
    """Seconds sent data may stay unacknowledged before the connection is dropped (Linux)."""
    idle_in_transaction_timeout: float = 60.0
    """Seconds the server lets a transaction sit idle before ending its session."""
    application_name: str = "chatflow"
    """Names this process's connections on the server (``pg_stat_activity``)."""
    pooler: str = "none"
    """``"transaction"`` behind PgBouncer in transaction mode: no prepared-statement
    cache, and only ``application_name`` at connect (PgBouncer refuses other startup
    parameters, and would not keep them per transaction anyway)."""

    def server_settings(self) -> dict[str, str]:
        """What the server is told at connect time (per connection)."""
        if self.pooler == "transaction":
            return {"application_name": self.application_name}
        return {
            "tcp_keepalives_idle": str(self.keepalive_idle),
            "tcp_keepalives_interval": str(self.keepalive_interval),
            "tcp_keepalives_count": str(self.keepalive_count),
            "tcp_user_timeout": str(int(self.tcp_user_timeout * 1000)),
            "idle_in_transaction_session_timeout": str(
                int(self.idle_in_transaction_timeout * 1000)
            ),
            "application_name": self.application_name,
        }


def tune_socket(sock: socket.socket, options: ConnectionOptions) -> None:
    """Keepalives and ``TCP_USER_TIMEOUT`` on ``sock`` (options the OS lacks are skipped)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return  # a Unix socket: the peer is this host's server
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", options.keepalive_idle),
        ("TCP_KEEPINTVL", options.keepalive_interval),
        ("TCP_KEEPCNT", options.keepalive_count),
        ("TCP_USER_TIMEOUT", int(options.tcp_user_timeout * 1000)),
    ):
        level = getattr(socket, name, None)
        if level is not None:
            sock.setsockopt(socket.IPPROTO_TCP, level, value)


def _socket_of(conn: asyncpg.Connection) -> socket.socket | None:
    transport = getattr(conn, "_transport", None)
    sock = None if transport is None else transport.get_extra_info("socket")
    # asyncio hands out a TransportSocket wrapper: setsockopt passes through.
    return sock if sock is not None and hasattr(sock, "setsockopt") else None


# Why one host was skipped: it refused, did not answer in time, or is not the primary.
_HOST_ERRORS: Final = (
    OSError,
    TimeoutError,
    asyncpg.TargetServerAttributeNotMatched,
    asyncpg.CannotConnectNowError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
)


def connector(
    options: ConnectionOptions,
) -> Callable[..., Awaitable[asyncpg.Connection]]:
    """The pool's ``connect`` hook: hosts in order, each with its own timeout, sockets tuned."""

    async def connect(dsn: str, **kwargs: Any) -> asyncpg.Connection:
        try:
            hosts: list[tuple[str | None, int | None]] = list(dsn_hosts(dsn))
        except ValueError:
            hosts = []
        if len(hosts) <= 1:
            hosts = [(None, None)]  # the URL's own host (or its query's, or the socket)
        last: BaseException | None = None
        for host, port in hosts:
            try:
                conn: asyncpg.Connection = await asyncpg.connect(
                    dsn, host=host, port=port, timeout=options.connect_timeout, **kwargs
                )
            except _HOST_ERRORS as exc:
                last = exc
                if len(hosts) > 1:
                    logger.info(
                        "PostgreSQL host %d of %d skipped (%s)",
                        hosts.index((host, port)) + 1,
                        len(hosts),
                        type(exc).__name__,
                    )
                continue
            sock = _socket_of(conn)
            if sock is not None:
                try:
                    tune_socket(sock, options)
                except OSError:
                    logger.warning("could not set TCP keepalives on a PostgreSQL connection")
            return conn
        assert last is not None
        raise last

    return connect
