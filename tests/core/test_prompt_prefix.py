"""A stable prompt prefix (issue #30): between compactions, each request to the model starts
with the previous one, byte for byte -- instructions, tools in a fixed order, the summary,
then the turns -- as the ScriptedModel sees it and as the HTTP body is sent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from bot.core.agent import Agent
from bot.core.compaction import SUMMARY_INSTRUCTIONS, Compaction
from bot.core.models.base import ModelResponse
from bot.core.models.openai_compat import (
    OpenAICompatibleModel,
    _to_openai_tools,
    to_openai_messages,
)
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.core.runner import Runner
from bot.core.tools import tool
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.openai_summariser import Summariser

TURNS = 20


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped on 3 May"


@tool
def cancel_order(order_id: str, reason: str = "") -> str:
    """Cancel an order."""
    return f"order {order_id} cancelled"


def _agent(compaction: Compaction | None = None) -> Agent:
    billing = Agent(name="Billing", instructions="Handle refunds.", handoff_description="money")
    return Agent(
        name="Support",
        instructions="Help the user with orders.",
        tools=[lookup_order, cancel_order],
        handoffs=[billing],
        compaction=compaction,
    )


def _body(call: RecordedCall) -> str:
    """The JSON body ``OpenAICompatibleModel`` builds for ``call`` (same keys, same order)."""
    request: dict[str, Any] = {"model": call.model}
    if call.tools:
        request["tools"] = _to_openai_tools(call.tools, None)
    request["messages"] = to_openai_messages(call.system, call.messages)
    return json.dumps(request, ensure_ascii=False)


def _breaks(bodies: Sequence[str | bytes]) -> list[int]:
    """Indexes of the requests that do not start with the previous one (minus its ``]}``)."""
    return [
        index
        for index in range(1, len(bodies))
        if not bodies[index].startswith(bodies[index - 1][:-2])  # type: ignore[arg-type]
    ]


class TurnModel(ScriptedModel):
    """Answers every turn (a tool call on every fifth), summarises compaction requests."""

    async def _answer(self, record: RecordedCall) -> ModelResponse:
        if record.system == SUMMARY_INSTRUCTIONS:
            return ModelResponse(content="Summary: order ORD-1 shipped on 3 May.")
        last = record.messages[-1]
        if last.role.value == "user" and (last.content or "").endswith("lookup"):
            call = ScriptedModel.tool_call("lookup_order", order_id="ORD-1")
            return ModelResponse(content=None, tool_calls=[call])  # no usage: no calibration
        return ModelResponse(content=f"Answer to {last.content}")

    async def _play(self, model, system, messages, tools, on_text):  # type: ignore[no-untyped-def]
        self.add(self._answer)
        return await super()._play(model, system, messages, tools, on_text)


def _text(index: int) -> str:
    return f"Message {index}" + (" lookup" if index % 5 == 3 else "")


async def test_twenty_turns_keep_a_byte_identical_prefix() -> None:
    model = TurnModel()
    async with Runner(_agent(), model=model) as runner:
        for index in range(TURNS):
            await runner.run_async("s1", _text(index), {"turn": index})
    bodies = [_body(call) for call in model.requests]
    assert len(bodies) > TURNS  # the tool calls' second requests included
    assert _breaks(bodies) == []
    # Fixed order: function tools as declared, then the handoffs.
    assert model.requests[0].tool_names == ["lookup_order", "cancel_order", "transfer_to_billing"]


async def test_a_compaction_changes_the_prefix_once_then_it_is_stable_again() -> None:
    model = TurnModel()
    compaction = Compaction(trigger_tokens=300, keep_recent_turns=2)
    async with Runner(_agent(compaction), model=model) as runner:
        for index in range(TURNS):
            await runner.run_async("s1", _text(index))
            await runner.compactor.wait_idle()
    turns: list[str] = []
    compacted_before: list[bool] = []
    pending = False
    for call in model.requests:
        if call.system == SUMMARY_INSTRUCTIONS:
            pending = True
            continue
        turns.append(_body(call))
        compacted_before.append(pending)
        pending = False
    compactions = sum(compacted_before)
    assert compactions >= 2
    # The prefix changes exactly where a summary was written in between, nowhere else.
    assert _breaks(turns) == [i for i, after in enumerate(compacted_before) if after and i]
    # And the summary sits right after the instructions, in the one system message.
    last = json.loads(turns[-1])["messages"][0]
    assert last["role"] == "system"
    assert last["content"].startswith("Help the user with orders.\n\nSummary of the earlier")


class RawServer(FakeOpenAIServer):
    """The fake server, keeping each chat request's body exactly as it came over HTTP."""

    def __init__(self) -> None:
        super().__init__()
        self.raw: list[bytes] = []

    async def _handle(self, request: Request) -> Response:
        self.raw.append(await request.body())
        return await super()._handle(request)


async def test_the_http_bodies_of_twenty_turns_share_their_prefix_byte_for_byte() -> None:
    summariser = Summariser()
    server = RawServer()
    async with server:
        server.responder = summariser
        model = OpenAICompatibleModel(server.api_key, server.base_url)
        try:
            async with Runner(_agent(), model=model, stream_replies=False) as runner:
                for index in range(TURNS):
                    await runner.run_async("s1", f"Message {index}", {"turn": index})
        finally:
            await model.aclose()
    assert len(server.raw) == TURNS
    assert _breaks(server.raw) == []
    # The tools come before the messages, so only the end of the body grows.
    first = server.raw[0]
    assert first.index(b'"tools"') < first.index(b'"messages"')
    # What the provider could cache: all but the newest turn, more and more of each request.
    shares = [len(server.raw[i - 1]) / len(server.raw[i]) for i in range(1, TURNS)]
    assert shares[-1] > 0.9


def test_mcp_tools_are_offered_by_name_whatever_order_the_server_lists() -> None:
    from bot.core.mcp.servers import MCPServerStdio
    from bot.core.mcp.tools import MCPTool

    server = MCPServerStdio({"command": "true"}, name="shop")

    def listed(*names: str) -> tuple[MCPTool, ...]:
        return tuple(MCPTool(n, n, f"{n} tool", {"type": "object"}, server) for n in names)

    agent = Agent(name="A", instructions="", tools=[lookup_order], mcp_servers=[server])
    server._tools = listed("track", "refund", "address")
    first = [spec.name for spec in agent.tool_specs()]
    server._tools = listed("address", "track", "refund")  # listed again after a reconnect
    assert [spec.name for spec in agent.tool_specs()] == first
    assert first == ["lookup_order", "address", "refund", "track"]
