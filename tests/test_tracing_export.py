"""The recorder's sampling, and the exporter process: owned, bounded, never in the way."""

from __future__ import annotations

import asyncio
import enum
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bot.tracing import spans
from bot.tracing.child import NICENESS
from bot.tracing.export import ChildExporter
from bot.tracing.recorder import Record, Recorder, sampler_from
from bot.tracing.setup import configure
from tests.fakes.otlp_server import FakeOtlpServer

ENV = {"OTEL_BSP_SCHEDULE_DELAY": "20"}


def _record(name: str, trace_id: int = 0x1234, span_id: int = 0x42) -> Record:
    return (name, trace_id, span_id, 0, 1, 0, 1_000, 2_000, {"n": 1}, (), (), False)


def _held_exporter(otlp: FakeOtlpServer, *, queue: int, batch: int) -> ChildExporter:
    """An exporter to ``otlp`` whose sender wakes for a full frame or the shutdown only."""
    settings = {"OTEL_BSP_MAX_QUEUE_SIZE": str(queue), "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": str(batch)}
    return ChildExporter(
        "otlp", f"{otlp.endpoint}/v1/traces", "unit", {**ENV, **settings}, flush_seconds=3600
    )


@pytest.fixture
def recorded() -> Iterator[list[Record]]:
    kept: list[Record] = []
    yield kept
    spans.install(None)


def test_a_ratio_sampler_keeps_some_roots_and_their_children_follow_them(
    recorded: list[Record],
) -> None:
    sampler = sampler_from(
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    )
    spans.install(Recorder(recorded.append, sampler))
    flags: dict[int, str] = {}
    for _ in range(400):
        with spans.span("chatflow.receive", root=True):
            parent = spans.traceparent()
            assert parent is not None
            with spans.span("chatflow.tx1"):
                child = spans.traceparent()
                assert child is not None and child.split("-")[1] == parent.split("-")[1]
                assert child[-2:] == parent[-2:]  # the child follows its root's decision
            flags[int(parent.split("-")[1], 16)] = parent[-2:]
    kept = {trace_id for trace_id, flag in flags.items() if flag == "01"}
    assert 40 <= len(kept) <= 160  # a quarter of 400, give or take
    assert {r[1] for r in recorded} == kept
    assert len(recorded) == 2 * len(kept)  # the root and its child, of sampled traces only


def test_always_off_records_nothing_but_still_propagates(recorded: list[Record]) -> None:
    spans.install(Recorder(recorded.append, sampler_from({"OTEL_TRACES_SAMPLER": "always_off"})))
    with spans.span("chatflow.receive") as span:
        span.event("e")
        assert (spans.traceparent() or "").endswith("-00")
        assert spans.log_ids() is not None
    assert recorded == []


def test_a_span_of_a_trace_not_sampled_makes_nothing_and_keeps_its_parent(
    recorded: list[Record],
) -> None:
    sampler = sampler_from({"OTEL_TRACES_SAMPLER": "parentbased_always_off"})
    spans.install(Recorder(recorded.append, sampler))
    with spans.span("chatflow.receive", root=True):
        parent = spans.traceparent()
        with spans.span("chatflow.tx1") as child:
            child.set("n", 1)
            child.event("e")
            assert spans.traceparent() == parent  # the trace goes on, flagged not sampled
            inner = spans.start("chatflow.queue")
            inner.end()
        with pytest.raises(KeyError), spans.span("chatflow.tx2"):
            raise KeyError("an error inside still leaves the block")
        assert spans.traceparent() == parent
    assert spans.traceparent() is None
    assert recorded == []


def test_an_unknown_sampler_samples_everything(recorded: list[Record]) -> None:
    spans.install(Recorder(recorded.append, sampler_from({"OTEL_TRACES_SAMPLER": "jaeger_remote"})))
    with spans.span("a"):
        pass
    assert len(recorded) == 1


async def test_the_child_exports_the_records_then_ends_with_the_pipe() -> None:
    async with FakeOtlpServer() as otlp:
        exporter = ChildExporter("otlp", f"{otlp.endpoint}/v1/traces", "unit", ENV)
        for n in range(3):
            exporter.submit(_record(f"s{n}", span_id=n + 1))
        got = await otlp.wait_for(lambda s: len(s) == 3, within=30)
        assert {s.name for s in got} == {"s0", "s1", "s2"}
        assert {s.resource["service.name"] for s in got} == {"unit"}
        exporter.submit(_record("last", span_id=9))
        assert await asyncio.to_thread(exporter.shutdown, 30)  # exit code 0, in time
        assert "last" in {s.name for s in otlp.spans}  # flushed by the end of its stdin
    assert exporter.dropped == 0
    exporter.submit(_record("after"))
    assert exporter.dropped == 1  # after the shutdown: dropped, counted


async def test_the_child_runs_below_the_bots_priority() -> None:
    async with FakeOtlpServer() as otlp:
        exporter = ChildExporter("otlp", f"{otlp.endpoint}/v1/traces", "unit", ENV)
        exporter.submit(_record("s"))
        await otlp.wait_for(lambda s: len(s) == 1, within=30)  # it runs: it has niced itself
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, exporter.process.pid) == min(mine + NICENESS, 19)
        assert await asyncio.to_thread(exporter.shutdown, 30)


async def test_a_full_queue_drops_and_counts_and_never_waits() -> None:
    async with FakeOtlpServer() as otlp:
        # The sender only wakes for the shutdown.
        exporter = _held_exporter(otlp, queue=4, batch=4)
        for n in range(10):
            exporter.submit(_record(f"s{n}", span_id=n + 1))
        assert exporter.dropped == 6
        assert await asyncio.to_thread(exporter.shutdown, 30)
        assert sorted(s.name for s in otlp.spans) == ["s0", "s1", "s2", "s3"]


