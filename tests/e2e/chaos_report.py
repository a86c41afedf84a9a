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

__all__ = ["BEGIN", "END", "chaos_block", "write_figures"]

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "RELIABILITY.md"
BEGIN = "<!-- chaos:begin (written by make chaos) -->"
END = "<!-- chaos:end -->"


def chaos_block(text: str) -> str | None:
    """The chaos block of a report (markers included), if it has one."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[start : end + len(END)]


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
            f"Measured by `make chaos`: seed `{seed}`, `INSTANCE_LEASE_SECONDS={lease:g}`, "
            "three bots, a primary with a synchronous standby; commit "
            f"`{_commit()}`, Python {sys.version.split()[0]} on {platform.system()}, "
            f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.",
            "",
            table,
            "",
            END,
        ]
    )
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    old = chaos_block(text)
    text = text.replace(old, block) if old else text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")
