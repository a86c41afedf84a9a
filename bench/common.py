"""Shared pieces of the benchmarks: machine facts, tables, result files, commit counting."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bot.core.messages import Message
from bot.core.models.base import ModelResponse, ToolSpec
from bot.core.stores.sqlite import SQLiteSessionStore

__all__ = [
    "BENCH_DIR",
    "RESULTS_DIR",
    "ROOT",
    "CommitCounter",
    "InstantModel",
    "bench_tmpdir",
    "fmt_num",
    "machine_info",
    "percentile",
    "print_table",
    "read_result",
    "write_result",
]

BENCH_DIR = Path(__file__).resolve().parent
"""The ``bench/`` folder."""
ROOT = BENCH_DIR.parent
"""The project root."""
RESULTS_DIR = BENCH_DIR / "results"
"""Where ``<name>.json`` results go (git-ignored)."""


# -- machine ------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem(path: Path) -> dict[str, str]:
    """Device, type and size of the filesystem holding ``path`` (``df -h`` and /proc/mounts)."""
    info: dict[str, str] = {"path": str(path)}
    try:
        out = subprocess.run(
            ["df", "-h", str(path)], capture_output=True, text=True, check=True, timeout=10
        ).stdout.splitlines()
        if len(out) >= 2:
            fields = out[1].split()
            info.update(device=fields[0], size=fields[1], used=fields[2], avail=fields[3])
            info["df"] = out[1]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        real = os.path.realpath(path)
        best = ""
        with open("/proc/mounts", encoding="utf-8") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1]
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best = mount
                    info["mount"] = mount
                    info["fstype"] = parts[2]
    except OSError:
        pass
    return info


def machine_info(data_dir: Path | None = None) -> dict[str, Any]:
    """Facts about the machine a figure came from."""
    return {
        "nproc": os.cpu_count(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "disk": _filesystem(data_dir or _tmp_root()),
    }


# -- files --------------------------------------------------------------------------


def _tmp_root() -> Path:
    """Where benchmark databases live: ``BENCH_TMPDIR`` or ``bench/results`` (a real disk)."""
    root = Path(os.environ.get("BENCH_TMPDIR") or RESULTS_DIR)
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.contextmanager
def bench_tmpdir(name: str) -> Iterator[Path]:
    """A fresh directory for one benchmark's databases, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=f"tmp-{name}-", dir=_tmp_root()))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def extract_revision(rev: str, directory: Path) -> tuple[Path, str] | None:
    """``bot/`` and ``bench/`` of commit ``rev`` of this repository, extracted under
    ``directory`` (``git archive``): a baseline to run side by side with this tree.
    Returns the tree and the commit's short hash, or ``None`` without git or ``rev``."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", f"{rev}^{{commit}}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.strip()
        archive = directory / f"{commit}.tar"
        with archive.open("wb") as out:
            subprocess.run(
                ["git", "archive", commit, "bot", "bench"],
                cwd=ROOT,
                stdout=out,
                timeout=120,
                check=True,
            )
        tree = directory / commit
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        archive.unlink()
    except (OSError, subprocess.SubprocessError, tarfile.TarError):
        return None
    return tree, commit


def write_result(name: str, payload: dict[str, Any], *, data_dir: Path | None = None) -> Path:
    """Write ``results/<name>.json`` with the machine facts and a timestamp."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    document = {
        "benchmark": name,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine_info(data_dir),
        **payload,
    }
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    print(f"-> {path.relative_to(ROOT)}")
    return path


def read_result(name: str) -> dict[str, Any] | None:
    """The last ``results/<name>.json``, or ``None``."""
    path = RESULTS_DIR / f"{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# -- numbers and tables -------------------------------------------------------------


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (nearest rank) of ``values``; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def median(values: Sequence[float]) -> float:
    """The median of ``values``; NaN when empty."""
    return statistics.median(values) if values else float("nan")


def fmt_num(value: float | int | str | None, digits: int = 0) -> str:
    """A number with thousands separators (strings pass through, ``None`` is ``-``)."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if value != value:  # NaN
        return "n/a"
    return f"{value:,.{digits}f}"


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print an aligned text table (first column left-aligned, the rest right-aligned)."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        parts = [
            row[i].ljust(widths[i]) if i == 0 else row[i].rjust(widths[i]) for i in range(len(row))
        ]
        return "  ".join(parts).rstrip()

    print()
    print(title)
    print("=" * len(title))
    print(line(cells[0]))
    print("  ".join("-" * w for w in widths))
    for row in cells[1:]:
        print(line(row))
    print()
    sys.stdout.flush()


# -- the instant model --------------------------------------------------------------


class InstantModel:
    """A ``ChatModel`` that answers at once with a fixed text: the LLM's cost taken out."""

    def __init__(self, reply: str = "Sure, done.") -> None:
        self.reply = reply
        self.calls = 0

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        """Return the fixed reply without awaiting anything."""
        self.calls += 1
        return ModelResponse(content=self.reply)


# -- commit counting ----------------------------------------------------------------

# First statement of a transaction -> what it is (the store and gateway's own SQL).
_LABELS: tuple[tuple[str, str], ...] = (
    ("chatflow_processed_messages", "accept (tx 1)"),
    ("SELECT active_agent_name, metadata_json, created_at", "load session"),
    ("SELECT created_at FROM chatflow_sessions", "turn commit (tx 2)"),
    ("SET state = 'attempting'", "mark attempting"),
    ("SELECT platform FROM chatflow_delivery_obligations", "mark delivered"),
    ("WHERE state = 'failed'", "retry poll"),
)


