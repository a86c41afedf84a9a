"""``bench/interleave.py``: contenders run in turn, each held while another runs, and
nothing of them is left running after a round."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import bench.interleave as interleave
from bench.common import ROOT


def test_a_round_runs_each_contender_in_turn_and_ends_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interleave, "SLICE", 0.05)
    monkeypatch.setattr(interleave, "CYCLES", 4)
    monkeypatch.setattr(interleave, "WARMUP_CYCLES", 1)
    pids: list[int] = []
    real_start = interleave._start

    def start(*args: object, **kwargs: object) -> interleave.Contender:
        contender = real_start(*args, **kwargs)  # type: ignore[arg-type]
        pids.append(contender.process.pid)
        return contender

    monkeypatch.setattr(interleave, "_start", start)
    specs = {
        "pipeline": interleave.Spec("pipeline", ROOT, {}),
        "floor": interleave.Spec("floor", ROOT, {}),
    }
    results = interleave.run_round(specs, 2, tmp_path)
    for name in specs:
        result = results[name]
        assert result["messages"] > 0
        assert 4 * 0.05 <= result["seconds"] < 4 * 0.05 + 3.0  # its 4 counted turns
        assert result["messages_per_s"] == result["messages"] / result["seconds"]
        assert result["bot"].startswith(str(ROOT))
        assert result["otel"] is False and result["dropped"] == 0
    for pid in pids:  # ended and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
