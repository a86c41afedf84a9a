"""The assembly in ``bot.app``: what the HTTP health check reports."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from bot.app import Bot
from bot.config import Settings
from bot.core.agent import Agent
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.gateway import Gateway
from bot.testing import FakeAdapter, ScriptedModel


async def test_healthz_takes_no_write_lock(tmp_path: Path) -> None:
    path = tmp_path / "chatflow.db"
    store = SQLiteSessionStore(str(path))
    await store.open()
    gateway = Gateway(
        Runner(Agent(name="A", instructions=""), store, model=ScriptedModel()),
        store,
        [FakeAdapter()],
        Settings(data_dir=tmp_path),
        secret=b"k" * 32,
    )
    # Another writer (a CLI `ledger retry`, a turn commit) holds the write lock.
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        report = await asyncio.wait_for(Bot(Settings(data_dir=tmp_path))._health(gateway), 2)
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        await store.close()
    assert report["database"] == "ok"
    assert report["ready"] is False  # not started: recovery has not run
    assert report["ok"] is False


async def test_healthz_answers_within_a_second_when_the_database_is_silent(
    tmp_path: Path,
) -> None:
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    await store.open()
    gateway = Gateway(
        Runner(Agent(name="A", instructions=""), store, model=ScriptedModel()),
        store,
        [FakeAdapter()],
        Settings(data_dir=tmp_path),
        secret=b"k" * 32,
    )
    silent = asyncio.Event()

    async def never_answers() -> None:
        await silent.wait()  # a server that went silent: no error, no answer

    store.ping = never_answers  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        report = await asyncio.wait_for(Bot(Settings(data_dir=tmp_path))._health(gateway), 5)
    finally:
        silent.set()
        await store.close()
    assert loop.time() - started < 1.5
    assert report["ok"] is False  # /healthz answers 503
    assert str(report["database"]).startswith("error")
