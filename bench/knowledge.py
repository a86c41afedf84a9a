"""The knowledge base: retrieval quality, search latency at 50,000 passages, ingestion speed.

One run, side by side:

- **Quality.** The HTML pages of Debian's ``git-doc`` package (installed with
  apt-get when missing and run as root) are added through ``Ingestion``; each
  question of ``knowledge_questions.json`` is a hit when one of the 5 best
  passages comes from a page that answers it (recall@5). The default full-text
  mode, on SQLite and, with ``CHATFLOW_TEST_DATABASE_URL``, PostgreSQL. The
  paraphrased first wordings are reported apart.
- **Speed.** The corpus written again under other names up to 50,000 passages;
  every question asked through ``KnowledgeBase.search`` and, interleaved, as the
  same FTS5 query on a plain ``sqlite3`` connection to the same file (the floor):
  p95 of each and their ratio (target <= 2x).
- **Ingestion.** Passages per second of the first ``knowledge add`` of the corpus
  (read, parse, cut, one transaction per file).
- **Embeddings.** With a fake ``/embeddings`` server (in process): only the
  mechanics (requests, batch size, vectors per second of the client), and
  whether this machine's databases can hold vectors.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    ROOT,
    bench_tmpdir,
    fmt_num,
    percentile,
    print_table,
    read_result,
    write_result,
)
from bot.core.knowledge.index import query_terms, replace_source_in
from bot.core.knowledge.ingest import Ingestion
from bot.core.knowledge.schema import CHUNKS, FTS
from bot.core.knowledge.service import KnowledgeBase
from bot.core.knowledge.text import Passage
from bot.core.knowledge.vectors import Embedder, VectorsUnavailable, enable_vectors
from bot.core.sql import Transaction
from bot.core.stores.base import TransactionalStore
from bot.core.stores.sqlite import SQLiteSessionStore

CORPUS = Path("/usr/share/doc/git-doc")
QUESTIONS = ROOT / "bench" / "knowledge_questions.json"
SCALE = 50_000
ROUNDS = 5
LIMIT = 5


def corpus_files() -> list[Path]:
    """The corpus's HTML pages; apt-get installs ``git-doc`` first when missing (as root)."""
    if not CORPUS.is_dir() and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "install", "-y", "-qq", "git-doc"], env=env, check=False)
    return sorted(CORPUS.rglob("*.html"))


async def recall(base: KnowledgeBase, questions: list[dict[str, Any]]) -> dict[str, Any]:
    hits, misses = 0, []
    for item in questions:
        found = [hit.source for hit in await base.search(item["q"], LIMIT)]
        if any(source in item["sources"] for source in found):
            hits += 1
        else:
            misses.append({"q": item["q"], "found": found})
    return {
        "questions": len(questions),
        "hits": hits,
        "recall": hits / len(questions),
        "misses": misses,
    }


async def ingest(base: KnowledgeBase, files: list[Path]) -> dict[str, Any]:
    started = time.perf_counter()
    outcomes = await Ingestion(base).add(files)
    seconds = time.perf_counter() - started
    chunks = sum(o.chunks for o in outcomes)
    failed = [o.source for o in outcomes if o.status == "failed"]
    return {
        "files": len(files),
        "chunks": chunks,
        "failed": failed,
        "seconds": seconds,
        "chunks_per_s": chunks / seconds,
    }


async def passages_of(store: TransactionalStore) -> dict[str, list[Passage]]:
    async def body(tx: Transaction) -> dict[str, list[Passage]]:
        rows = await tx.fetchall(
            f"SELECT source, heading, text FROM {CHUNKS} ORDER BY source, position"
        )
        out: dict[str, list[Passage]] = {}
        for source, heading, text in rows:
            out.setdefault(source, []).append(Passage(heading, text))
        return out

    return await store.run(body, write=False)


async def grow(store: TransactionalStore, target: int) -> int:
    """Copies of the corpus under other names until ``target`` passages; the total."""
    corpus = await passages_of(store)
    total = sum(len(p) for p in corpus.values())
    copy = 0
    while total < target:
        copy += 1
        for source, passages in corpus.items():

            async def body(
                tx: Transaction, s: str = f"copy{copy}/{source}", p: list[Passage] = passages
            ) -> None:
                await replace_source_in(tx, s, "bench", p, time.time())

            await store.run(body)
            total += len(passages)
            if total >= target:
                break
    return total


