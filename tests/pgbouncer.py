"""PgBouncer for tests: Debian's ``pgbouncer`` in transaction mode in front of the test server.

``bouncer(dsn)`` starts one on 127.0.0.1 (a free port, a throwaway directory)
for a DSN of ``tests.pgtest`` and yields the DSN to connect through it. Its
database entry sets the DSN's ``search_path`` with ``connect_query`` on every
server connection, since PgBouncer does not forward a ``search_path`` startup
parameter. ``scripts/with-postgres.sh`` installs the package (as root, on CI);
without the binary the tests skip, or fail when ``CI`` is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import SplitResult, parse_qsl, urlsplit, urlunsplit

import pytest

__all__ = ["bouncer", "pgbouncer_binary"]

START_TIMEOUT_SECONDS = 20.0


def pgbouncer_binary() -> str:
    """The path of ``pgbouncer``; skips the test (fails it in CI) when it is missing."""
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("pgbouncer is not installed: scripts/with-postgres.sh installs it")
    pytest.skip("pgbouncer is not installed (apt-get install pgbouncer)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _accepting(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def _configure(
    workdir: Path,
    binary: str,
    parts: SplitResult,
    user: str,
    database: str,
    search_path: str | None,
    port: int,
    pool_size: int,
) -> list[str]:
    """Write the configuration into ``workdir``; the command that starts PgBouncer."""
    connect_query = f" connect_query='SET search_path TO {search_path}'" if search_path else ""
    (workdir / "users.txt").write_text(f'"{user}" ""\n', encoding="utf-8")
    (workdir / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"chatflow = host={parts.hostname} port={parts.port} dbname={database} "
        f"user={user}{connect_query}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = trust\n"
        f"auth_file = {workdir / 'users.txt'}\n"
        "pool_mode = transaction\n"
        f"default_pool_size = {pool_size}\n"
        "max_client_conn = 1000\n"
        f"logfile = {workdir / 'pgbouncer.log'}\n"
        f"pidfile = {workdir / 'pgbouncer.pid'}\n",
        encoding="utf-8",
    )
    command = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        shutil.chown(workdir, "postgres")
        for path in workdir.iterdir():
            shutil.chown(path, "postgres")
        command = ["runuser", "-u", "postgres", "--", *command]
    return command


@contextlib.asynccontextmanager
async def bouncer(dsn: str, *, pool_size: int = 20) -> AsyncIterator[str]:
    """PgBouncer in transaction mode in front of ``dsn``; yields the DSN through it."""
    binary = pgbouncer_binary()
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    search_path = query.pop("search_path", None)
    user = parts.username or "postgres"
    database = parts.path.lstrip("/")
    port = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="chatflow-pgbouncer."))
    command = await asyncio.to_thread(
        _configure, workdir, binary, parts, user, database, search_path, port, pool_size
    )
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(START_TIMEOUT_SECONDS):
            while not await _accepting(port):
                if process.returncode is not None:
                    raise AssertionError(f"pgbouncer did not start: see {workdir}")
                await asyncio.sleep(0.05)
        through = parts._replace(
            netloc=f"{user}@127.0.0.1:{port}",
            path="/chatflow",
            query="&".join(f"{k}={v}" for k, v in query.items()),
        )
        yield urlunsplit(through)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)  # its own session: runuser and pgbouncer
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        shutil.rmtree(workdir, ignore_errors=True)
