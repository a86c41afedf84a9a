"""The knowledge base in-process: passages, ingestion (skip, replace, bounds), search, the tool.

Runs on SQLite and on PostgreSQL (``scripts/with-postgres.sh``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import sqlite3
import tempfile
import threading
import types
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.core.documents import DocumentReader
from bot.core.knowledge import ingest as ingest_module
from bot.core.knowledge.index import fulltext_search, list_sources, query_terms, remove_source
from bot.core.knowledge.ingest import FileOutcome, Ingestion
from bot.core.knowledge.service import KNOWLEDGE, KnowledgeBase, KnowledgeSettings
from bot.core.knowledge.text import MAX_CHARS, html_to_text, split_passages
from bot.core.knowledge.vectors import VECTORS, Embedder
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.tools import ToolContext
from bot.errors import ModelError
from bot.knowledge_tools import search_knowledge
from tests.fakes.media_files import encrypted_pdf, pdf_bytes
from tests.pgtest import fresh_schema

RETURNS = """# Returns

## How to return an item

You can return any item within 30 days of delivery, unused and in its box.

## Refunds

Refunds reach the original payment method within 5 business days.
"""
HOURS = "Opening hours\n\nThe shop opens Monday to Friday from 09:00 to 18:00.\n"


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[TransactionalStore]:
    async with AsyncExitStack() as stack:
        made: TransactionalStore
        if request.param == "postgres":
            from bot.core.stores.postgres import PostgresSessionStore

            made = PostgresSessionStore(await stack.enter_async_context(fresh_schema()))
        else:
            made = SQLiteSessionStore(tmp_path / "chatflow.db")
        await made.open()
        yield made
        await made.close()


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "policies").mkdir(parents=True)
    (root / "policies" / "returns.md").write_text(RETURNS)
    (root / "hours.txt").write_text(HOURS)
    (root / "about.html").write_text(
        "<html><head><title>x</title><script>var secret = 1;</script></head><body>"
        "<h1>About us</h1><p>We sell <b>handmade</b> ceramic mugs since 1998.</p></body></html>"
    )
    (root / "notes.bin").write_bytes(b"\x00\x01")  # not a type the base reads: left alone
    (root / ".hidden.md").write_text("# Hidden\n\nnever added")
    return root


async def _add(base: KnowledgeBase, *paths: Path, **kwargs: int) -> list[FileOutcome]:
    return await Ingestion(base, **kwargs).add(list(paths))  # type: ignore[arg-type]


# -- passages ------------------------------------------------------------------------------


def test_markdown_is_cut_at_headings_and_each_passage_knows_its_headings() -> None:
    passages = split_passages(RETURNS)

    assert [p.heading for p in passages] == ["Returns › How to return an item", "Returns › Refunds"]
    assert passages[1].text == "Refunds reach the original payment method within 5 business days."


def test_a_heading_inside_a_code_fence_is_text() -> None:
    passages = split_passages("# Setup\n\n```\n# not a heading\n```\n")

    assert [p.heading for p in passages] == ["Setup"]
    assert "# not a heading" in passages[0].text


def test_html_keeps_headings_and_text_and_drops_scripts() -> None:
    text = html_to_text("<h2>Delivery</h2><script>alert(1)</script><p>Fast &amp; free</p>")

    assert text == "## Delivery\n\nFast & free"
    # A heading wrapped over lines in the HTML is still one heading (man pages' <h1>).
    wrapped = split_passages(
        html_to_text("<h1>\ngit-stash(1)\nManual Page</h1><h2>NAME</h2><p>x</p>")
    )
    assert [p.heading for p in wrapped] == ["git-stash(1) Manual Page › NAME"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abcdefgh .\n", min_size=0, max_size=400), max_size=12))
def test_passages_keep_every_word_in_order_and_none_is_too_long(paragraphs: list[str]) -> None:
    text = "\n\n".join(paragraphs)
    passages = split_passages(text)

    assert all(0 < len(p.text) <= MAX_CHARS for p in passages)
    assert " ".join(p.text for p in passages).split() == text.split()


def test_query_terms_drop_function_words_unless_nothing_else_is_left() -> None:
    assert query_terms("What is the refund policy?") == ["refund", "policy"]
    assert query_terms("what is it") == ["what", "is", "it"]
    assert query_terms('a "quoted" OR NEAR(x) *') == ["quoted", "near", "x"]


# -- ingestion and search ---------------------------------------------------------------------


async def test_a_folder_is_added_by_relative_names_and_searched(
    store: TransactionalStore, folder: Path
) -> None:
    base = KnowledgeBase(store)
    outcomes = await _add(base, folder)

    assert {(o.source, o.status) for o in outcomes} == {
        ("about.html", "added"),
        ("hours.txt", "added"),
        ("policies/returns.md", "added"),
    }
    assert [(s.source, s.chunk_count) for s in await list_sources(store)] == [
        ("about.html", 1),
        ("hours.txt", 1),
        ("policies/returns.md", 2),
    ]
    hits = await base.search("how long do refunds take to reach my payment method?", 3)
    assert (hits[0].source, hits[0].heading) == ("policies/returns.md", "Returns › Refunds")
    assert hits[0].score > 0
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    about = await base.search("ceramic mugs", 1)
    assert about[0].source == "about.html" and "secret" not in about[0].text
    assert await base.search("quantum chromodynamics", 5) == []


async def test_unchanged_files_are_skipped_and_a_changed_one_replaced(
    store: TransactionalStore, folder: Path
) -> None:
    base = KnowledgeBase(store)
    await _add(base, folder)
    (folder / "hours.txt").write_text("Opening hours\n\nNow open on Sundays from 10:00.\n")

    outcomes = {o.source: o.status for o in await _add(base, folder)}

    assert outcomes == {
        "about.html": "unchanged",
        "hours.txt": "replaced",
        "policies/returns.md": "unchanged",
    }
    assert (await base.search("sundays", 5))[0].source == "hours.txt"
    assert await base.search("Friday", 5) == []  # the old text is gone from the index
    assert await remove_source(store, "hours.txt") == 1
    assert await remove_source(store, "hours.txt") is None
    assert await base.search("sundays", 5) == []


async def test_files_are_read_and_hashed_off_the_event_loop(
    store: TransactionalStore, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    hashed_on: list[int] = []
    real_sha256 = hashlib.sha256

    def sha256(data: bytes = b"") -> Any:
        hashed_on.append(threading.get_ident())
        return real_sha256(data)

    monkeypatch.setattr(ingest_module, "hashlib", types.SimpleNamespace(sha256=sha256))
    outcomes = await _add(KnowledgeBase(store), folder)

    assert [o.status for o in outcomes] == ["added"] * 3
    assert len(hashed_on) == 3 and loop_thread not in hashed_on


async def test_a_file_given_by_itself_goes_under_its_name(
    store: TransactionalStore, folder: Path
) -> None:
    outcomes = await _add(KnowledgeBase(store), folder / "policies" / "returns.md")

    assert [(o.source, o.status, o.chunks) for o in outcomes] == [("returns.md", "added", 2)]


async def test_each_bad_file_is_one_failure_and_the_rest_is_added(
    store: TransactionalStore, tmp_path: Path
) -> None:
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "big.md").write_text("x " * 600)
    (root / "latin1.txt").write_bytes("caf\xe9 ouvert".encode("latin-1"))
    (root / "empty.md").write_text("   \n")
    (root / "locked.pdf").write_bytes(encrypted_pdf())
    (root / "fake.pdf").write_text("not a pdf at all")
    (root / "good.pdf").write_bytes(pdf_bytes("Warranty: two years on every mug."))
    (root / "ok.md").write_text("# Ok\n\nfine")
    base = KnowledgeBase(store)

    outcomes = await _add(base, root, tmp_path / "missing", max_file_bytes=1000)

    failed = {o.source: o.reason for o in outcomes if o.status == "failed"}
    assert set(failed) == {
        "big.md",
        "latin1.txt",
        "empty.md",
        "locked.pdf",
        "fake.pdf",
        str(tmp_path / "missing"),
    }
    assert "MAX_KNOWLEDGE_FILE_BYTES" in failed["big.md"]
    assert "UTF-8" in failed["latin1.txt"]
    assert "password" in failed["locked.pdf"]
    assert [s.source for s in await list_sources(store)] == ["good.pdf", "ok.md"]
    assert (await base.search("warranty", 1))[0].source == "good.pdf"


async def test_nothing_of_a_passage_or_query_is_logged_at_info(
    store: TransactionalStore, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    base = KnowledgeBase(store)
    await _add(base, folder)
    await base.search("zebra crossing refunds", 5)
    await search_knowledge.invoke(ToolContext("s1", store=store), {"query": "zebra mugs"})

    loud = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    for secret in ("zebra", "refund", "handmade", "Monday", "30 days", "returns.md"):
        assert secret.lower() not in loud.lower()


async def test_the_tool_returns_passages_with_their_source(
    store: TransactionalStore, folder: Path
) -> None:
    await _add(KnowledgeBase(store), folder)
    ctx = ToolContext("s1", store=store, services={KNOWLEDGE: KnowledgeSettings()})

    answer = json.loads(await search_knowledge.invoke(ctx, {"query": "refunds", "limit": 1}))

    (passage,) = answer["passages"]
    assert passage["source"] == "policies/returns.md"
    assert set(passage) == {"source", "heading", "score", "text"}
    nothing = json.loads(await search_knowledge.invoke(ctx, {"query": "quantum"}))
    assert nothing["passages"] == []
    too_many = json.loads(await search_knowledge.invoke(ctx, {"query": "x", "limit": 50}))
    assert "limit" in too_many["error"]


async def test_the_tool_without_a_sql_store_says_so() -> None:
    answer = json.loads(await search_knowledge.invoke(ToolContext("s1"), {"query": "refunds"}))

    assert "SQL database" in answer["error"]


async def test_a_slow_pdf_fails_alone(store: TransactionalStore, tmp_path: Path) -> None:
    from tests.fakes.media_files import hostile_pdf

    root = tmp_path / "pdfs"
    root.mkdir()
    (root / "slow.pdf").write_bytes(hostile_pdf(pages=20))
    (root / "fine.md").write_text("fine text")
    base = KnowledgeBase(store)

    outcomes = await Ingestion(base, reader=DocumentReader(timeout=0.5)).add([root])

    assert [(o.source, o.status) for o in outcomes] == [
        ("fine.md", "added"),
        ("slow.pdf", "failed"),
    ]
    assert "took too long" in outcomes[1].reason


# -- embeddings ----------------------------------------------------------------------------------


def _fake_vector(text: str) -> list[float]:
    """A deterministic 8-wide bag of letters: texts sharing words lie near each other."""
    vector = [0.0] * 8
    for word in re.findall(r"\w+", text.lower()):
        vector[sum(map(ord, word)) % 8] += 1.0
    return [v + 0.01 for v in vector]


def _embeddings_route(router: respx.MockRouter, calls: list[list[str]]) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        calls.append(body["input"])
        assert request.headers["authorization"] == "Bearer k"
        pairs = reversed(list(enumerate(body["input"])))  # out of order: sorted by index
        data = [{"index": i, "embedding": _fake_vector(t)} for i, t in pairs]
        return httpx.Response(200, json={"data": data, "model": body["model"]})

    router.post("http://embed.test/v1/embeddings").mock(side_effect=answer)


async def test_the_embedder_batches_orders_and_checks_what_it_is_answered() -> None:
    calls: list[list[str]] = []
    with respx.mock(assert_all_called=True) as router:
        _embeddings_route(router, calls)
        embedder = Embedder("m", "http://embed.test/v1", api_key="k")
        vectors = await embedder.embed([f"text {n}" for n in range(70)])
    assert [len(batch) for batch in calls] == [64, 6]
    assert vectors[3] == _fake_vector("text 3")

    with respx.mock() as router:
        router.post("http://embed.test/v1/embeddings").mock(
            return_value=httpx.Response(200, json={"data": []})
        )
        with pytest.raises(ModelError, match="unexpected shape"):
            await Embedder("m", "http://embed.test/v1").embed(["a"])
        router.post("http://embed.test/v1/embeddings").mock(return_value=httpx.Response(503))
        with pytest.raises(ModelError, match="503"):
            await Embedder("m", "http://embed.test/v1").embed(["a"])


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, text="<html>a proxy's page</html>"),
        httpx.Response(200, json={"data": ["not an object"]}),
        httpx.Response(200, json={"data": [{"index": 0, "embedding": ["x"]}]}),
    ],
)
async def test_an_embeddings_answer_that_is_not_json_vectors_is_a_model_error(
    answer: httpx.Response,
) -> None:
    with respx.mock() as router:
        router.post("http://embed.test/v1/embeddings").mock(return_value=answer)
        with pytest.raises(ModelError, match="unexpected shape"):
            await Embedder("m", "http://embed.test/v1").embed(["a"])


async def test_with_an_embedding_model_the_search_is_hybrid_or_says_why_not(
    store: TransactionalStore, folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[list[str]] = []
    with respx.mock(assert_all_called=False) as router:
        _embeddings_route(router, calls)
        base = KnowledgeBase(store, Embedder("m", "http://embed.test/v1", api_key="k"))
        outcomes = await _add(base, folder)
        hits = await base.search("refunds payment method", 2)
    assert all(o.status == "added" for o in outcomes)
    assert hits[0].source == "policies/returns.md"
    if base.vectors_unavailable is None:
        # Every passage embedded when added, and the query when searched; fused scores.
        assert sum(len(c) for c in calls) == 4 + 1
        assert 0 < hits[0].score <= 2 / 61
    else:
        # This database cannot hold vectors (no pgvector, or a sqlite3 that cannot load
        # extensions): full text, said once as a warning, and nothing sent to embed.
        assert calls == []
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "full-text search only" in warnings[0].getMessage()


async def test_hybrid_ranking_fuses_both_lists_by_reciprocal_rank(
    store: TransactionalStore, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fusion itself, with the vector extension's answer given: a passage in both lists
    beats one that only the text ranks first."""
    await _add(KnowledgeBase(store), folder)
    returns = await fulltext_search(store, "refunds", 1)
    asked: list[list[float]] = []

    async def nearest(_store: object, vector: list[float], limit: int) -> list[int]:
        asked.append(vector)
        return [returns[0].chunk_id][:limit]

    async def enabled(_store: object) -> None:
        return None

    monkeypatch.setattr("bot.core.knowledge.service.nearest_chunks", nearest)
    monkeypatch.setattr("bot.core.knowledge.service.enable_vectors", enabled)
    calls: list[list[str]] = []
    with respx.mock() as router:
        _embeddings_route(router, calls)
        base = KnowledgeBase(store, Embedder("m", "http://embed.test/v1", api_key="k"))
        hits = await base.search("opening hours refunds", 3)
    assert calls == [["opening hours refunds"]] and asked == [_fake_vector("opening hours refunds")]
    # Text alone ranks them (hours, returns) or (returns, hours); the vectors find only
    # returns: it is first in one list and at worst second in the other.
    assert hits[0].chunk_id == returns[0].chunk_id
    assert hits[0].score == pytest.approx(1 / 61 + 1 / 61) or hits[0].score == pytest.approx(
        1 / 61 + 1 / 62
    )
    assert {h.source for h in hits[:2]} == {"policies/returns.md", "hours.txt"}