async def test_a_dead_child_costs_dropped_spans_never_a_blocked_bot() -> None:
    exporter = ChildExporter("otlp", "http://127.0.0.1:9/v1/traces", "unit", ENV)
    exporter.process.kill()
    await asyncio.to_thread(exporter.process.wait, 30)
    exporter.submit(_record("lost"))
    # The sender finds the pipe closed on its next batch: dropped and counted.
    await asyncio.to_thread(exporter.shutdown, 30)
    assert exporter.dropped == 1


async def test_a_child_stuck_on_its_collector_is_ended_at_the_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        port = silent.getsockname()[1]
        exporter = ChildExporter(
            "otlp",
            f"http://127.0.0.1:{port}/v1/traces",
            "unit",
            {**ENV, "OTEL_BSP_SCHEDULE_DELAY": "1"},
        )
        exporter.submit(_record("stuck"))
        assert not await asyncio.to_thread(exporter.shutdown, 1.5)
        assert exporter.process.returncode is not None  # killed, reaped: not left running


def test_the_child_ends_when_the_bot_dies() -> None:
    code = (
        "import os, sys\n"
        "from bot.tracing.export import ChildExporter\n"
        "e = ChildExporter('otlp', 'http://127.0.0.1:9/v1/traces', 'unit', {})\n"
        "print(e.process.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    # The child inherits the bot's stdout: its end is the end of the last writer.
    done = subprocess.run(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL
    pid = int(done.stdout.split()[0])
    try:
        exited = os.pidfd_open(pid)  # readable once the process has exited
    except ProcessLookupError:
        return  # gone already
    try:
        assert select.select([exited], [], [], 30)[0], "the exporter outlived the bot"
    finally:
        os.close(exited)


def test_an_exporter_that_cannot_start_leaves_tracing_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def cannot_start(*args: object, **kwargs: object) -> None:
        raise PermissionError("no exec here")

    monkeypatch.setattr(subprocess, "Popen", cannot_start)
    assert configure({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}) is None
    assert not spans.enabled()


async def test_an_attribute_marshal_cannot_carry_drops_its_span_only() -> None:
    class Outcome(enum.StrEnum):
        OK = "ok"

    bad = _record("bad", span_id=1)
    bad[8]["chatflow.outcome"] = Outcome.OK  # a str subclass: marshal refuses it
    async with FakeOtlpServer() as otlp:
        exporter = ChildExporter("otlp", f"{otlp.endpoint}/v1/traces", "unit", ENV)
        exporter.submit(bad)
        exporter.submit(_record("good", span_id=2))
        assert await asyncio.to_thread(exporter.shutdown, 30)
        assert [s.name for s in otlp.spans] == ["good"]  # its batch-mate still exported
    assert exporter.dropped == 1


async def test_a_frame_is_exported_in_batches_of_the_export_batch_size() -> None:
    # The sending thread ships half the queue a frame (fewer wakes of a thread that
    # takes the bot's GIL); the exporter process still posts OTEL_BSP_MAX_EXPORT_BATCH_SIZE
    # spans at most an export, as the SDK's batch processor does.
    async with FakeOtlpServer() as otlp:
        # Only a full frame (8) or the shutdown sends.
        exporter = _held_exporter(otlp, queue=16, batch=3)
        for n in range(8):
            exporter.submit(_record(f"s{n}", span_id=n + 1))
        got = await otlp.wait_for(lambda s: len(s) == 8, within=30)
        assert sorted(s.name for s in got) == [f"s{n}" for n in range(8)]
        assert otlp.exports == 3  # 3 + 3 + 2
        assert await asyncio.to_thread(exporter.shutdown, 30)
    assert exporter.dropped == 0


def test_the_helpers_are_the_recorders_own_while_it_is_installed(
    recorded: list[Record],
) -> None:
    recorder = Recorder(recorded.append)
    spans.install(recorder)
    assert spans.span == recorder.span  # one call into the recorder, no check on the way
    with spans.span("a"):
        assert spans.traceparent() is not None
    spans.install(None)
    with spans.span("b") as handle:
        assert handle is spans.NO_SPAN
        assert spans.traceparent() is None and spans.capture() is None
    assert [r[0] for r in recorded] == ["a"]


class _Refusing(BaseHTTPRequestHandler):
    """A collector that refuses every export (400): the exporter logs it."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(400)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.mark.parametrize("json_logs", [True, False])
async def test_the_exporters_log_lines_are_written_as_the_bots(
    json_logs: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        exporter = ChildExporter(
            "otlp",
            f"http://127.0.0.1:{server.server_address[1]}/v1/traces",
            "unit",
            ENV,
            json_logs=json_logs,
        )
        secret = ("s", 1, 2, 0, 1, 0, 1, 2, {"chatflow.note": "call +15550001234"}, (), (), False)
        exporter.submit(secret)
        assert await asyncio.to_thread(exporter.shutdown, 30)
    finally:
        server.shutdown()
        server.server_close()
    lines = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert lines, "the refusal was logged"
    for line in lines:
        assert "+15550001234" not in line  # a span's content never reaches a log line
        if json_logs:
            record = json.loads(line)
            assert record["level"] in {"WARNING", "ERROR"}
            assert record["logger"].startswith("opentelemetry")
            assert "400" in record["message"]
        else:
            assert re.match(r"\d\d:\d\d:\d\d (WARNING|ERROR) +opentelemetry\S*: ", line), line
