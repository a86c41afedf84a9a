"""``bench/floor.py``: the floor loop does the issue's work per message, and the targets
table judges the pipeline ÷ floor ratios of one run."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import bench.floor as floor


def _spread(value: float) -> dict[str, float]:
    return {"min": value, "median": value, "max": value}


def _level(
    sessions: int, throughput: float, cpu: float, p99: float, commits: float
) -> dict[str, Any]:
    return {
        "sessions": sessions,
        "ratios": {"throughput": _spread(throughput), "cpu": _spread(cpu), "p99": _spread(p99)},
        "pipeline": {"commits_per_message": _spread(commits)},
    }


def _verdicts(levels: list[dict[str, Any]]) -> dict[str, bool | None]:
    return {name: met for name, _value, _fmt, met in floor.targets(levels)}


def test_targets_pass_at_the_thresholds_and_miss_beyond() -> None:
    at = [
        _level(1, 0.30, 9.0, 9.0, 2.0),
        _level(10, 0.30, 9.0, 9.0, 0.4),
        _level(100, 0.30, 4.0, 3.0, 0.25),
    ]
    assert all(_verdicts(at).values())
    beyond = [
        _level(1, 0.29, 1.0, 1.0, 2.01),
        _level(10, 0.29, 1.0, 1.0, 0.2),
        _level(100, 0.29, 4.01, 3.01, 0.26),
    ]
    assert not any(_verdicts(beyond).values())


def test_timed_commits_of_a_run_do_not_turn_two_per_message_into_a_miss() -> None:
    # 2 per message plus the retry poll's few commits in a 5-second run.
    verdicts = _verdicts([_level(1, 0.3, 1.0, 1.0, 2.0022), _level(100, 0.3, 1.0, 1.0, 0.2511)])
    assert all(v for name, v in verdicts.items() if "COMMIT" in name)


def test_levels_not_measured_are_reported_as_such() -> None:
    assert set(_verdicts([]).values()) == {None}


def test_ratios_are_taken_within_each_round() -> None:
    def result(rate: float) -> dict[str, float]:
        return {
            "messages_per_s": rate,
            "cpu_ms_per_message": 1000 / rate,
            "latency_p50_ms": 1.0,
            "latency_p99_ms": 2.0,
            "commits_per_message": 1.0,
        }

    # A slow round slows both sides: the ratio of each round is 0.25 (the CPU's 4).
    runs = {
        1: {
            "floor": [result(4000), result(1000), result(2000)],
            "pipeline": [result(1000), result(250), result(500)],
        }
    }
    # Throughput ratios come from the interleaved rounds, each round's own.
    interleaved = {
        1: [
            {"floor": 4000.0, "pipeline": 1200.0, "base": 1000.0},
            {"floor": 1000.0, "pipeline": 300.0, "base": 250.0},
            {"floor": 2000.0, "pipeline": 600.0, "base": 500.0},
        ]
    }
    (level,) = floor.summarise(runs, interleaved)
    assert level["ratios"]["throughput"] == _spread(0.3)
    assert level["ratios"]["base_throughput"] == _spread(0.25)
    assert level["ratios"]["pipeline_over_base"] == _spread(1.2)
    assert level["ratios"]["cpu"] == _spread(4.0)
    assert level["floor"]["messages_per_s"]["median"] == 2000


@pytest.mark.parametrize(("sessions", "most_commits"), [(1, 2.0), (10, 1.0)])
async def test_the_floor_loop_journals_answers_and_marks_every_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sessions: int, most_commits: float
) -> None:
    monkeypatch.setattr(floor, "WARMUP_SECONDS", 0.05)
    monkeypatch.setattr(floor, "MEASURE_SECONDS", 0.2)
    result = await floor.measure_floor(tmp_path, sessions)
    assert result["messages"] > 0
    # Two transactions per message alone (the last delivered mark commits on its own);
    # group commit shares them between sessions.
    assert 0 < result["commits_per_message"] <= most_commits + 1 / result["messages"]
    assert result["synchronous"] == 1  # NORMAL, as the store sets it
    conn = sqlite3.connect(tmp_path / "floor.db")
    try:
        claimed = conn.execute("SELECT count(*) FROM processed").fetchone()[0]
        states = dict(conn.execute("SELECT state, count(*) FROM inbox GROUP BY state").fetchall())
        sent = dict(
            conn.execute("SELECT state, count(*) FROM obligations GROUP BY state").fetchall()
        )
        history = conn.execute("SELECT count(*) FROM messages").fetchone()[0]
        versions = conn.execute("SELECT sum(version) FROM sessions").fetchone()[0]
    finally:
        conn.close()
    assert states == {"done": claimed}
    assert sent == {"delivered": claimed}
    assert history == 2 * claimed
    assert versions == claimed
