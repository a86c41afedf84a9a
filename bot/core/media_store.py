"""``MediaStore``: the bytes of photos, voice notes and files, content-addressed on disk.

A message row holds only a part (``bot.core.messages``) naming the bytes by
SHA-256; the bytes live in ``DATA_DIR/media/<aa>/<sha256>``. The same file sent
twice is stored once, a re-run download after a crash writes the same name
again (harmless), and nothing about the sender is in the path. Writes go
through a temporary file and ``os.replace``, so a crash never leaves a torn
file under a final name. All file work runs in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
import uuid
from pathlib import Path

from bot.errors import StorageError

__all__ = ["DEFAULT_MAX_MEDIA_BYTES", "MEDIA_RETENTION_SECONDS", "MediaStore", "MediaTooLargeError"]

DEFAULT_MAX_MEDIA_BYTES = 20 * 1024 * 1024
"""Largest file accepted (``MAX_MEDIA_BYTES``): Telegram's Bot API serves no more to bots."""
MEDIA_RETENTION_SECONDS = 30 * 24 * 3600.0
"""Files unused this long are removed by ``prune`` (a re-sent file refreshes its time)."""

_SHA256 = re.compile(r"[0-9a-f]{64}")


class MediaTooLargeError(StorageError):
    """The bytes are over the store's ``max_bytes``."""


class MediaStore:
    """Media bytes under ``root``, named by their SHA-256."""

    def __init__(self, root: Path, *, max_bytes: int = DEFAULT_MAX_MEDIA_BYTES) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root = Path(root)
        self.max_bytes = max_bytes

    def path_of(self, sha256: str) -> Path:
        """Where the bytes of ``sha256`` are (or would be); ``ValueError`` for a non-hash."""
        if not _SHA256.fullmatch(sha256):
            raise ValueError("not a SHA-256 hex digest")
        return self.root / sha256[:2] / sha256

    async def put(self, data: bytes) -> str:
        """Store ``data``; return its SHA-256 (hex). ``MediaTooLargeError`` past ``max_bytes``."""
        if len(data) > self.max_bytes:
            raise MediaTooLargeError(f"media of {len(data)} bytes is over {self.max_bytes}")
        return await asyncio.to_thread(self._put, data)

    def _put(self, data: bytes) -> str:
        sha256 = hashlib.sha256(data).hexdigest()
        final = self.path_of(sha256)
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                os.utime(final)  # used again: retention counts from now
                return sha256
            temporary = final.with_name(f".{sha256}.{uuid.uuid4().hex}.tmp")
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, final)
        except OSError as exc:
            raise StorageError(f"could not store media: {type(exc).__name__}") from exc
        return sha256

    async def read(self, sha256: str) -> bytes | None:
        """The bytes of ``sha256``, or ``None`` when they are gone (pruned, never stored)."""
        path = self.path_of(sha256)
        return await asyncio.to_thread(_read_or_none, path)

    async def remember(self, key: str, value: str) -> None:
        """Keep a small text ``value`` under ``key`` (what a platform file id fetched,
        a transcript), so a re-run after a crash does not download or transcribe again."""
        await asyncio.to_thread(self._remember, self.note_path(key), value)

    async def recall(self, key: str) -> str | None:
        """The value ``remember`` kept under ``key``, or ``None``."""
        data = await asyncio.to_thread(_read_or_none, self.note_path(key))
        return None if data is None else data.decode("utf-8", errors="replace")

    def note_path(self, key: str) -> Path:
        """Where the note for ``key`` is (or would be); hashed: keys hold platform ids,
        which must not become file names."""
        digest = hashlib.sha256(key.encode("utf-8", errors="surrogatepass")).hexdigest()
        return self.root / "notes" / digest[:2] / digest

    def _remember(self, path: Path, value: str) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            temporary.write_text(value, encoding="utf-8")
            os.replace(temporary, path)
        except OSError as exc:
            raise StorageError(f"could not store a media note: {type(exc).__name__}") from exc

    async def prune(self, older_than: float = MEDIA_RETENTION_SECONDS) -> int:
        """Remove files not written or re-used for ``older_than`` seconds; returns how many."""
        return await asyncio.to_thread(self._prune, time.time() - older_than)

    def _prune(self, cutoff: float) -> int:
        removed = 0
        if not self.root.is_dir():
            return 0
        for path in [*self.root.glob("??/*"), *self.root.glob("notes/??/*")]:
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"could not read media: {type(exc).__name__}") from exc
