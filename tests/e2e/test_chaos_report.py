"""The chaos block of docs/RELIABILITY.md: its PgBouncer figures survive a rewrite."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.chaos_report import (
    BEGIN,
    END,
    POOLER_BEGIN,
    chaos_block,
    write_figures,
    write_pooler_figures,
)


def test_the_pgbouncer_table_lives_inside_the_block_and_survives_a_rewrite(
    tmp_path: Path,
) -> None:
    report = tmp_path / "RELIABILITY.md"
    report.write_text("# Reliability\n\nproof figures\n", encoding="utf-8")
    write_figures("| primary table 1 |", seed=1, lease=3.0, path=report)
    write_pooler_figures("| pooled table 1 |", path=report)
    write_pooler_figures("| pooled table 2 |", path=report)  # replaced, not added
    write_figures("| primary table 2 |", seed=1, lease=3.0, path=report)

    text = report.read_text(encoding="utf-8")
    block = chaos_block(text)
    assert block is not None and block.startswith(BEGIN) and block.endswith(END)
    assert "| primary table 2 |" in block and "| primary table 1 |" not in block
    assert "| pooled table 2 |" in block and "| pooled table 1 |" not in block
    assert block.count(POOLER_BEGIN) == 1
    assert text.startswith("# Reliability\n\nproof figures\n")
