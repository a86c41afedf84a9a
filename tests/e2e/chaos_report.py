"""The chaos suite's figures in ``docs/RELIABILITY.md``, between two markers.

``make proof`` rewrites the rest of that file and keeps this block
(``tests.e2e.proof_report``); ``make chaos`` rewrites only the block.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "BEGIN",
    "END",
    "POOLER_BEGIN",
    "POOLER_END",
    "chaos_block",
    "write_figures",
    "write_pooler_figures",
]

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "RELIABILITY.md"
BEGIN = "<!-- chaos:begin (written by make chaos) -->"
END = "<!-- chaos:end -->"
POOLER_BEGIN = "<!-- chaos:pgbouncer:begin -->"
POOLER_END = "<!-- chaos:pgbouncer:end -->"


def chaos_block(text: str, begin: str = BEGIN, end: str = END) -> str | None:
    """The chaos block of a report (markers included), if it has one; ``begin`` and
    ``end`` name another block (the PgBouncer figures inside it)."""
    start, stop = text.find(begin), text.find(end)
    if start < 0 or stop < start:
        return None
    return text[start : stop + len(end)]


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def write_figures(table: str, *, seed: int, lease: float, path: Path = REPORT) -> None:
    """Put ``table`` (with how it was made) in the chaos block of ``path``."""
    block = "\n".join(
        [
            BEGIN,
            "",
            "## The database fails: outages, a frozen bot, a failover",
            "",
            "`make chaos` (`tests/e2e/test_chaos_pg.py`) runs a PostgreSQL primary with a",
            "synchronous streaming standby and three bots (`python -m bot run` against the",
            "fake WhatsApp Graph API), each reaching both servers through fault proxies of its",
            "own with `DATABASE_URL=...host1,host2/...?target_session_attrs=read-write`. Every",
            "fault strikes while messages are posted (like Meta: to any bot, again until one",
            "answers 200) and scheduled messages fall due; no bot is restarted. Columns: "
            "*lost*, messages",
            "accepted (200) with no reply; *unmarked dups*, copies beyond one without the",
            "recovery marker (per message and per job); *marked dups*, copies with it;",
            "*stranded*, inbox rows still `received` or ledger rows still owed at the end;",
            "*acked commits lost*, accepted messages missing from the journal; *heal to last",
            "reply*, from the end of the fault to the last reply; *jobs once*, scheduled",
            "messages delivered exactly once; *webhooks refused*, posts answered non-2xx (or",
            "not in time) during the phase, which the platform redelivers.",
            "The bar: 0 lost, 0 unmarked dups, 0 stranded, 0 acked commits lost, every job",
            "once, every reply within 3 x `INSTANCE_LEASE_SECONDS` + 20 s of the heal.",
            "`make test` runs the first two faults with two bots on one server.",
            "",
            f"Measured by `make chaos`: seed `{seed}`, `INSTANCE_LEASE_SECONDS={lease:g}`, "
            "three bots, a primary with a synchronous standby; commit "
            f"`{_commit()}`, Python {sys.version.split()[0]} on {platform.system()}, "
            f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
            "",
            table,
            "",
            "### The zero-loss profile, and what asynchronous replication can lose",
            "",
            "The figures above are for the zero-loss profile: a synchronous standby",
            "(`synchronous_standby_names` naming it), `synchronous_commit` at `on` or",
            "`remote_apply`, and a failover that promotes only that standby after fencing",
            "the old primary (Patroni `synchronous_mode`, pg_auto_failover, CloudNativePG,",
            "managed HA). Every commit the bot was told about is then on the standby it",
            "moves to (the failover row: 0 acknowledged commits lost).",
            "",
            "With asynchronous replication a failover can lose commits already acknowledged:",
            "a message accepted with 200 (lost; or answered again if redelivered), a turn's",
            "commit (re-run, and its reply sent again unmarked), a scheduled message's claim",
            "(sent again, unmarked), an approval's decision (decided again). The bot cannot",
            "undo that; it reports it: when a lease renewal it had committed is missing",
            "after a failover, it logs the error *the database lost acknowledged commits*",
            "with how far back, so the operator knows which window to check.",
            "",
            END,
        ]
    )
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    old = chaos_block(text)
    pooled = chaos_block(old, POOLER_BEGIN, POOLER_END) if old else None
    if pooled is not None:  # the PgBouncer figures of the same run stay
        block = block.replace(END, pooled + "\n\n" + END)
    text = text.replace(old, block) if old else text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def write_pooler_figures(table: str, *, path: Path = REPORT) -> None:
    """Put ``table`` (the short outages through PgBouncer) inside the chaos block."""
    block = "\n".join(
        [
            POOLER_BEGIN,
            "### The short outages through PgBouncer (transaction mode)",
            "",
            "Two bots with `DATABASE_POOLER=transaction` reach one server through PgBouncer in",
            "transaction mode (`tests/pgbouncer.py`), the fault proxies in front of it; commit "
            f"`{_commit()}`, {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
            "",
            table,
            POOLER_END,
        ]
    )
    text = path.read_text(encoding="utf-8")
    whole = chaos_block(text)
    assert whole is not None, "the chaos block is written first"
    old = chaos_block(whole, POOLER_BEGIN, POOLER_END)
    new = whole.replace(old, block) if old else whole.replace(END, block + "\n\n" + END)
    path.write_text(text.replace(whole, new), encoding="utf-8")