def _label(sql: str) -> str:
    for needle, label in _LABELS:
        if needle in sql:
            return label
    return "other"


class CommitCounter:
    """Counts the transactions of one store's SQLite connection, from SQLite's own trace.

    ``sqlite3``'s trace callback sees every statement the connection runs, the
    ``BEGIN``/``COMMIT`` the store issues included. A transaction is
    labelled by its first statement, and counted as *writing* when
    ``total_changes`` moved between its ``BEGIN`` and its ``COMMIT`` (a commit
    that changed no row appends nothing to the WAL). The time from ``BEGIN`` to
    ``COMMIT`` is summed per label: how long each kind of transaction holds the
    store's one connection (the commit's own disk write not included).
    """

    def __init__(self, *, light: bool = False) -> None:
        self.light = light
        """Count only COMMITs and hops, from the store's own counters: no trace callback
        and no wrapper on the hop (both cost the measured process CPU of their own)."""
        self._store: SQLiteSessionStore | None = None
        self._base = (0, 0)
        self._raw: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self._in_tx = False
        self._changes_at_begin = 0
        self._label: str | None = None
        self._began_at = 0.0
        self.commits = 0
        """``COMMIT`` statements run."""
        self.write_commits = 0
        """Commits of transactions that changed at least one row."""
        self.rollbacks = 0
        """``ROLLBACK`` statements run."""
        self.statements = 0
        """Every statement run, ``BEGIN``/``COMMIT`` included (each row of an executemany)."""
        self.round_trips = 0
        """Calls handed to the database thread (one hop each)."""
        self.by_label: Counter[str] = Counter()
        """Commits by what the transaction was."""
        self.writes_by_label: Counter[str] = Counter()
        """Writing commits by what the transaction was."""
        self.held_by_label: dict[str, float] = {}
        """Seconds from ``BEGIN`` to ``COMMIT`` (the connection held), by transaction."""

    async def attach(self, store: SQLiteSessionStore) -> None:
        """Install the trace callback on ``store``'s connection (opens the store)."""
        await store.open()
        conn = store._conn
        if conn is None:
            raise RuntimeError("the store has no connection")
        self._store = store
        if self.light:
            self._base = (conn.commits, conn.hops)
            return
        raw = getattr(conn, "_conn", None)
        if not isinstance(raw, sqlite3.Connection):
            raise RuntimeError("cannot reach the sqlite3 connection of the store")
        self._raw = raw
        await conn.set_trace_callback(self._trace)
        # Every call into the database thread (a batch, a statement of an interactive
        # transaction) is one queue hop through _execute; count them on this instance.
        forward: Callable[..., Awaitable[Any]] = conn._execute

        async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
            self.round_trips += 1
            return await forward(fn, *args, **kwargs)

        conn._execute = counted  # type: ignore[method-assign,assignment]

    def reset(self) -> None:
        """Zero the counters (between warm-up and measurement)."""
        with self._lock:
            self.commits = self.write_commits = self.rollbacks = self.statements = 0
            self.round_trips = 0
            self.by_label.clear()
            self.writes_by_label.clear()
            self.held_by_label.clear()
        conn = None if self._store is None else self._store._conn
        if self.light and conn is not None:
            self._base = (conn.commits, conn.hops)

    def snapshot(self) -> dict[str, Any]:
        """The counters as a dict."""
        conn = None if self._store is None else self._store._conn
        if self.light and conn is not None:
            with self._lock:
                self.commits = conn.commits - self._base[0]
                self.round_trips = conn.hops - self._base[1]
        with self._lock:
            return {
                "commits": self.commits,
                "write_commits": self.write_commits,
                "rollbacks": self.rollbacks,
                "statements": self.statements,
                "round_trips": self.round_trips,
                "by_label": dict(self.by_label),
                "writes_by_label": dict(self.writes_by_label),
                "held_by_label": dict(self.held_by_label),
            }

    def _trace(self, sql: str) -> None:
        # Runs on the database thread, inside the statement's execution.
        raw = self._raw
        assert raw is not None
        head = sql.lstrip()[:16].upper()
        with self._lock:
            self.statements += 1
            if head.startswith("BEGIN"):
                self._in_tx = True
                self._began_at = time.perf_counter()
                self._changes_at_begin = raw.total_changes
                self._label = None
                return
            if head.startswith("COMMIT") or head.startswith("END"):
                label = self._label or "empty"
                self.commits += 1
                self.by_label[label] += 1
                held = time.perf_counter() - self._began_at
                self.held_by_label[label] = self.held_by_label.get(label, 0.0) + held
                if raw.total_changes != self._changes_at_begin:
                    self.write_commits += 1
                    self.writes_by_label[label] += 1
                self._in_tx = False
                return
            if head.startswith("ROLLBACK"):
                self.rollbacks += 1
                self._in_tx = False
                return
            # A group commit opens each body with a SAVEPOINT: label by the first body's SQL.
            if (
                self._in_tx
                and self._label is None
                and not head.startswith(("SAVEPOINT", "RELEASE"))
            ):
                self._label = _label(sql)
