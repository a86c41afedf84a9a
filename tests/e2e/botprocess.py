"""The real bot (``python -m bot run``) as a subprocess, for end-to-end tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path
from typing import ClassVar

from tests.cli_inprocess import LOADS_AGENTS, in_process, run_main

ROOT = Path(__file__).resolve().parents[2]
READY_LINE = "HTTP server listening on"


def free_port() -> int:
    """A port nothing listens on right now (the bot binds it a moment later)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BotProcess:
    """Starts, kills and restarts the bot with one data directory and one environment."""

    made: ClassVar[list[BotProcess]] = []
    """Every bot made in the running test (its log is shown when the test fails)."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
        self.env = {
            **keep,
            "PYTHONPATH": str(ROOT),
            "DATA_DIR": str(data_dir),
            "HTTP_HOST": "127.0.0.1",
            "HTTP_PORT": str(self.port),
            "LOG_FORMAT": "text",
            "LOG_LEVEL": "INFO",
            **env,
        }
        self.proc: asyncio.subprocess.Process | None = None
        self.log: list[str] = []
        self._reader: asyncio.Task[None] | None = None
        BotProcess.made.append(self)

    @property
    def url(self) -> str:
        """Base URL of the bot's HTTP server."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self, within: float = 30.0) -> None:
        """Start the bot and return once its HTTP server listens (recovery done)."""
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            "run",
            "--no-console",
            cwd=self.data_dir.parent,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            limit=2**24,  # a long log line must not kill the reader (and block the bot)
        )
        ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), within)
        except TimeoutError:
            await self.kill()
            raise AssertionError("bot did not become ready:\n" + "\n".join(self.log)) from None
        except BaseException:
            # Reaped here: a process left to the garbage collector warns in a later test.
            await self.kill()
            raise

    async def _read(self, ready: asyncio.Future[None]) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            self.log.append(text)
            if READY_LINE in text and not ready.done():
                ready.set_result(None)
        if not ready.done():
            ready.set_exception(AssertionError("bot exited:\n" + "\n".join(self.log)))

    async def command(self, *args: str, **env: str) -> tuple[int, str, str]:
        """``python -m bot ARGS`` as the operator runs it beside this bot (its directory
        and environment, plus ``env``): the exit code, stdout and stderr."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bot",
            *args,
            cwd=self.data_dir.parent,
            env={**self.env, **env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def command_in_process(self, *args: str, **env: str) -> tuple[int, str, str]:
        """``command`` for a command that only reads and writes the database (see
        ``tests.cli_inprocess.IN_PROCESS``), run in the test process: no interpreter start.
        Keep a real ``command`` of the same family in the test as well."""
        own = in_process(args) and " ".join(args[:2]) not in LOADS_AGENTS
        assert own, f"python -m bot {' '.join(args)} needs a process of its own"
        return await asyncio.to_thread(
            run_main, args, cwd=self.data_dir.parent, env={**self.env, **env}
        )

    async def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        await self._end(signal.SIGKILL)

    async def stop(self) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        return await self._end(signal.SIGTERM)

    async def _end(self, sig: int) -> int:
        if self.proc is None:
            return 0
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)
        code = await asyncio.wait_for(self.proc.wait(), 30)
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        self.proc = None
        return code
