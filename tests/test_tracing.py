"""Tracing's switch, its no-op path, its privacy rules, log correlation and the schema columns."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import respx

from bot import doctor
from bot.core.scheduling import MIGRATIONS as JOB_MIGRATIONS
from bot.core.scheduling import TABLE as JOBS
from bot.core.scheduling import JobRoute, ScheduleRequest, apply_in
from bot.core.sql import ensure_schema
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.approvals.table import MIGRATIONS as APPROVAL_MIGRATIONS
from bot.gateway.approvals.table import TABLE as APPROVALS
from bot.gateway.approvals.table import approval_rows
from bot.gateway.inbox import Inbox
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import MIGRATIONS, TABLE, Obligation
from bot.logs import JsonFormatter
from bot.tracing import spans
from bot.tracing.recorder import parse_traceparent
from bot.tracing.setup import environment, plan
from tests.fakes.adapter import make_event
from tests.fakes.otlp_server import FakeOtlpServer
from tests.fakes.tracing import recording_spans
from tests.test_cli import _bot

ENDPOINT = "http://collector:4318"


@pytest.mark.parametrize(
    ("env", "on", "says"),
    [
        ({}, False, "off (set OTEL_EXPORTER_OTLP_ENDPOINT"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT}, True, f"{ENDPOINT}/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT + "/"}, True, f"{ENDPOINT}/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"}, True, "to http://t:1/x "),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_SDK_DISABLED": "true"},
            False,
            "OTEL_SDK_DISABLED",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, False, "none"),
        ({"OTEL_TRACES_EXPORTER": "console"}, True, "to stdout"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, False, "not supported"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_HEADERS": "a=b"},
            True,
            "with headers",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            True,
            "only http/protobuf",
        ),
    ],
)
def test_the_otel_environment_decides_where_traces_go(
    env: dict[str, str], on: bool, says: str
) -> None:
    chosen = plan(env)
    assert chosen.on is on
    assert says in chosen.reason


def test_the_endpoint_is_shown_without_its_password_or_query() -> None:
    endpoint = "https://me:s3cret@otlp.example:4318/v1/traces?key=k3y"
    chosen = plan({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint})
    assert chosen.endpoint == endpoint  # the exporter gets it whole
    assert "s3cret" not in chosen.reason and "k3y" not in chosen.reason
    assert "to https://me:***@otlp.example:4318/v1/traces?*** " in chosen.reason


def test_the_plan_names_service_sampler_and_content_capture() -> None:
    chosen = plan(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": ENDPOINT,
            "OTEL_SERVICE_NAME": "shop-bot",
            "OTEL_TRACES_SAMPLER": "traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Basic c2VjcmV0",
        }
    )
    assert "service shop-bot" in chosen.reason and "traceidratio (0.1)" in chosen.reason
    assert chosen.capture_content and "message content captured" in chosen.reason
    assert "c2VjcmV0" not in chosen.reason  # the headers' values (keys) are never shown


def test_off_nothing_of_opentelemetry_is_imported() -> None:
    code = (
        "import sys, bot, bot.logs, bot.gateway.gateway, bot.core.runner;"
        "from bot.tracing.setup import configure;"
        "assert configure({}) is None;"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], 'imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def test_off_every_helper_is_a_no_op() -> None:
    assert not spans.enabled()
    with spans.span(
        "x", {"k": "v"}, root=True, link="00-" + "1" * 32 + "-" + "2" * 16 + "-01"
    ) as s:
        s.set("a", 1)
        s.event("e")
        s.fail("E")
        assert spans.capture() is None and spans.traceparent() is None
        assert spans.provider_headers() == {} and spans.log_ids() is None
    spans.start("q", start_ns=1).end()
    with spans.resume(None):
        pass


def test_a_failed_span_names_the_error_class_never_its_message() -> None:
    with recording_spans() as recorded, pytest.raises(ValueError), spans.span("chatflow.send"):
        raise ValueError("Alice's order 4411 to +44 7700 900123")
    (span,) = recorded.spans
    assert span.attributes == {"error.type": "ValueError"}
    assert span.events == () or all("4411" not in str(e.attributes) for e in span.events)
    assert span.status.description is None


def test_content_reaches_a_span_only_when_the_operator_opted_in() -> None:
    for opted_in in (False, True):
        with recording_spans(capture_content=opted_in) as recorded, spans.span("chat m") as s:
            spans.content(s, "gen_ai.input.messages", "hello Alice")
        (span,) = recorded.spans
        assert ("gen_ai.input.messages" in (span.attributes or {})) is opted_in


def test_a_root_span_links_to_the_stored_traceparent_and_starts_a_new_trace() -> None:
    with recording_spans() as recorded:
        with spans.span("chatflow.tx2"):
            stored = spans.traceparent()
            assert spans.provider_headers() == {"traceparent": stored}
        with spans.span("chatflow.resend", root=True, link=stored):
            pass
    first, resend = recorded.spans
    linked = parse_traceparent(stored)
    assert linked is not None and first.context is not None and resend.context is not None
    assert (linked.trace_id, linked.span_id) == (first.context.trace_id, first.context.span_id)
    assert resend.context.trace_id != first.context.trace_id and resend.parent is None
    assert [(ln.context.trace_id, ln.context.span_id) for ln in resend.links] == [
        (first.context.trace_id, first.context.span_id)
    ]


@pytest.mark.parametrize("value", [None, "", "garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01"])
def test_a_damaged_traceparent_links_nothing(value: str | None) -> None:
    assert parse_traceparent(value) is None


def test_json_logs_made_in_a_span_carry_its_ids() -> None:
    record = logging.makeLogRecord({"msg": "hello", "levelname": "INFO", "name": "t"})
    assert "trace_id" not in json.loads(JsonFormatter().format(record))
    with recording_spans() as recorded, spans.span("chatflow.receive"):
        line = json.loads(JsonFormatter().format(record))
    (span,) = recorded.spans
    assert span.context is not None
    assert line["trace_id"] == f"{span.context.trace_id:032x}"
    assert line["span_id"] == f"{span.context.span_id:016x}"


def _owed(obligation_id: str) -> Obligation:
    return Obligation.owed(
        obligation_id=obligation_id,
        session_key="k",
        session_id="s",
        platform="fake",
        chat_id="c",
        thread_id=None,
        reply_to=None,
        content="hi",
        message_ref="m",
    )


async def test_the_ledger_migrates_and_keeps_the_owing_span(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "old.db"))
    await store.open()
    try:
        async with store.transaction() as tx:  # the ledger as version 4 left it
            await ensure_schema(tx, "delivery_ledger", {v: MIGRATIONS[v] for v in (1, 2, 3, 4)})
            await tx.execute(
                f"INSERT INTO {TABLE} (obligation_id, session_key, session_id, platform, "
                "chat_id, message_ref, content, state, owner_pid, owner_instance, created_at, "
                "fresh_since, updated_at) VALUES ('o-old', 'k', 's', 'fake', 'c', 'm', 'hi', "
                "'pending', 1, 'gone', 1.0, 1.0, 1.0)"
            )
        ledger = DeliveryLedger(store)
        await ledger.open()
        old = await ledger.get("o-old")
        assert old is not None and old.traceparent is None
        with recording_spans(), spans.span("chatflow.tx2"):
            owing = spans.traceparent()
            async with store.transaction() as tx:
                assert await ledger.record_in(tx, _owed("o-new"))
        new = await ledger.get("o-new")
        assert new is not None and owing is not None and new.traceparent == owing
    finally:
        await store.close()


async def test_scheduled_jobs_and_approvals_migrate_to_a_traceparent_column(
    tmp_path: Path,
) -> None:
    store = SQLiteSessionStore(str(tmp_path / "old.db"))
    await store.open()
    try:
        async with store.transaction() as tx:  # both as the release before tracing left them
            await ensure_schema(tx, "scheduled_jobs", {v: JOB_MIGRATIONS[v] for v in (1, 2)})
            await ensure_schema(tx, "approvals", {v: APPROVAL_MIGRATIONS[v] for v in (1, 2)})
            await tx.execute(
                f"INSERT INTO {APPROVALS} (id, session_key, session_id, platform, chat_id, "
                "sender_ref, agent, tool_name, call_id, arguments_json, state, created_at, "
                "expires_at) VALUES ('a1', 'k', 's', 'fake', 'c', 'user_x', 'A', 't', 'c1', "
                "'{}', 'pending', 1.0, 2.0)"
            )
        parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
        route = JobRoute("k", "s", "fake", "c", None, traceparent=parent)
        async with store.transaction() as tx:
            added, _ = await apply_in(tx, [ScheduleRequest("job_1", "ping", 5.0)], route, 1.0)
            assert added == 1
            rows = await tx.fetchall(f"SELECT traceparent FROM {JOBS}")
        assert rows == [(parent,)]
        [old] = await approval_rows(store)
        assert old.traceparent is None
    finally:
        await store.close()


async def test_a_message_taken_over_links_to_the_receipt_that_journaled_it(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    await store.open()
    try:
        dead = Inbox(store, owner="dead-process")
        with recording_spans(), spans.span("chatflow.tx1"):
            journaled = spans.traceparent()
            assert await dead.accept(make_event("hello"), session_key="k", session_id="s")
        taker = Inbox(store, owner="taker")
        [entry] = await taker.recover(3600, live_owners={"taker"})
        assert journaled is not None and entry.link == journaled and entry.trace is None
    finally:
        await store.close()


def test_otel_names_in_the_env_file_count_and_the_process_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "OTEL_EXPORTER_OTLP_ENDPOINT=http://from-file:4318\nOTEL_SERVICE_NAME=file-bot\n",
        encoding="utf-8",
    )
    monkeypatch.setenv("OTEL_SERVICE_NAME", "process-bot")
    merged = environment(env_file)
    assert merged["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://from-file:4318"
    assert merged["OTEL_SERVICE_NAME"] == "process-bot"


async def test_doctor_says_where_traces_go_and_whether_a_collector_takes_them(
    tmp_path: Path,
) -> None:
    async def tracing_line() -> str:
        result = await asyncio.to_thread(_bot, tmp_path, "doctor")  # the fake serves meanwhile
        (line,) = [line for line in result.stdout.splitlines() if " tracing: " in line]
        return line

    assert await tracing_line() == (
        "ok   tracing: off (set OTEL_EXPORTER_OTLP_ENDPOINT to export traces)"
    )
    async with FakeOtlpServer() as otlp:
        (tmp_path / ".env").write_text(f"OTEL_EXPORTER_OTLP_ENDPOINT={otlp.endpoint}\n")
        assert await tracing_line() == (
            f"ok   tracing: OTLP/HTTP to {otlp.endpoint}/v1/traces "
            "(service chatflow, sampler parentbased_always_on)"
        )
        assert otlp.exports == 1 and otlp.spans == []  # an empty export: nothing stored
    with socket.socket() as closed:  # a port nothing listens on once it is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    (tmp_path / ".env").write_text(f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{port}\n")
    assert await tracing_line() == (
        f"WARN tracing: OTLP/HTTP to http://127.0.0.1:{port}/v1/traces "
        "(service chatflow, sampler parentbased_always_on); "
        "nothing answers there (ConnectError): spans would be dropped"
    )


@respx.mock
async def test_doctor_sends_the_exporter_headers_and_says_when_the_collector_refuses_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env here
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "https://otlp.example/api")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Basic%20a2V5, x-team = 7")
    route = respx.post("https://otlp.example/api/v1/traces").respond(401)
    async with httpx.AsyncClient() as client:
        result = await doctor._check_tracing(client)
    sent = route.calls.last.request
    assert sent.headers["authorization"] == "Basic a2V5" and sent.headers["x-team"] == "7"
    assert sent.content == b"" and sent.headers["content-type"] == "application/x-protobuf"
    assert result.ok and result.warning
    assert result.detail.endswith(
        "; the collector refused an export (HTTP 401): check OTEL_EXPORTER_OTLP_HEADERS"
    )
