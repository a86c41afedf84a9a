"""A PostgreSQL primary and a streaming standby on 127.0.0.1, for the chaos suite.

Debian's server binaries (``/usr/lib/postgresql/<v>/bin``), run as the
``postgres`` user when we are root (initdb refuses root), in a fresh
directory under ``/tmp`` that is deleted afterwards. The standby is made with
``pg_basebackup -R`` and streams under ``application_name=standby1``; with
``synchronous=True`` the primary waits for it at every commit
(``synchronous_standby_names='standby1'``, ``synchronous_commit=on``), the
zero-loss profile. The harness is the failover manager: it stops the primary
and promotes the standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
from pathlib import Path

import asyncpg

__all__ = ["PgCluster", "server_binaries"]

STANDBY_NAME = "standby1"


def server_binaries() -> Path | None:
    """The newest ``/usr/lib/postgresql/<v>/bin`` holding ``initdb``, if any."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: p.parent)
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgCluster:
    """Primary (``primary_port``) and standby (``standby_port``); ``start``, faults, ``stop``."""

    def __init__(self, *, synchronous: bool = True) -> None:
        bindir = server_binaries()
        if bindir is None:
            raise RuntimeError("PostgreSQL server binaries not found (apt-get install postgresql)")
        self.bindir = bindir
        self.synchronous = synchronous
        self.root = Path(tempfile.mkdtemp(prefix="chatflow-chaos-"))
        self.primary_port = _free_port()
        self.standby_port = _free_port()
        self.primary_dir = self.root / "primary"
        self.standby_dir = self.root / "standby"
        self.promoted = False
        self._root = os.geteuid() == 0
        if self._root:
            shutil.chown(self.root, "postgres")

    # -- commands -------------------------------------------------------------------

    async def _run(self, *argv: str) -> str:
        command = [str(self.bindir / argv[0]), *argv[1:]]
        if self._root:
            command = ["runuser", "-u", "postgres", "--", *command]
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd="/",
        )
        out, _ = await proc.communicate()
        text = out.decode(errors="replace")
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {text[-2000:]}")
        return text

    def _options(self, port: int, *, standby: bool) -> str:
        sync = STANDBY_NAME if self.synchronous and not standby else ""
        return (
            f"-p {port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200 "
            "-c fsync=off -c full_page_writes=off -c wal_level=replica -c max_wal_senders=5 "
            "-c wal_keep_size=256MB -c hot_standby=on "
            f"-c synchronous_standby_names='{sync}' -c synchronous_commit=on"
        )

    async def _pg_ctl_start(self, data: Path, port: int, *, standby: bool) -> None:
        await self._run(
            "pg_ctl",
            "-D",
            str(data),
            "-l",
            str(data.parent / f"{data.name}.log"),
            "-w",
            "-t",
            "60",
            "-o",
            self._options(port, standby=standby),
            "start",
        )

    # -- life -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Primary, database ``chatflow``, then the standby; returns once it streams."""
        await self._run(
            "initdb", "-D", str(self.primary_dir), "-U", "postgres", "-A", "trust",
            "-E", "UTF8", "--no-sync",
        )  # fmt: skip
        await self._pg_ctl_start(self.primary_dir, self.primary_port, standby=False)
        await self._run(
            "pg_basebackup", "-D", str(self.standby_dir), "-R", "-X", "stream",
            "-d", f"host=127.0.0.1 port={self.primary_port} user=postgres "
            f"application_name={STANDBY_NAME}",
        )  # fmt: skip
        await self._pg_ctl_start(self.standby_dir, self.standby_port, standby=True)
        conn = await asyncpg.connect(self.dsn(self.primary_port, "postgres"))
        try:
            await conn.execute("CREATE DATABASE chatflow")
        finally:
            await conn.close()
        await self.wait_streaming()

    async def wait_streaming(self, within: float = 30.0) -> None:
        """Until the standby streams (as the synchronous one, in that profile)."""
        wanted = "sync" if self.synchronous else "async"
        async with asyncio.timeout(within):
            while True:
                with contextlib.suppress(OSError, asyncpg.PostgresError):
                    conn = await asyncpg.connect(self.dsn(self.primary_port, "postgres"))
                    try:
                        state = await conn.fetchval(
                            "SELECT sync_state FROM pg_stat_replication "
                            "WHERE application_name = $1",
                            STANDBY_NAME,
                        )
                    finally:
                        await conn.close()
                    if state == wanted:
                        return
                await asyncio.sleep(0.2)

    def dsn(self, port: int, database: str = "chatflow") -> str:
        return f"postgresql://postgres@127.0.0.1:{port}/{database}"

    @property
    def writable_port(self) -> int:
        """The port of whichever server is the primary now."""
        return self.standby_port if self.promoted else self.primary_port

    async def stop_primary(self) -> None:
        """Kill the primary at once (no shutdown checkpoint): a crashed host."""
        await self._run("pg_ctl", "-D", str(self.primary_dir), "-m", "immediate", "-w", "stop")

    async def start_primary(self) -> None:
        await self._pg_ctl_start(self.primary_dir, self.primary_port, standby=False)

    async def promote(self) -> None:
        """Promote the standby (the primary must be stopped: the harness fences it)."""
        await self._run("pg_ctl", "-D", str(self.standby_dir), "-w", "promote")
        self.promoted = True

    async def stop(self) -> None:
        """Stop both servers and delete their files."""
        for data in (self.primary_dir, self.standby_dir):
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError):
                    await self._run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
