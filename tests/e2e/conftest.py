"""End-to-end fixtures and the proof report hook.

``CHATFLOW_PROOF=full`` runs the proof scenarios at full size; when every
scenario passed, ``docs/RELIABILITY.md`` is written from their figures.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Generator, Iterator

import pytest

from tests.e2e import proof_report
from tests.e2e.botprocess import BotProcess
from tests.e2e.proof_world import FULL, SEED

LOG_LINES_SHOWN = 200


@pytest.fixture(autouse=True)
def _bots_of_this_test() -> Iterator[None]:
    BotProcess.made.clear()
    yield
    BotProcess.made.clear()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed end-to-end test shows the end of each bot's log: why it did not answer."""
    report = yield
    if report.when == "call" and report.failed:
        for index, bot in enumerate(BotProcess.made):
            tail = bot.log[-LOG_LINES_SHOWN:]
            report.sections.append((f"bot {index} log ({bot.data_dir.name})", "\n".join(tail)))
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After a full proof run in which everything passed, write docs/RELIABILITY.md."""
    if os.environ.get("CHATFLOW_PROOF_SHOW"):
        for key, result in proof_report.results().items():
            print(f"\nproof {key} ({result.seconds:.1f} s):", file=sys.stderr)
            for name, value in result.figures:
                print(f"  {name}: {value}", file=sys.stderr)
            for line in result.details:
                print(f"  {line}", file=sys.stderr)
    if not FULL:
        return
    done = proof_report.results()
    missing = [key for key in proof_report.SCENARIOS if key not in done]
    if exitstatus != 0 or missing:
        print(
            f"\nproof: docs/RELIABILITY.md NOT written (exit status {exitstatus}, "
            f"scenarios not passed: {', '.join(missing) or 'none'})",
            file=sys.stderr,
        )
        return
    path = proof_report.write_report(SEED)
    print(f"\nproof: figures written to {path}", file=sys.stderr)
