"""The tracing scenario the SQLite and PostgreSQL end-to-end tests share.

One ``python -m bot run`` (Telegram polling the fake Bot API, the fake OpenAI
server as its model, the example reminder agent) exports to ``FakeOtlpServer``.
Three chats write; one asks for a reminder (``schedule_message``, a tool call,
then a scheduled message). Then a fourth chat's reply is held in the send and
the bot is SIGKILLed between tx 2 and the send; after the restart the reply is
resent. The collector must hold:

- one trace per inbound message, rooted at ``chatflow.receive``, with tx 1, the
  queue wait, ``invoke_agent``, ``chat``, tx 2 and the send (and
  ``execute_tool schedule_message`` for the reminder), the first answer's send
  refused once with a 429 (an event with the wait) and sent after it;
- the scheduled message and the resend each in a new trace, linked to tx 2 of
  the turn that owed them;
- a ``traceparent`` on every model request, naming its ``chat`` span;
- JSON log lines made in a span carrying its trace and span ids;
- the spans still batched exported when the bot stops (SIGTERM);
- not one message text, tool argument, answer, chat or user id, or name in any
  attribute.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.e2e.botprocess import BotProcess
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, RecordedRequest
from tests.fakes.otlp_server import ExportedSpan, FakeOtlpServer
from tests.fakes.telegram_server import FakeTelegramServer, Fault

__all__ = ["run_tracing_scenario"]

DATA = Path(__file__).resolve().parents[1] / "data" / "telegram"
REMINDER = "Secret-reminder: water the ficus Quentin"
CHATS = (
    (731000111, "remind me about the ficus Quentin, code 4417-XK"),
    (731000222, "my secret is gooseberry-9931"),
    (731000333, "call me at +44 7700 900123"),
)
CRASH_CHAT = (731000444, "the parcel code is PLUTO-5521")
PER_MESSAGE = (
    "chatflow.receive",
    "chatflow.tx1",
    "chatflow.queue",
    "invoke_agent Reminders",
    "chat gpt-test",
    "chatflow.tx2",
)


def _update(update_id: int, chat_id: int, text: str) -> dict[str, Any]:
    payload: dict[str, Any] = copy.deepcopy(json.loads((DATA / "private_text.json").read_text()))
    payload["update_id"] = update_id
    message = payload["message"]
    message.update(message_id=100 + update_id, text=text)
    person = {"id": chat_id, "first_name": "Zebulon", "username": f"zeb{chat_id}"}
    message["from"].update(person)
    message["chat"].update(person)
    return payload


def _answer(record: RecordedRequest) -> FakeResponse:
    """The model: a reminder is scheduled (one tool call, then a reply); the rest is echoed
    back in a reply that quotes the message (content, so it must not reach a span)."""
    last = record.messages[-1]
    if last.get("role") == "tool":
        return FakeOpenAIServer.reply("Done, reminder set for Quentin.")
    text = str(last.get("content"))
    if "remind" in text:
        return FakeOpenAIServer.call("schedule_message", text=REMINDER, delay_seconds=2)
    return FakeOpenAIServer.reply(f"Noted: {text}")


def bot_env(
    telegram: FakeTelegramServer, openai: FakeOpenAIServer, otlp: FakeOtlpServer
) -> dict[str, str]:
    """The bot's settings: the fakes, and tracing to ``otlp`` with a short batch delay."""
    openai.responder = _answer
    return {
        "TELEGRAM_BOT_TOKEN": telegram.token,
        "TELEGRAM_API_BASE_URL": telegram.base_url,
        "OPENAI_API_KEY": openai.api_key,
        "OPENAI_BASE_URL": openai.base_url,
        "DEFAULT_MODEL": "gpt-test",
        "AGENTS_MODULE": "agents.reminders",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_SERVICE_NAME": "chatflow-e2e",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "LOG_FORMAT": "json",
    }


