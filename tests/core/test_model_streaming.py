"""Streamed model calls: the OpenAI client over SSE, the scripted and offline models,
the one-chunk fallback, and the Runner handing only the final round's text on."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

import pytest

from bot.core.agent import Agent
from bot.core.messages import Message, Role
from bot.core.models import OfflineModel, OpenAICompatibleModel
from bot.core.models.base import (
    ModelResponse,
    StreamingChatModel,
    ToolSpec,
    complete_streaming,
)
from bot.core.models.scripted import PartialAnswer, ScriptedModel
from bot.core.runner import Runner
from bot.core.tools import tool
from bot.errors import ModelError
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse

LOOKUP = ToolSpec(
    name="lookup_order",
    description="Look an order up.",
    parameters={"type": "object", "properties": {"order_id": {"type": "string"}}},
)


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
async def client(server: FakeOpenAIServer) -> AsyncIterator[OpenAICompatibleModel]:
    model = OpenAICompatibleModel(server.api_key, server.base_url, max_retries=0)
    yield model
    await model.aclose()


async def stream(client: StreamingChatModel, pieces: list[str]) -> ModelResponse:
    return await client.stream(
        model="gpt-test",
        system="Be brief.",
        messages=[user("hi")],
        tools=[LOOKUP],
        on_text=pieces.append,
    )


async def test_text_arrives_in_pieces_and_the_response_is_whole(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    text = "Your order ships tomorrow, by noon."
    reply = server.reply(text, prompt_tokens=7, completion_tokens=3)
    reply.chunk_chars = 5
    server.add(reply)
    pieces: list[str] = []
    response = await stream(client, pieces)
    assert response.content == text
    assert pieces == [text[i : i + 5] for i in range(0, len(text), 5)]
    assert (response.usage.input_tokens, response.usage.output_tokens) == (7, 3)
    (request,) = server.chat_requests
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}
    assert len(request.chunk_times) == len(pieces) + 1  # the role delta comes first


async def test_tool_call_deltas_are_put_back_together(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    call = server.tool_call("lookup_order", {"order_id": "1234"}, call_id="call_a")
    bad = server.tool_call("lookup_order", '{"order_id": ', call_id="call_b")
    answer = server.tool_calls(call, bad)
    answer.chunk_chars = 3
    server.add(answer)
    pieces: list[str] = []
    response = await stream(client, pieces)
    assert pieces == []
    assert [c.id for c in response.tool_calls] == ["call_a", "call_b"]
    assert response.tool_calls[0].arguments == {"order_id": "1234"}
    assert response.invalid_tool_calls == {"call_b": "arguments were not valid JSON"}


async def test_a_stream_that_breaks_off_is_a_model_error(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    broken = server.reply("This answer never ends because the provider fails.")
    broken.break_after = 3
    server.add(broken)
    pieces: list[str] = []
    with pytest.raises(ModelError):
        await stream(client, pieces)
    assert pieces  # some text was handed out before the failure


async def test_an_error_before_the_stream_is_retried_like_a_plain_call(
    server: FakeOpenAIServer,
) -> None:
    model = OpenAICompatibleModel(server.api_key, server.base_url, max_retries=1)
    server.add(server.error(500), server.reply("second time lucky"))
    pieces: list[str] = []
    try:
        response = await stream(model, pieces)
    finally:
        await model.aclose()
    assert response.content == "second time lucky"
    assert "".join(pieces) == "second time lucky"


async def test_scripted_and_offline_models_stream_word_by_word() -> None:
    scripted = ScriptedModel([ScriptedModel.reply("one two  three")])
    pieces: list[str] = []
    assert (await stream(scripted, pieces)).content == "one two  three"
    assert pieces == ["one ", "two  ", "three"]
    offline: list[str] = []
    response = await stream(OfflineModel(), offline)
    assert len(offline) > 3 and "".join(offline) == response.content


class _CompleteOnly:
    """A model without ``stream``."""

    async def complete(
        self,
        *,
        model: str,
        system: str,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
    ) -> ModelResponse:
        return ModelResponse(content="all at once")


async def test_a_model_that_cannot_stream_gives_one_piece() -> None:
    pieces: list[str] = []
    response = await complete_streaming(
        _CompleteOnly(),
        model="m",
        system="",
        messages=[user("hi")],
        tools=[],
        on_text=pieces.append,
    )
    assert response.content == "all at once"
    assert pieces == ["all at once"]


class Recorder:
    """A ``ReplyStream`` that keeps what it was shown."""

    def __init__(self) -> None:
        self.rounds: list[tuple[str, list[str]]] = []

    def begin(self, agent: str) -> None:
        self.rounds.append((agent, []))

    def delta(self, text: str) -> None:
        self.rounds[-1][1].append(text)


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


async def test_runner_streams_each_round_and_commits_once() -> None:
    model = ScriptedModel(
        [
            ScriptedModel.calls(("lookup_order", {"order_id": "7"}), content="Let me look."),
            ScriptedModel.reply("It shipped."),
        ]
    )
    agent = Agent(name="Support", instructions="Help.", tools=[lookup_order])
    recorder = Recorder()
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s1", "where is 7?", stream=recorder)
    assert result.content == "It shipped."
    # The tool round's text is void once the next round begins: the final round is the answer.
    assert recorder.rounds == [
        ("Support", ["Let ", "me ", "look."]),
        ("Support", ["It ", "shipped."]),
    ]


@pytest.mark.parametrize(
    ("runner_on", "agent_on"),
    [
        pytest.param(False, True, id="stream-replies-off"),
        pytest.param(True, False, id="agent-opted-out"),
    ],
)
async def test_streaming_switched_off_calls_complete(runner_on: bool, agent_on: bool) -> None:
    model = ScriptedModel([ScriptedModel.reply("whole")])
    agent = Agent(name="Quiet", instructions="Help.", stream=agent_on)
    recorder = Recorder()
    async with Runner(agent, model=model, stream_replies=runner_on) as runner:
        result = await runner.run_async("s1", "hi", stream=recorder)
    assert result.content == "whole"
    assert recorder.rounds == []


async def test_a_failure_mid_stream_rolls_the_turn_back() -> None:
    model = ScriptedModel([PartialAnswer("half an ans", ModelError("boom", retryable=True))])
    recorder = Recorder()
    async with Runner(Agent(name="A", instructions="x"), model=model) as runner:
        with pytest.raises(ModelError):
            await runner.run_async("s1", "hi", stream=recorder)
        session = await runner.store.get_or_create("s1", runner.starting_agent)
    assert recorder.rounds == [("A", ["half ", "an ", "ans"])]
    assert session.history == []


async def test_a_server_that_ignores_stream_true_still_answers_in_one_piece(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    body = json.dumps(server.completion("no streaming here"))
    server.add(FakeResponse(body=body, raw=True))  # plain JSON to a stream=true request
    pieces: list[str] = []
    response = await stream(client, pieces)
    assert response.content == "no streaming here"
    assert pieces == ["no streaming here"]
