"""Token usage as providers report it: parsed (cached and reasoning tokens included),
kept per call on ``RunResult.calls``, and recorded in ``chatflow_usage``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.models import OpenAICompatibleModel
from bot.core.models.base import ModelResponse, Usage
from bot.core.models.scripted import ScriptedModel
from bot.core.models.transcription import MeteredTranscriber, OpenAITranscriber
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.usage import (
    CallUsage,
    UsageTotals,
    daily_totals_in,
    record_usage_in,
    sender_tokens_on,
    session_totals_in,
)
from bot.errors import EmptyAnswerError
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse


def real_shaped_completion(text: str) -> dict[str, Any]:
    """A ``chat.completion`` as OpenAI returns it for a reasoning model with a cache hit."""
    return {
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "o4-mini-2025-04-16",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": None,
                    "annotations": [],
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 2006,
            "completion_tokens": 300,
            "total_tokens": 2306,
            "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 192,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
        "service_tier": "default",
        "system_fingerprint": None,
    }


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
async def client(server: FakeOpenAIServer) -> AsyncIterator[OpenAICompatibleModel]:
    model = OpenAICompatibleModel(server.api_key, server.base_url, max_retries=0)
    yield model
    await model.aclose()


async def ask(client: OpenAICompatibleModel, *, streamed: bool) -> ModelResponse:
    messages = [Message(role=Role.USER, content="hi")]
    pieces: list[str] = []
    if streamed:
        return await client.stream(
            model="o4-mini", system="Be brief.", messages=messages, tools=[], on_text=pieces.append
        )
    return await client.complete(model="o4-mini", system="Be brief.", messages=messages, tools=[])


def test_usage_sums_every_count() -> None:
    total = Usage(10, 5, cached_input_tokens=8, reasoning_tokens=2) + Usage(
        4, 1, cached_input_tokens=1, reasoning_tokens=1
    )
    assert total == Usage(14, 6, 20, cached_input_tokens=9, reasoning_tokens=3)


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
async def test_cached_and_reasoning_tokens_are_read_from_the_response(
    server: FakeOpenAIServer, client: OpenAICompatibleModel, streamed: bool
) -> None:
    server.add(FakeResponse(body=real_shaped_completion("hello")))
    response = await ask(client, streamed=streamed)
    assert response.content == "hello"
    assert response.usage == Usage(
        input_tokens=2006,
        output_tokens=300,
        total=2306,
        cached_input_tokens=1920,
        reasoning_tokens=192,
    )


@pytest.mark.parametrize("streamed", [False, True], ids=["complete", "stream"])
async def test_a_provider_without_details_reports_zero_cached_and_reasoning_tokens(
    server: FakeOpenAIServer, client: OpenAICompatibleModel, streamed: bool
) -> None:
    server.add(server.reply("hello", prompt_tokens=40, completion_tokens=7))
    response = await ask(client, streamed=streamed)
    assert response.usage == Usage(40, 7, 47)


async def test_the_fake_server_reports_cached_tokens_like_openai(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    server.add(server.reply("hi", prompt_tokens=1500, cached_tokens=1024, reasoning_tokens=3))
    response = await ask(client, streamed=True)
    assert (response.usage.cached_input_tokens, response.usage.reasoning_tokens) == (1024, 3)


@pytest.mark.parametrize(
    ("reported", "expected"),
    [
        pytest.param(
            {
                "type": "tokens",
                "input_tokens": 53,
                "output_tokens": 12,
                "total_tokens": 65,
                "input_token_details": {"audio_tokens": 53, "text_tokens": 0},
            },
            Usage(53, 12, 65),
            id="gpt-4o-transcribe-tokens",
        ),
        pytest.param({"type": "duration", "seconds": 3.2}, None, id="whisper-1-seconds"),
        pytest.param(None, None, id="no-usage"),
    ],
)
async def test_a_transcription_hands_back_the_token_usage_it_reports(
    server: FakeOpenAIServer, reported: dict[str, Any] | None, expected: Usage | None
) -> None:
    server.transcripts.append("where is my order")
    server.transcription_usage = reported
    transcriber = OpenAITranscriber(server.api_key, server.base_url, model="gpt-4o-transcribe")
    try:
        assert isinstance(transcriber, MeteredTranscriber)
        heard = await transcriber.transcribe_metered(
            b"OggS-fake", file_name="voice.ogg", mime_type="audio/ogg"
        )
    finally:
        await transcriber.aclose()
    assert heard.text == "where is my order"
    assert heard.usage == expected  # nothing estimated when seconds or nothing is given


# -- per call, on the RunResult ---------------------------------------------------------


async def test_a_turn_keeps_each_model_call_with_its_agent_and_model() -> None:
    model = ScriptedModel()
    first = ScriptedModel.calls(("nothing_here", {}))
    first.usage = Usage(100, 10, cached_input_tokens=64)
    model.add(first, ScriptedModel.reply("done", usage=Usage(150, 20, reasoning_tokens=5)))
    agent = Agent(name="Helper", instructions="Help.", model="gpt-4o-mini")
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s1", "hi")
    assert result.calls == [
        CallUsage("chat", "gpt-4o-mini", "Helper", Usage(100, 10, cached_input_tokens=64)),
        CallUsage("chat", "gpt-4o-mini", "Helper", Usage(150, 20, reasoning_tokens=5)),
    ]
    assert result.usage == Usage(250, 30, 280, cached_input_tokens=64, reasoning_tokens=5)


async def test_a_failed_turn_still_hands_out_the_calls_it_made() -> None:
    model = ScriptedModel()
    model.add(ScriptedModel.reply("", usage=Usage(700, 2)))
    calls: list[CallUsage] = []
    agent = Agent(name="Helper", instructions="Help.", model="gpt-4o-mini")
    async with Runner(agent, model=model) as runner:
        with pytest.raises(EmptyAnswerError):
            await runner.run_async("s1", "hi", calls=calls)
    assert calls == [CallUsage("chat", "gpt-4o-mini", "Helper", Usage(700, 2))]


# -- the table --------------------------------------------------------------------------


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteSessionStore]:
    made = SQLiteSessionStore(tmp_path / "chatflow.db")
    await made.open()
    yield made
    await made.close()


async def test_recorded_calls_sum_per_conversation_day_and_sender(
    store: SQLiteSessionStore,
) -> None:
    noon = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    # 20:30 in New York on 1 March is 01:30 UTC on 2 March: days are UTC days.
    late = datetime(2026, 3, 1, 20, 30, tzinfo=timezone(timedelta(hours=-5)))
    async with store.transaction() as tx:
        for session, kind, model, usage, sender, at in [
            ("s1", "chat", "gpt-4o-mini", Usage(100, 10, cached_input_tokens=80), "d1", noon),
            ("s1", "transcription", "gpt-4o-transcribe", Usage(50, 5), "d1", noon),
            ("s1", "chat", "gpt-4o-mini", Usage(200, 20, reasoning_tokens=4), "d1", late),
            ("s2", "chat", "gpt-4o-mini", Usage(7, 1), "d2", noon),
        ]:
            await record_usage_in(
                tx,
                session_id=session,
                agent="Helper",
                kind=kind,
                model=model,
                usage=usage,
                sender=sender,
                at=at,
            )
    async with store.transaction() as tx:
        by_model = await session_totals_in(tx, "s1")
        days = await daily_totals_in(tx)
        since = await daily_totals_in(tx, "2026-03-02")
        d1_first = await sender_tokens_on(tx, "d1", "2026-03-01")
        d1_second = await sender_tokens_on(tx, "d1", noon.date() + timedelta(days=1))
        nobody = await sender_tokens_on(tx, "d3", "2026-03-01")
    assert by_model == {
        "gpt-4o-mini": UsageTotals(300, 80, 30, 4, 2),
        "gpt-4o-transcribe": UsageTotals(50, 0, 5, 0, 1),
    }
    assert [(r.day, r.model, r.totals.total) for r in days] == [
        ("2026-03-01", "gpt-4o-mini", 118),
        ("2026-03-01", "gpt-4o-transcribe", 55),
        ("2026-03-02", "gpt-4o-mini", 220),
    ]
    assert [r.day for r in since] == ["2026-03-02"]
    assert (d1_first, d1_second, nobody) == (165, 220, 0)


async def test_a_rolled_back_transaction_records_nothing(store: SQLiteSessionStore) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as tx:
            await record_usage_in(
                tx, session_id="s1", agent="A", kind="chat", model=None, usage=Usage(5, 5)
            )
            raise RuntimeError("the turn failed before its commit")
    async with store.transaction() as tx:
        assert await session_totals_in(tx, "s1") == {}