@pytest.mark.skipif(
    not hasattr(sqlite3.Connection, "enable_load_extension"),
    reason="this Python's sqlite3 cannot load extensions, so sqlite-vec cannot be used",
)
async def test_sqlite_vec_holds_one_vector_per_passage_through_replace_and_remove(
    tmp_path: Path, folder: Path
) -> None:
    store = SQLiteSessionStore(tmp_path / "vectors.db")
    await store.open()

    async def vectors() -> int:
        async with store.transaction() as tx:
            row = await tx.fetchone(f"SELECT count(*) FROM {VECTORS}")
        return int(row[0]) if row else -1

    try:
        with respx.mock(assert_all_called=False) as router:
            _embeddings_route(router, [])
            base = KnowledgeBase(store, Embedder("m", "http://embed.test/v1", api_key="k"))
            await _add(base, folder)
            assert base.vectors_unavailable is None
            assert await vectors() == 4
            hits = await base.search("refunds payment method", 2)
            assert hits[0].source == "policies/returns.md"
            (folder / "hours.txt").write_text("Hours\n\nOpen on Sundays.\n\nClosed on Mondays.")
            await _add(base, folder)
            assert await vectors() == 4  # the old passage's vector went with it
            assert await remove_source(store, "hours.txt", vectors=True) == 1
            assert await vectors() == 3
    finally:
        await store.close()