def direct_query(conn: sqlite3.Connection, question: str) -> list[tuple[Any, ...]]:
    """The same FTS5 query ``fulltext_search`` runs, on a plain connection."""
    match = " OR ".join(f'"{term}"' for term in query_terms(question))
    return conn.execute(
        f"SELECT c.id, c.source, c.heading, c.text, f.rank FROM "
        f"(SELECT rowid, bm25({FTS}, 2.0, 1.0) AS rank FROM {FTS} "
        f"WHERE {FTS} MATCH ? ORDER BY rank LIMIT ?) f "
        f"JOIN {CHUNKS} c ON c.id = f.rowid ORDER BY f.rank, c.id",
        (match, LIMIT),
    ).fetchall()


async def latency(base: KnowledgeBase, path: Path, questions: list[str]) -> dict[str, Any]:
    conn = sqlite3.connect(path)
    ours: list[float] = []
    floor: list[float] = []
    try:
        for question in questions:  # warm both paths' caches
            await base.search(question, LIMIT)
            direct_query(conn, question)
        for _ in range(ROUNDS):
            for question in questions:
                started = time.perf_counter()
                await base.search(question, LIMIT)
                ours.append(time.perf_counter() - started)
                started = time.perf_counter()
                direct_query(conn, question)
                floor.append(time.perf_counter() - started)
    finally:
        conn.close()
    p95, floor_p95 = percentile(ours, 95) * 1000, percentile(floor, 95) * 1000
    return {
        "queries": len(ours),
        "p50_ms": percentile(ours, 50) * 1000,
        "p95_ms": p95,
        "fts5_direct_p50_ms": percentile(floor, 50) * 1000,
        "fts5_direct_p95_ms": floor_p95,
        "ratio_p95": p95 / floor_p95,
    }


async def pg_latency(dsn: str, questions: list[str]) -> dict[str, Any]:
    from bot.core.stores.postgres import PostgresSessionStore

    store = PostgresSessionStore(dsn)
    await store.open()
    try:
        base = KnowledgeBase(store)
        for question in questions:
            await base.search(question, LIMIT)
        times = []
        for _ in range(ROUNDS):
            for question in questions:
                started = time.perf_counter()
                await base.search(question, LIMIT)
                times.append(time.perf_counter() - started)
    finally:
        await store.close()
    return {"p50_ms": percentile(times, 50) * 1000, "p95_ms": percentile(times, 95) * 1000}


def fake_embeddings() -> tuple[httpx.MockTransport, dict[str, int]]:
    counts = {"requests": 0, "texts": 0, "largest_batch": 0}

    def answer(request: httpx.Request) -> httpx.Response:
        texts = json.loads(request.content)["input"]
        counts["requests"] += 1
        counts["texts"] += len(texts)
        counts["largest_batch"] = max(counts["largest_batch"], len(texts))
        data = [
            {"index": i, "embedding": [float(len(t) % 7), 1.0, 0.5] * 128}
            for i, t in enumerate(texts)
        ]
        return httpx.Response(200, json={"data": data})

    return httpx.MockTransport(answer), counts


async def embedding_mechanics(
    store: TransactionalStore, files: list[Path], tmp: Path
) -> dict[str, Any]:
    """The embedder against a fake server; where sqlite-vec loads, also the whole hybrid
    path (vectors written with their passages, hybrid search): speed only, fake vectors."""
    texts = [p.text for ps in (await passages_of(store)).values() for p in ps][:2000]
    transport, counts = fake_embeddings()
    embedder = Embedder("fake", "http://embeddings.invalid/v1", transport=transport)
    started = time.perf_counter()
    vectors = await embedder.embed(texts)
    seconds = time.perf_counter() - started
    result: dict[str, Any] = {
        **counts,
        "vectors": len(vectors),
        "width": len(vectors[0]),
        "client_vectors_per_s": len(vectors) / seconds,
    }
    hybrid_store = SQLiteSessionStore(tmp / "hybrid.db")
    await hybrid_store.open()
    try:
        try:
            await enable_vectors(hybrid_store)
        except VectorsUnavailable as exc:
            result["sqlite_vectors"] = f"unavailable: {exc}"
            return result
        result["sqlite_vectors"] = "available"
        base = KnowledgeBase(hybrid_store, embedder)
        result["hybrid_ingestion"] = await ingest(base, files)
        questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))["questions"]
        times = []
        for item in questions:
            started = time.perf_counter()
            await base.search(item["q"], LIMIT)
            times.append(time.perf_counter() - started)
        result["hybrid_search_p95_ms"] = percentile(times, 95) * 1000
    finally:
        await hybrid_store.close()
    return result


