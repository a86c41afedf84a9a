"""Traces through the gateway (in-process, in-memory exporter): a turn's spans in its
message's trace, the continuation after an approval in a new trace linked to the turn
that asked, each send's outcome, and the media step."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from bot import Agent, Runner, tool
from bot.config import Settings
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import PlatformError
from bot.gateway.approvals.table import approval_rows
from bot.gateway.contract import MediaAttachment
from bot.gateway.gateway import Gateway
from bot.tracing import spans
from bot.tracing.recorder import parse_traceparent
from tests.fakes.adapter import FakeAdapter, make_event, transient
from tests.fakes.button_adapter import ButtonAdapter
from tests.fakes.media_files import ogg_opus_bytes, pdf_bytes
from tests.fakes.tracing import Recorded, recording_spans
from tests.gateway.conftest import Rig
from tests.gateway.ledger.ledger_support import ONE_REPLY
from tests.gateway.test_media_turns import FakeTranscriber
from tests.gateway.test_pacing import PacedAdapter

SECRET = b"t" * 32


@tool(needs_approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order.

    Args:
        order_id: The order.
        amount: How much.
    """
    return f"refunded {amount} on {order_id}"


@pytest.fixture
async def traced(
    tmp_path: Path,
) -> AsyncIterator[tuple[Gateway, ButtonAdapter, ScriptedModel, SQLiteSessionStore, Recorded]]:
    with recording_spans() as recorded:
        store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
        model = ScriptedModel()
        agent = Agent(name="Billing", instructions="Bill.", tools=[refund])
        runner = Runner(agent, store, model=model)
        adapter = ButtonAdapter()
        settings = Settings(data_dir=tmp_path, approval_ttl_seconds=600)
        gateway = Gateway(runner, store, [adapter], settings, secret=SECRET)
        await gateway.start()
        await gateway.wait_ready()
        try:
            yield gateway, adapter, model, store, recorded
        finally:
            await gateway.stop(grace=1)
            await store.close()


async def test_the_continuation_after_an_approval_is_a_new_trace_linked_to_the_asking_turn(
    traced: tuple[Gateway, ButtonAdapter, ScriptedModel, SQLiteSessionStore, Recorded],
) -> None:
    gateway, adapter, model, store, recorded = traced
    model.add(ScriptedModel.call("refund", order_id="1001", amount=25))
    assert await adapter.deliver(make_event("refund 1001 please"))
    await adapter.wait_for_sent(1)
    (receipt,) = recorded.named("chatflow.receive")
    assert receipt.context is not None and receipt.parent is None
    asking = receipt.context.trace_id
    names = {s.name for s in recorded.in_trace(asking)}
    assert {
        "chatflow.tx1",
        "chatflow.queue",
        "invoke_agent Billing",
        "chatflow.approval_pause",
        "chatflow.tx2",
    } <= names
    [row] = await approval_rows(store)
    (tx2,) = [s for s in recorded.in_trace(asking) if s.name == "chatflow.tx2"]
    assert tx2.context is not None
    assert row.traceparent is not None and f"{tx2.context.span_id:016x}" in row.traceparent

    model.add(ScriptedModel.reply("Refunded 25."))
    buttons = {b.label: b.token for b in adapter.keyboards[-1]}
    await adapter.deliver(make_event("", tap_token=buttons["Approve"]))
    await adapter.wait_for_sent(2)
    await gateway._dispatcher.drain(5)
    (continuation,) = recorded.named("chatflow.approval_continuation")
    assert continuation.context is not None and continuation.parent is None
    assert continuation.context.trace_id != asking
    assert [(ln.context.trace_id, ln.context.span_id) for ln in continuation.links] == [
        (asking, tx2.context.span_id)
    ]
    later = {s.name for s in recorded.in_trace(continuation.context.trace_id)}
    assert {"invoke_agent Billing", "execute_tool refund", "chatflow.tx2", "chatflow.send"} <= later
    # Nothing of the conversation in any attribute.
    values = [str(v) for s in recorded.spans for v in (s.attributes or {}).values()]
    assert not [v for v in values if "1001" in v or "Refunded" in v or "user-1" in v]


async def test_a_send_span_says_sent_after_a_429_with_its_wait_or_abandoned_with_the_reason(
    rigs: Callable[..., object],
) -> None:
    with recording_spans() as recorded:
        adapter = PacedAdapter()
        rig: Rig = await rigs(adapter=adapter)  # type: ignore[misc]
        adapter.fail_next.append(transient("Too Many Requests", retry_after=0.2))
        rig.model.add(ScriptedModel.reply("in a moment"))
        await adapter.deliver(make_event("hi"))
        await adapter.wait_for_sent(1, timeout=5.0)
        assert await rig.gateway._dispatcher.drain(5)
        (sent,) = recorded.named("chatflow.send")
        assert (sent.attributes or {})["chatflow.send.outcome"] == "sent"
        assert (sent.attributes or {})["chatflow.send.flood_retries"] == 1
        (refused,) = sent.events
        assert refused.name == "chatflow.send.flood_refused"
        assert (refused.attributes or {})["chatflow.send.retry_after_s"] == 0.2

        blocked = PlatformError(
            "Forbidden: bot was blocked by user 4242", platform="fake", code=403
        )
        adapter.fail_next.append(blocked)
        rig.model.add(ScriptedModel.reply("are you there?"))
        await adapter.deliver(make_event("hello again", message_id="m-2"))
        assert await rig.gateway._dispatcher.drain(5)
        abandoned = recorded.named("chatflow.send")[-1]
        attributes = abandoned.attributes or {}
        assert attributes["chatflow.send.outcome"] == "abandoned"
        assert attributes["chatflow.send.reason"] == "PlatformError 403"
        assert "4242" not in str(attributes)