def _by_name(spans: list[ExportedSpan]) -> dict[str, list[ExportedSpan]]:
    found: dict[str, list[ExportedSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def _receipts(spans: list[ExportedSpan]) -> dict[str, ExportedSpan]:
    return {s.trace_id: s for s in spans if s.name == "chatflow.receive"}


def _complete(spans: list[ExportedSpan], trace_id: str, *, sent: bool) -> bool:
    names = {s.name for s in spans if s.trace_id == trace_id}
    return set(PER_MESSAGE) <= names and (not sent or "chatflow.send" in names)


def _tx2_of(spans: list[ExportedSpan], trace_id: str) -> ExportedSpan:
    (tx2,) = [s for s in spans if s.trace_id == trace_id and s.name == "chatflow.tx2"]
    return tx2


async def run_tracing_scenario(
    bot: BotProcess,
    telegram: FakeTelegramServer,
    openai: FakeOpenAIServer,
    otlp: FakeOtlpServer,
    extra_secrets: Mapping[str, str] = {},
) -> None:
    """Drive the scenario on a started ``bot`` and check everything the collector got."""
    telegram.inject("sendMessage", Fault.flood(1))  # the first answer: a 429, then resent
    for index, (chat_id, text) in enumerate(CHATS, start=1):
        telegram.push_update(_update(index, chat_id, text))
    # Three answers and the reminder, 2 s after it was asked for.
    sent = await telegram.wait_for_sent(4, within=40)
    assert REMINDER in {s.text for s in sent}

    def first_three_done(spans: list[ExportedSpan]) -> bool:
        receipts = _receipts(spans)
        done = [t for t in receipts if _complete(spans, t, sent=True)]
        scheduled = [s for s in spans if s.name == "chatflow.scheduled"]
        return len(done) == 3 and len(scheduled) == 1

    spans = await otlp.wait_for(first_three_done, within=30)
    receipts = _receipts(spans)
    assert len(receipts) == 3
    conversations = {r.attributes["gen_ai.conversation.id"] for r in receipts.values()}
    assert len(conversations) == 3  # one per chat, each a hash
    for trace_id, receipt in receipts.items():
        in_trace = [s for s in spans if s.trace_id == trace_id]
        assert receipt.parent_span_id == ""  # the root of its trace
        assert receipt.attributes["chatflow.receipt"] == "poll"  # Telegram long polling
        names = [s.name for s in in_trace]
        assert all(names.count(name) == 1 for name in PER_MESSAGE if not name.startswith("chat "))
        assert names.count("chat gpt-test") >= 1
        (send,) = [s for s in in_trace if s.name == "chatflow.send"]
        assert send.attributes["chatflow.send.outcome"] == "sent"
        (agent,) = [s for s in in_trace if s.name == "invoke_agent Reminders"]
        assert (
            agent.attributes["gen_ai.conversation.id"]
            == receipt.attributes["gen_ai.conversation.id"]
        )
        for chat in (s for s in in_trace if s.name == "chat gpt-test"):
            assert chat.parent_span_id == agent.span_id
            assert chat.attributes["gen_ai.provider.name"] == "openai"
            assert chat.attributes["gen_ai.request.model"] == "gpt-test"
            assert chat.attributes["gen_ai.usage.input_tokens"] > 0
            assert chat.attributes["gen_ai.response.finish_reasons"] in (("stop",), ("tool_calls",))
    # The 429: an event with the wait on the send that met it, which still went out.
    floods = [s for s in _by_name(spans)["chatflow.send"] if s.events]
    assert len(floods) == 1
    (flood,) = floods
    assert flood.events == (("chatflow.send.flood_refused", {"chatflow.send.retry_after_s": 1.0}),)
    assert flood.attributes["chatflow.send.flood_retries"] == 1
    tools = _by_name(spans)["execute_tool schedule_message"]
    assert len(tools) == 1
    asked = tools[0].trace_id
    assert len([s for s in spans if s.trace_id == asked and s.name == "chat gpt-test"]) == 2
    # The scheduled message: a new trace, linked to tx 2 of the turn that scheduled it.
    (scheduled,) = _by_name(spans)["chatflow.scheduled"]
    assert scheduled.trace_id not in receipts and scheduled.parent_span_id == ""
    assert scheduled.links == ((asked, _tx2_of(spans, asked).span_id),), (
        scheduled.links,
        [(s.name, s.trace_id, s.span_id) for s in spans if s.trace_id == asked],
    )
    assert scheduled.attributes["chatflow.send.outcome"] == "sent"
    # The provider got the chat span's context with each call.
    chat_spans = {(s.trace_id, s.span_id) for s in _by_name(spans)["chat gpt-test"]}
    parents = [r.headers.get("traceparent", "") for r in openai.chat_requests]
    assert len(parents) == 4
    assert {tuple(p.split("-")[1:3]) for p in parents} <= chat_spans

    # -- a SIGKILL between tx 2 and the send -----------------------------------------
    telegram.inject("sendMessage", Fault.hanging())
    telegram.push_update(_update(9, *CRASH_CHAT))
    await telegram.wait_for_request("sendMessage", 5, within=30)
    before = set(receipts)

    def crash_turn_exported(spans: list[ExportedSpan]) -> bool:
        fresh = [t for t in _receipts(spans) if t not in before]
        return len(fresh) == 1 and _complete(spans, fresh[0], sent=False)

    spans = await otlp.wait_for(crash_turn_exported, within=30)
    (crashed,) = [t for t in _receipts(spans) if t not in before]
    await bot.kill()
    telegram.release_hangs()
    # From now on the batch waits 10 minutes: the resend's span can only arrive
    # through the flush at a clean stop (Bot.run's, the SDK's exit hook behind it).
    bot.env["OTEL_BSP_SCHEDULE_DELAY"] = "600000"
    await bot.start()
    sent = await telegram.wait_for_sent(6, within=30)
    assert sent[-1].text.startswith(RECOVERED_MARKER)

    def resent(spans: list[ExportedSpan]) -> bool:
        return any(s.name == "chatflow.resend" for s in spans)

    assert not resent(otlp.spans)
    assert await bot.stop() == 0
    spans = await otlp.wait_for(resent, within=30)
    (resend,) = _by_name(spans)["chatflow.resend"]
    assert resend.trace_id not in _receipts(spans) and resend.parent_span_id == ""
    assert resend.links == ((crashed, _tx2_of(spans, crashed).span_id),)
    assert resend.attributes["chatflow.send.outcome"] == "sent"
    assert resend.attributes["chatflow.send.marker"] is True

    # Exactly one trace per inbound message: four receipts, four turns, no turn elsewhere.
    receipts = _receipts(spans)
    assert len(receipts) == 4
    turns = _by_name(spans)["invoke_agent Reminders"]
    assert sorted(t.trace_id for t in turns) == sorted(receipts)

    # Logs made inside a span carry its ids: the flood's line names the send's span.
    records = [json.loads(line) for line in bot.log if line.startswith("{")]
    traced = [r for r in records if "trace_id" in r]
    assert all(r["trace_id"] in {s.trace_id for s in spans} for r in traced)
    (refused,) = [r for r in records if "refused for flood" in r["message"]]
    assert (refused["trace_id"], refused["span_id"]) == (flood.trace_id, flood.span_id)

    # Privacy: no content, no id, no name in anything exported.
    secrets = [text for _, text in (*CHATS, CRASH_CHAT)]
    secrets += [REMINDER, "Quentin", "4417", "gooseberry", "7700 900123", "PLUTO", "Zebulon"]
    secrets += [str(chat_id) for chat_id, _ in (*CHATS, CRASH_CHAT)]
    secrets += [telegram.token, openai.api_key, *extra_secrets.values()]
    leaks = [
        (span.name, value)
        for span in spans
        for value in span.values()
        if any(secret in value for secret in secrets)
    ]
    assert leaks == []
    assert otlp.content_types == {"application/x-protobuf"}
    assert {s.resource.get("service.name") for s in spans} == {"chatflow-e2e"}