async def quality_pg(dsn: str, files: list[Path], questions: Any) -> dict[str, Any]:
    from bot.core.stores.postgres import PostgresSessionStore

    store = PostgresSessionStore(dsn)
    await store.open()
    try:
        base = KnowledgeBase(store)
        ingestion = await ingest(base, files)
        return {
            "ingestion": ingestion,
            "recall": await recall(base, questions["questions"]),
            "paraphrases": await recall(base, questions["paraphrases"]),
        }
    finally:
        await store.close()


async def main() -> None:
    files = corpus_files()
    if not files:
        print(f"skipped: no corpus at {CORPUS} (apt-get install git-doc)")
        return
    questions = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    asked = [item["q"] for item in questions["questions"] + questions["paraphrases"]]
    result: dict[str, Any] = {"corpus": questions["corpus"]}
    with bench_tmpdir("knowledge") as tmp:
        path = tmp / "chatflow.db"
        store = SQLiteSessionStore(path)
        await store.open()
        try:
            base = KnowledgeBase(store)
            result["sqlite"] = {
                "ingestion": await ingest(base, files),
                "recall": await recall(base, questions["questions"]),
                "paraphrases": await recall(base, questions["paraphrases"]),
            }
            result["embeddings"] = await embedding_mechanics(store, files, tmp)
            started = time.perf_counter()
            result["scale_chunks"] = await grow(store, SCALE)
            result["grow_seconds"] = time.perf_counter() - started
            result["latency"] = await latency(base, path, asked)
        finally:
            await store.close()
    dsn = os.environ.get("CHATFLOW_TEST_DATABASE_URL")
    if dsn:
        result["postgres"] = await quality_pg(dsn, files, questions)
    report(result)
    write_result("knowledge", result)


def report(result: dict[str, Any]) -> None:
    rows = []
    for name in ("sqlite", "postgres"):
        part = result.get(name)
        if part is None:
            continue
        found = part["recall"]
        rows.append(
            [
                name,
                f"{found['hits']}/{found['questions']} = {found['recall']:.2f}",
                f"{part['paraphrases']['hits']}/{part['paraphrases']['questions']}",
                fmt_num(part["ingestion"]["chunks"]),
                fmt_num(part["ingestion"]["chunks_per_s"]),
            ]
        )
    print_table(
        f"Knowledge base, full-text mode ({result['corpus']})",
        ["database", "recall@5", "paraphrases", "passages", "ingest passages/s"],
        rows,
    )
    lat = result["latency"]
    print_table(
        f"Search at {result['scale_chunks']:,} passages ({lat['queries']} queries, SQLite)",
        ["path", "p50 ms", "p95 ms"],
        [
            ["KnowledgeBase.search", f"{lat['p50_ms']:.2f}", f"{lat['p95_ms']:.2f}"],
            [
                "FTS5 directly (sqlite3)",
                f"{lat['fts5_direct_p50_ms']:.2f}",
                f"{lat['fts5_direct_p95_ms']:.2f}",
            ],
            ["ratio", "", f"{lat['ratio_p95']:.2f}x"],
        ],
    )
    emb = result["embeddings"]
    hybrid = emb.get("hybrid_ingestion")
    if hybrid is not None:
        print_table(
            "Hybrid path with sqlite-vec and fake vectors (speed only)",
            ["passages", "ingest passages/s (embedding included)", "search p95 ms"],
            [
                [
                    hybrid["chunks"],
                    fmt_num(hybrid["chunks_per_s"]),
                    f"{emb['hybrid_search_p95_ms']:.1f}",
                ]
            ],
        )
    print_table(
        "Embeddings, fake /embeddings server (mechanics only)",
        ["requests", "largest batch", "vectors", "client vectors/s", "vectors in SQLite here"],
        [
            [
                emb["requests"],
                emb["largest_batch"],
                emb["vectors"],
                fmt_num(emb["client_vectors_per_s"]),
                emb["sqlite_vectors"][:60],
            ]
        ],
    )


def targets() -> list[tuple[str, float | None, str, bool | None]]:
    """Issue 39's knowledge targets, judged on ``knowledge.json``."""
    result = read_result("knowledge") or {}
    recall_ = (result.get("sqlite") or {}).get("recall", {}).get("recall")
    ratio = (result.get("latency") or {}).get("ratio_p95")
    return [
        (
            "knowledge recall@5 >= 0.9, full text (git-doc)",
            recall_,
            "{:.2f}",
            None if recall_ is None else recall_ >= 0.9,
        ),
        (
            "knowledge search p95 at 50,000 passages <= 2x FTS5 directly",
            ratio,
            "{:.2f}x",
            None if ratio is None else ratio <= 2.0,
        ),
    ]


if __name__ == "__main__":
    asyncio.run(main())
