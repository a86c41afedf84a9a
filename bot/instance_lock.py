"""One bot process per data directory (SQLite): an ``flock`` on ``DATA_DIR``."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from bot.errors import ConfigurationError

__all__ = ["InstanceLock"]


class InstanceLock:
    """An exclusive lock file in ``DATA_DIR``: one bot process per data directory.

    ``flock`` is released by the kernel when the process dies, even by SIGKILL,
    so a crash never leaves a stale lock behind.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "chatflow.lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``ConfigurationError`` saying another bot runs."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(fd)
            raise ConfigurationError(
                f"DATA_DIR: another Chatflow process is already running on {self.path.parent} "
                "(stop it first, or give this one its own DATA_DIR)",
                setting="DATA_DIR",
            ) from exc
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd

    def held_elsewhere(self) -> bool:
        """Whether another process holds the lock now (a bot runs on this data directory).

        A probe: a shared lock taken and given back at once (a bot starting in
        that very microsecond would find the directory busy and say so).
        """
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # closing releases the probe's lock
        return False

    def release(self) -> None:
        """Give the lock up; idempotent."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock for the ``with`` block."""
        self.acquire()
        try:
            yield
        finally:
            self.release()