async def test_a_search_never_waits_for_another_process_writing(
    tmp_path: Path, folder: Path
) -> None:
    """An ingestion in another process holds the write lock for a whole file: searches of
    the running bot read beside it (a read transaction), they do not queue behind it."""
    store = SQLiteSessionStore(tmp_path / "shared.db")
    await store.open()
    other = sqlite3.connect(tmp_path / "shared.db", isolation_level=None)
    try:
        base = KnowledgeBase(store)
        await _add(base, folder)
        other.execute("BEGIN IMMEDIATE")
        other.execute("DELETE FROM chatflow_knowledge_chunks")  # not committed

        hits = await asyncio.wait_for(base.search("refunds", 1), 2)
        sources = await asyncio.wait_for(list_sources(store), 2)

        assert hits[0].source == "policies/returns.md"
        assert len(sources) == 3
    finally:
        other.execute("ROLLBACK")
        other.close()
        await store.close()


async def _crash_then_rerun(root: Path, crash_at: int, after_write: bool) -> None:
    from bot.core.knowledge.index import replace_source_in as real

    calls = 0

    async def crashing(tx: Transaction, *args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls - 1 == crash_at and not after_write:
            raise RuntimeError("killed")
        await real(tx, *args)
        if calls - 1 == crash_at:
            raise RuntimeError("killed")  # inside the file's transaction, its rows written

    store = SQLiteSessionStore(root / "chatflow.db")
    await store.open()
    try:
        base = KnowledgeBase(store)
        with pytest.MonkeyPatch.context() as patch, pytest.raises(RuntimeError, match="killed"):
            patch.setattr("bot.core.knowledge.ingest.replace_source_in", crashing)
            await Ingestion(base).add([root / "docs"])
        outcomes = await Ingestion(base).add([root / "docs"])
        assert [o.status for o in outcomes] == ["unchanged"] * crash_at + ["added"] * (6 - crash_at)
        async with store.transaction() as tx:
            rows = await tx.fetchall(
                "SELECT source, count(*), count(DISTINCT position), max(position) "
                "FROM chatflow_knowledge_chunks GROUP BY source ORDER BY source"
            )
            await tx.execute(
                "INSERT INTO chatflow_knowledge_fts (chatflow_knowledge_fts) "
                "VALUES ('integrity-check')"
            )
            fts = "chatflow_knowledge_fts"
            hits = await tx.fetchone(f"SELECT count(*) FROM {fts} WHERE {fts} MATCH 'unique'")
        assert [tuple(r) for r in rows] == [(f"f{n}.md", n + 1, n + 1, n) for n in range(6)]
        assert hits is not None and hits[0] == 21  # one "unique" per passage: 1 + 2 + ... + 6
    finally:
        await store.close()


@settings(max_examples=12, deadline=None)
@given(crash_at=st.integers(min_value=0, max_value=5), after_write=st.booleans())
def test_a_run_that_dies_inside_any_files_transaction_then_runs_again_has_each_passage_once(
    crash_at: int, after_write: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        for n in range(6):
            sections = "\n\n".join(f"## Part {p}\n\nunique text {n}-{p}" for p in range(n + 1))
            (root / "docs" / f"f{n}.md").write_text(f"# File {n}\n\n{sections}")
        asyncio.run(_crash_then_rerun(root, crash_at, after_write))
