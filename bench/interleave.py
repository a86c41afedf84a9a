"""Contenders run in turn: variants of a closed-loop pipeline measured side by side.

On a shared machine the same code's rate drifts by up to ±20 % between runs a few
seconds apart (CPU per message 0.56-0.82 ms for one build at the same
utilisation, seen here), so variants run one after another cannot tell a 5 %
difference. Here they are started together, each in a process group of its own,
and run one at a time, in turn, ``SLICE`` seconds each while the others are held
(``SIGSTOP`` to the group: an exporter process of a bot stops with it), ``CYCLES``
turns each after ``WARMUP_CYCLES``, the order reversed every other turn. Every
variant meets the same machine, second by second. A contender counts its answered
messages in a shared page, so its rate is its messages over the time it ran.

What is left is the process itself: two processes of the same code differ by up to
±3 % (their memory's layout), so a figure is the median of several rounds, each
with fresh processes.

A contender is ``CHILD`` run with a tree's ``bench`` and ``bot`` on its path: the
pipeline of ``bench.pipeline`` (any commit's tree; it needs only ``start_harness``
and ``Harness.one_message``), or this tree's floor loop (``bench.floor``). Tracing
is switched on in it when its environment sets ``OTEL_EXPORTER_OTLP_ENDPOINT``.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CYCLES", "SLICE", "WARMUP_CYCLES", "Contender", "Spec", "run_round"]

SLICE = float(os.environ.get("BENCH_INTERLEAVE_SLICE", "0.2"))
"""Seconds a contender runs at a turn."""
CYCLES = int(os.environ.get("BENCH_INTERLEAVE_CYCLES", "25"))
"""Measured turns of each contender a round (``CYCLES * SLICE`` seconds of it)."""
WARMUP_CYCLES = 5
"""Turns each before the count starts (caches, an exporter's first batches)."""
START_SECONDS = 120.0
_TICKS = os.sysconf("SC_CLK_TCK")

# Self-contained: it runs against other commits' trees, which have no bench.interleave.
CHILD = """
import asyncio, json, mmap, os, sys
from pathlib import Path
import bot
kind, sessions = sys.argv[1], int(sys.argv[2])
tracing = None
if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
    from bot.tracing.setup import configure
    tracing = configure()
    assert tracing is not None

async def main():
    directory = Path(os.environ["BENCH_DIR"])
    if kind == "floor":
        from bench.floor import start_floor
        contender = await start_floor(directory, sessions)
    else:
        from bench.pipeline import start_harness
        contender = await start_harness(directory, light=True)
    with open(os.environ["BENCH_COUNTER"], "r+b") as fh:
        page = mmap.mmap(fh.fileno(), 8)
    answered = memoryview(page).cast("Q")
    stop = asyncio.Event()

    async def client(session):
        while not stop.is_set():
            await contender.one_message(session)
            answered[0] += 1

    clients = [asyncio.create_task(client(n)) for n in range(sessions)]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    stop.set()
    await asyncio.gather(*clients)
    await contender.close()
    answered.release()
    page.close()

asyncio.run(main())
dropped = 0
if tracing is not None:
    tracing.shutdown()
    dropped = tracing.exporter.dropped
print(json.dumps({"bot": bot.__file__, "dropped": dropped,
                  "otel": any(m.startswith("opentelemetry") for m in sys.modules)}))
"""


@dataclass(frozen=True)
class Spec:
    """A contender to start: ``kind`` (``pipeline`` or ``floor``), the tree whose
    ``bench`` and ``bot`` it runs, and what its environment adds."""

    kind: str
    tree: Path
    env: Mapping[str, str]


@dataclass
class Contender:
    """A started contender: its process group, its count of answered messages, and
    what it has run so far this round."""

    name: str
    process: subprocess.Popen[str]
    page: mmap.mmap
    messages: int = 0
    seconds: float = 0.0

    @property
    def answered(self) -> int:
        return int.from_bytes(self.page[:8], sys.byteorder)

    def cpu(self) -> tuple[int, int]:
        """Clock ticks of CPU used so far by the contender's process and by the rest of
        its group (an exporter process)."""
        own = others = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", encoding="ascii") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[2]) != self.process.pid:
                continue
            used = int(fields[11]) + int(fields[12])
            if int(entry.name) == self.process.pid:
                own += used
            else:
                others += used
        return own, others

    def hold(self) -> None:
        """Stop the group and wait until the contender is stopped (its count stands)."""
        os.killpg(self.process.pid, signal.SIGSTOP)
        _, status = os.waitpid(self.process.pid, os.WUNTRACED)
        if not os.WIFSTOPPED(status):
            raise RuntimeError(f"{self.name} ended during the run (status {status})")

    def turn(self, seconds: float, *, counted: bool) -> None:
        """Let the group run for ``seconds``, then hold it again."""
        before = self.answered
        started = time.perf_counter()
        os.killpg(self.process.pid, signal.SIGCONT)
        time.sleep(seconds)
        self.hold()
        if counted:
            self.seconds += time.perf_counter() - started
            self.messages += self.answered - before

    def kill(self) -> None:
        """End the contender and its group whatever state they are in."""
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)
        self.page.close()

    def finish(self) -> dict[str, Any]:
        """Let the contender stop on its own (an exporter flushed) and read its report."""
        os.killpg(self.process.pid, signal.SIGCONT)
        out, _ = self.process.communicate("stop\n", timeout=120)
        self.page.close()
        if self.process.returncode != 0:
            raise RuntimeError(f"{self.name} failed (exit {self.process.returncode})")
        report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return report


