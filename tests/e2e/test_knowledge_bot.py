"""The knowledge base end to end: ``python -m bot knowledge ...`` and ``python -m bot run``.

On SQLite and on PostgreSQL (``scripts/with-postgres.sh``): an operator adds a
folder (one file too large: named, the rest added, exit 1), lists and searches
it; then the running bot's scripted fake model calls ``search_knowledge`` and
its answer cites the file the passage came from. And an ingestion SIGKILLed
mid-way (blocked on a named pipe standing in for a file that reads slowly, so
the kill lands at a known point), then run again, ends with every passage once.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tests.e2e.botprocess import ROOT, BotProcess
from tests.e2e.test_telegram_bot import update
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, RecordedRequest
from tests.fakes.telegram_server import FakeTelegramServer
from tests.pgtest import fresh_schema

pytestmark = pytest.mark.e2e

QUESTION = "How long do refunds take to come back?"


def answer(record: RecordedRequest) -> FakeResponse:
    """A model that looks the question up, then answers from the best passage, citing it."""
    last = record.messages[-1]
    if last["role"] != "tool":
        return FakeOpenAIServer.call("search_knowledge", query=str(last["content"]), limit=2)
    best = json.loads(last["content"])["passages"][0]
    return FakeOpenAIServer.reply(f"{best['text'].split('.')[0]}. (source: {best['source']})")


@pytest.fixture(params=["sqlite", "postgres"])
async def database(request: pytest.FixtureRequest) -> AsyncIterator[dict[str, str]]:
    """The bot's database settings: its own SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield {}
        return
    async with fresh_schema() as dsn:
        yield {"DATABASE_URL": dsn}


@pytest.fixture
async def openai() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(responder=answer) as server:
        yield server


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


@pytest.fixture
async def bot(
    tmp_path: Path,
    database: dict[str, str],
    telegram: FakeTelegramServer,
    openai: FakeOpenAIServer,
) -> AsyncIterator[BotProcess]:
    made = BotProcess(
        tmp_path / "data",
        {
            "TELEGRAM_BOT_TOKEN": telegram.token,
            "TELEGRAM_API_BASE_URL": telegram.base_url,
            "OPENAI_API_KEY": openai.api_key,
            "OPENAI_BASE_URL": openai.base_url,
            "DEFAULT_MODEL": "gpt-test",
            "MAX_KNOWLEDGE_FILE_BYTES": "4000",
            **database,
        },
    )
    yield made
    await made.kill()


async def test_added_documents_are_searched_and_the_models_answer_cites_the_file(
    bot: BotProcess, telegram: FakeTelegramServer, openai: FakeOpenAIServer, tmp_path: Path
) -> None:
    folder = tmp_path / "knowledge"
    shutil.copytree(ROOT / "agents" / "knowledge", folder)
    (folder / "catalogue.md").write_text("# Catalogue\n\n" + "mug " * 2000)

    code, out, err = await bot.command("knowledge", "add", str(folder))
    assert code == 1, err
    assert "failed: catalogue.md: larger than MAX_KNOWLEDGE_FILE_BYTES (4000 bytes)" in err
    assert "added returns.md (3 passages)" in out
    assert out.splitlines()[-1] == (
        "knowledge: 3 added, 0 replaced, 0 unchanged, 1 failed (8 passages written)"
    )
    code, out, _ = await bot.command("knowledge", "list")
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["opening-hours.md", "2"],
        ["returns.md", "3"],
        ["shipping.md", "3"],
    ]
    code, out, _ = await bot.command("knowledge", "search", "refund payment", "--json")
    first = json.loads(out.splitlines()[0])
    assert (first["source"], first["heading"]) == ("returns.md", "Returns and refunds › Refunds")
    assert set(first) >= {"source", "heading", "score", "text"}

    await bot.start()
    telegram.push_update(update("private_text", 1, text=QUESTION))
    (reply,) = await telegram.wait_for_sent(1, within=30)
    assert reply.text.endswith("(source: returns.md)")
    assert "5 business days" in reply.text
    tool_result = openai.chat_requests[-1].messages[-1]
    assert tool_result["role"] == "tool" and '"source": "returns.md"' in tool_result["content"]
    log = "\n".join(bot.log)
    assert "refunds" not in log.lower() and "business days" not in log

    code, out, _ = await bot.command("knowledge", "remove", "returns.md")
    assert (code, out.strip()) == (0, "removed returns.md (3 passages)")
    code, _, err = await bot.command("knowledge", "remove", "returns.md")
    assert (code, err.strip()) == (1, "chatflow: knowledge: no source returns.md")


async def _chunk_counts(bot: BotProcess) -> dict[str, int]:
    """Passages per source, read from the database itself (and the full-text index checked)."""
    dsn = bot.env.get("DATABASE_URL")
    sql = "SELECT source, count(*) FROM chatflow_knowledge_chunks GROUP BY source"
    if dsn is None:
        conn = sqlite3.connect(bot.data_dir / "chatflow.db")
        try:
            rows = conn.execute(sql).fetchall()
            # FTS5 checks that its index holds exactly the chunks table's rows.
            conn.execute(
                "INSERT INTO chatflow_knowledge_fts (chatflow_knowledge_fts) "
                "VALUES ('integrity-check')"
            )
        finally:
            conn.close()
        return {str(s): int(n) for s, n in rows}
    pg = await asyncpg.connect(dsn)
    try:
        return {str(s): int(n) for s, n in await pg.fetch(sql)}
    finally:
        await pg.close()


async def test_an_ingestion_killed_mid_way_and_run_again_has_every_passage_once(
    bot: BotProcess, tmp_path: Path
) -> None:
    folder = tmp_path / "many"
    folder.mkdir()
    for n in range(24):
        body = "\n\n".join(f"Paragraph {p} of file {n}: " + "words " * 120 for p in range(3))
        (folder / f"{'a' if n < 12 else 'z'}{n:03}.md").write_text(f"# File {n}\n\n{body}")
    # Sorted between the a-files and the z-files: the ingestion blocks on opening it.
    pipe = folder / "m-slow.md"
    os.mkfifo(pipe)

    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "knowledge",
        "add",
        str(folder),
        cwd=tmp_path,
        env=bot.env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        # Opening the pipe for writing returns once the ingestion opened it for reading:
        # every a-file is committed by then, none of the z-files is started.
        writer = await asyncio.wait_for(asyncio.to_thread(os.open, pipe, os.O_WRONLY), 60)
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)
        os.close(writer)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stdout is not None
    said = (await proc.stdout.read()).decode().splitlines()
    assert [line.split()[1] for line in said] == [f"a{n:03}.md" for n in range(12)]
    before = await _chunk_counts(bot)
    assert sorted(before) == [f"a{n:03}.md" for n in range(12)]

    pipe.unlink()
    pipe.write_text("# Slow\n\nIt reads at last.")
    code, out, err = await bot.command("knowledge", "add", str(folder))

    assert code == 0, err
    assert out.splitlines()[-1].startswith("knowledge: 13 added, 0 replaced, 12 unchanged")
    after = await _chunk_counts(bot)
    every = before["a000.md"]  # the files are alike: each has as many passages
    assert after == {**before, **{f"z{n:03}.md": every for n in range(12, 24)}, "m-slow.md": 1}
