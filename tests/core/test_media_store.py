"""The content-addressed media store under DATA_DIR/media/."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from bot.core.media_store import MediaStore, MediaTooLargeError


async def test_bytes_are_stored_once_under_their_hash(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media")
    data = b"\xff\xd8\xff" + b"jpeg" * 100
    sha = await store.put(data)
    assert sha == hashlib.sha256(data).hexdigest()
    assert await store.put(data) == sha
    assert await store.read(sha) == data
    assert store.path_of(sha) == tmp_path / "media" / sha[:2] / sha
    assert [p.name for p in (tmp_path / "media").rglob("*") if p.is_file()] == [sha]


async def test_missing_bytes_read_as_none(tmp_path: Path) -> None:
    assert await MediaStore(tmp_path).read("0" * 64) is None


async def test_over_the_limit_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media", max_bytes=10)
    with pytest.raises(MediaTooLargeError):
        await store.put(b"x" * 11)
    assert not (tmp_path / "media").exists()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("../../etc/passwd", id="traversal"),
        pytest.param("A" * 64, id="upper-case"),
        pytest.param("abc", id="short"),
    ],
)
def test_only_a_hash_names_a_file(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        MediaStore(tmp_path).path_of(name)


async def test_prune_removes_only_old_files(tmp_path: Path) -> None:
    store = MediaStore(tmp_path)
    old = await store.put(b"old")
    new = await store.put(b"new")
    past = time.time() - 3600
    os.utime(store.path_of(old), (past, past))
    assert await store.prune(older_than=60) == 1
    assert await store.read(old) is None
    assert await store.read(new) == b"new"