async def test_the_media_step_is_traced_by_kind_and_size_never_by_name_or_words(
    rigs: Callable[..., object],
) -> None:
    with recording_spans() as recorded:
        rig: Rig = await rigs()  # type: ignore[misc]
        media = rig.gateway.turns.media
        assert media is not None
        media.transcriber = FakeTranscriber("where is order 1001")
        rig.adapter.files["voice-1"] = ogg_opus_bytes()
        rig.adapter.files["doc-1"] = pdf_bytes("Invoice 4471", "Total due: 129.00 EUR")
        rig.model.add(ScriptedModel.reply("It ships today."))
        event = make_event(
            "",
            media=[
                MediaAttachment("voice", file_id="voice-1", mime_type="audio/ogg"),
                MediaAttachment(
                    "document", file_id="doc-1", mime_type="application/pdf",
                    file_name="salaries-ana.pdf",
                ),
            ],
        )  # fmt: skip
        assert await rig.adapter.deliver(event)
        await rig.adapter.wait_for_sent(1)
        assert await rig.gateway._dispatcher.drain(5)
    (receipt,) = recorded.named("chatflow.receive")
    (heard,) = recorded.named("chatflow.transcription")
    (read,) = recorded.named("chatflow.document")
    for span in (heard, read):
        assert span.context is not None and receipt.context is not None
        assert span.context.trace_id == receipt.context.trace_id
        assert (span.attributes or {})["chatflow.media.outcome"] == "ok"
        assert isinstance(size := (span.attributes or {})["chatflow.media.bytes"], int) and size > 0
    assert (read.attributes or {})["chatflow.media.mime"] == "application/pdf"
    exported = str([dict(s.attributes or {}) for s in recorded.spans])
    assert "salaries" not in exported and "1001" not in exported and "4471" not in exported


async def test_a_reply_queued_in_a_lane_started_inside_a_message_trace_gets_its_own_trace(
    rigs: Callable[..., object],
) -> None:
    with recording_spans() as recorded:
        rig: Rig = await rigs()  # type: ignore[misc]
        with spans.span("chatflow.tx2"):  # the turn that owed it
            owing = spans.traceparent()
            assert await rig.gateway.ledger.record_obligation(**{**ONE_REPLY, "platform": "fake"})
        [owed] = await rig.gateway.ledger.list_obligations(state="pending")
        # The lane's task starts inside another message's trace (its receipt queued first).
        with spans.span("chatflow.receive", root=True):
            rig.gateway._queue_sends([owed])
        await rig.adapter.wait_for_sent(1)
        assert await rig.gateway._dispatcher.drain(5)
    (receipt,) = recorded.named("chatflow.receive")
    (send,) = recorded.named("chatflow.send")
    assert receipt.context is not None and send.context is not None and send.parent is None
    assert send.context.trace_id != receipt.context.trace_id
    linked = parse_traceparent(owing)
    assert linked is not None
    assert [(ln.context.trace_id, ln.context.span_id) for ln in send.links] == [
        (linked.trace_id, linked.span_id)
    ]


@dataclass
class WebhookAdapter(FakeAdapter):
    """A fake platform that delivers by webhook: it has a route to mount."""

    routes_built: int = 0

    def routes(self) -> Sequence[BaseRoute]:
        self.routes_built += 1
        return [Route("/webhooks/fake", lambda request: Response(), methods=["POST"])]


async def test_the_receive_span_says_webhook_or_poll_and_asks_the_adapter_once(
    rigs: Callable[..., object],
) -> None:
    adapter = WebhookAdapter()
    rig: Rig = await rigs(adapter=adapter)  # type: ignore[misc]
    built = adapter.routes_built  # the server mounted them at start
    with recording_spans() as recorded:
        for n in range(3):
            rig.model.add(ScriptedModel.reply("ok"))
            assert await adapter.deliver(make_event("hi", message_id=f"m-{n}"))
        assert await rig.gateway._dispatcher.drain(5)
    receipts = recorded.named("chatflow.receive")
    assert [(r.attributes or {})["chatflow.receipt"] for r in receipts] == ["webhook"] * 3
    assert adapter.routes_built - built <= 1  # not rebuilt for every message