def _ready(process: subprocess.Popen[str], seconds: float) -> bool:
    """Whether the contender says it is ready within ``seconds`` (its first line)."""
    said: list[str] = []
    assert process.stdout is not None
    stdout = process.stdout
    # A thread, for the timeout: it ends with the process's stdout if it never says.
    reader = threading.Thread(target=lambda: said.append(stdout.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    return bool(said) and said[0].strip() == "ready"


def _start(name: str, spec: Spec, sessions: int, scratch: Path) -> Contender:
    label = "".join(c for c in name if c.isalnum()) or "contender"
    directory = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=scratch))
    counter = directory / "answered"
    counter.write_bytes(bytes(8))
    keep = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    with (directory / "stderr").open("w") as errors:
        process = subprocess.Popen(
            [sys.executable, "-c", CHILD, spec.kind, str(sessions)],
            cwd=spec.tree,
            env={
                **keep,
                "PYTHONPATH": str(spec.tree),
                "BENCH_DIR": str(directory),
                "BENCH_COUNTER": str(counter),
                **spec.env,
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
            start_new_session=True,  # its own group: held and resumed with its children
        )
    with counter.open("r+b") as fh:
        page = mmap.mmap(fh.fileno(), 8)
    contender = Contender(name, process, page)
    if not _ready(process, START_SECONDS):
        contender.kill()
        stderr = (directory / "stderr").read_text(encoding="utf-8", errors="replace")
        raise RuntimeError(f"{name} did not start:\n{stderr[-2000:]}")
    contender.hold()
    return contender


def run_round(
    specs: Mapping[str, Spec],
    sessions: int,
    scratch: Path,
    *,
    measuring: Callable[[bool], None] | None = None,
) -> dict[str, dict[str, Any]]:
    """One round: the contenders started together and run in turn; per contender its
    messages, seconds run, rate, CPU per message (its process, and the rest of its
    group) and its own report (``bot``: the ``bot`` package it ran, ``dropped`` spans,
    ``otel``: whether it imported OpenTelemetry). ``measuring(True)`` and
    ``measuring(False)`` are called around the counted turns."""
    contenders: dict[str, Contender] = {}
    try:
        for name, spec in specs.items():
            contenders[name] = _start(name, spec, sessions, scratch)
        order = list(contenders.values())
        for _ in range(WARMUP_CYCLES):
            for contender in order:
                contender.turn(SLICE, counted=False)
        if measuring is not None:
            measuring(True)
        cpu_before = {name: c.cpu() for name, c in contenders.items()}
        for cycle in range(CYCLES):
            for contender in order if cycle % 2 == 0 else reversed(order):
                contender.turn(SLICE, counted=True)
        cpu_after = {name: c.cpu() for name, c in contenders.items()}
        if measuring is not None:
            measuring(False)
        results: dict[str, dict[str, Any]] = {}
        for name, contender in contenders.items():
            (own_0, others_0), (own_1, others_1) = cpu_before[name], cpu_after[name]
            messages = max(contender.messages, 1)
            results[name] = {
                "messages": contender.messages,
                "seconds": contender.seconds,
                "messages_per_s": contender.messages / contender.seconds,
                "cpu_ms_per_message": (own_1 - own_0) / _TICKS / messages * 1000,
                "group_cpu_ms_per_message": (others_1 - others_0) / _TICKS / messages * 1000,
            }
        for name in list(contenders):
            report = contenders[name].finish()
            del contenders[name]  # ended: nothing left for the clean-up below
            if not report["bot"].startswith(str(specs[name].tree)):
                raise RuntimeError(f"{name} imported another tree's bot: {report['bot']}")
            results[name].update(report)
        return results
    finally:
        for contender in contenders.values():
            contender.kill()
