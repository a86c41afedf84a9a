"""MCP servers at the unit level: the SDK's in-process server, the Runner, a scripted model."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import Context
from mcp.server.mcpserver import MCPServer as SDKServer

from bot import ImagePart, MCPServer, MCPServerError, MCPServerStdio
from bot.core.agent import Agent, tool
from bot.core.media_store import MediaStore
from bot.core.messages import Role
from bot.core.models.routing import ModelSettings
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner, RunResult
from bot.core.tools import ToolContext
from bot.errors import ConfigurationError
from tests.fakes.mcp_server import build_fake_server
from tests.fakes.media_files import jpeg_bytes


class InProcessServer(MCPServer):
    """Our MCPServer over the SDK's in-memory client (no process, no socket)."""

    def __init__(self, sdk: SDKServer, name: str = "crm", **options: Any) -> None:
        super().__init__(name=name, **options)
        self.sdk = sdk
        self.refreshed = asyncio.Event()

    def _target(self) -> Any:
        return self.sdk

    async def _refresh(self, client: Any) -> None:
        await super()._refresh(client)
        self.refreshed.set()


def status_of(server: MCPServer) -> str:
    return server.status


def tool_results(result: RunResult) -> list[str]:
    return [m.content or "" for m in result.new_messages if m.role is Role.TOOL]


@tool
def count_items(count: int) -> int:
    """The agent's own tool, named like one of the server's."""
    return count


async def test_the_servers_tools_are_offered_beside_the_agents_own_and_called_with_meta() -> None:
    server = InProcessServer(build_fake_server())
    agent = Agent(
        "Support", "Help.", tools=[tool(name="ping")(lambda: "pong")], mcp_servers=[server]
    )
    model = ScriptedModel(
        [
            ScriptedModel.call("crm_lookup_order", order_id="1001"),
            ScriptedModel.reply("On its way."),
        ]
    )
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s-1", "where is 1001?", inbound_message_id="telegram:5:77")
    offered = model.requests[0].tool_names
    assert (
        offered[0] == "ping" and "crm_lookup_order" in offered and "apply_discount" not in offered
    )
    (text,) = tool_results(result)
    assert "order 1001 is in transit" in text
    assert "session=s-1" in text and "inbound=telegram:5:77" in text
    assert result.content == "On its way."
    assert server.status == "closed"


async def test_an_image_the_server_returns_is_attached_to_the_reply(tmp_path: Path) -> None:
    server = InProcessServer(build_fake_server())
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel([ScriptedModel.call("sales_chart"), ScriptedModel.reply("Here it is.")])
    settings = ModelSettings(media_dir=str(tmp_path / "media"))
    async with Runner(agent, model=model, model_settings=settings) as runner:
        result = await runner.run_async("s-1", "show me sales")
    (part,) = result.attachments  # sent with the reply, as a function tool's file
    assert isinstance(part, ImagePart) and part.mime_type == "image/jpeg"
    assert await MediaStore(tmp_path / "media").read(part.sha256) == jpeg_bytes()
    (text,) = tool_results(result)
    assert "attached: the user receives it with your answer" in text


async def test_arguments_are_checked_against_the_schema_before_the_server_sees_them() -> None:
    sdk = build_fake_server()
    calls: list[int] = []

    @sdk.tool()
    def reserve(quantity: int) -> str:
        """Reserve stock."""
        calls.append(quantity)
        return "reserved"

    server = InProcessServer(sdk)
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel(
        [
            ScriptedModel.calls(("reserve", {"quantity": "many"}), ("reserve", {"qty": 1})),
            ScriptedModel.reply("Sorry."),
        ]
    )
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s-1", "reserve some")
    wrong_type, missing = (json.loads(t)["error"] for t in tool_results(result))
    assert "invalid arguments for tool 'reserve'" in wrong_type and "quantity" in wrong_type
    assert "quantity" in missing and "required" in missing
    assert calls == []


async def test_a_call_past_its_timeout_is_an_error_result_and_the_turn_goes_on() -> None:
    sdk = build_fake_server()
    never = asyncio.Event()

    @sdk.tool()
    async def hang() -> str:
        """Never answers."""
        await never.wait()
        return "unreachable"

    server = InProcessServer(sdk, client_session_timeout_seconds=0.2)
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel([ScriptedModel.call("hang"), ScriptedModel.reply("It is slow today.")])
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s-1", "hello")
    (text,) = tool_results(result)
    assert json.loads(text) == {"error": "tool 'hang' timed out after 0.2 s"}
    assert result.content == "It is slow today."


async def test_a_server_error_and_an_oversized_result_reach_the_model_as_readable_text() -> None:
    server = InProcessServer(build_fake_server(), max_output_chars=1000)
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel(
        [ScriptedModel.calls(("broken", {}), ("big_report", {})), ScriptedModel.reply("Hm.")]
    )
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s-1", "report")
    error, report = tool_results(result)
    assert "error" in json.loads(error)
    assert report.startswith("x" * 1000) and len(report) < 1100 and "characters cut" in report


async def test_the_tool_list_is_refreshed_when_the_server_says_it_changed() -> None:
    server = InProcessServer(build_fake_server())
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel(
        [
            ScriptedModel.call("add_discount_tool"),
            ScriptedModel.reply("Added."),
            ScriptedModel.call("apply_discount", code="SPRING"),
            ScriptedModel.reply("Applied."),
        ]
    )
    async with Runner(agent, model=model) as runner:
        server.refreshed.clear()
        await runner.run_async("s-1", "add a discount tool")
        await asyncio.wait_for(server.refreshed.wait(), 10)
        result = await runner.run_async("s-1", "use it")
    assert "apply_discount" in model.requests[2].tool_names
    assert tool_results(result) == ["discount SPRING applied"]


async def test_an_mcp_tool_named_like_the_agents_own_stops_start_up_naming_both() -> None:
    server = InProcessServer(build_fake_server())
    agent = Agent("Support", "Help.", tools=[count_items], mcp_servers=[server])
    runner = Runner(agent, model=ScriptedModel())
    with pytest.raises(ConfigurationError) as caught:
        await runner.connect_mcp_servers()
    message = str(caught.value)
    assert "'crm'" in message and "'count_items'" in message and "function tool" in message
    assert server.status == "closed"
    await runner.aclose()


async def test_two_servers_of_one_agent_with_one_tool_name_clash_too() -> None:
    first = InProcessServer(build_fake_server(), name="crm")
    second = InProcessServer(build_fake_server(), name="erp")
    agent = Agent("Support", "Help.", mcp_servers=[first, second])
    with pytest.raises(ConfigurationError, match=r"'erp'.*clashes with MCP server 'crm'"):
        async with Runner(agent, model=ScriptedModel()):
            pass


def missing_command(**options: Any) -> MCPServerStdio:
    return MCPServerStdio(
        params={"command": "/nonexistent/mcp-server", "env": {"CRM_TOKEN": "tok-SECRET-123"}},
        name="orders",
        **options,
    )


async def test_a_required_server_that_cannot_start_stops_start_up_in_one_line() -> None:
    agent = Agent("Support", "Help.", mcp_servers=[missing_command()])
    with pytest.raises(MCPServerError) as caught:
        async with Runner(agent, model=ScriptedModel()):
            pass
    message = str(caught.value)
    assert message.startswith("MCP server 'orders' failed to start: ")
    assert "\n" not in message and "tok-SECRET-123" not in message
    assert caught.value.server == "orders"


async def test_an_optional_server_that_cannot_start_is_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    broken = missing_command(optional=True)
    working = InProcessServer(build_fake_server())
    agent = Agent("Support", "Help.", mcp_servers=[broken, working])
    model = ScriptedModel([ScriptedModel.reply("Hi.")])
    async with Runner(agent, model=model) as runner:
        assert not broken.is_connected and broken.status == "reconnecting"
        await runner.run_async("s-1", "hi")
    assert "crm_lookup_order" in model.requests[0].tool_names
    warning = [r for r in caplog.records if "it is optional" in r.getMessage()]
    assert warning and "'orders'" in warning[0].getMessage()
    assert "tok-SECRET-123" not in caplog.text
    assert "tok-SECRET-123" not in repr(broken)
    assert status_of(broken) == "closed"


async def test_a_slow_server_fails_start_up_after_its_timeout() -> None:
    hung = MCPServerStdio(
        params={"command": "sleep", "args": ["30"]}, name="stuck", connect_timeout_seconds=0.5
    )
    with pytest.raises(MCPServerError, match=r"'stuck' failed to start: no answer within 0.5 s"):
        await hung.connect()
    assert hung.status == "closed"


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        pytest.param({"command": ""}, "command", id="empty-command"),
        pytest.param({"command": "x", "args": [1]}, "args", id="non-string-arg"),
        pytest.param({"command": "x", "env": {"TOKEN": 42}}, "TOKEN", id="non-string-env"),
    ],
)
def test_wrong_stdio_params_are_refused_naming_the_key_not_the_value(
    params: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        MCPServerStdio(params=params)  # type: ignore[arg-type]
    assert "42" not in str(caught.value)


def test_an_agent_refuses_something_that_is_not_an_mcp_server() -> None:
    with pytest.raises(TypeError, match="mcp_servers"):
        Agent("Support", "Help.", mcp_servers=[object()])  # type: ignore[list-item]


async def test_a_legacy_notification_also_refreshes_the_tools() -> None:
    sdk = build_fake_server()

    @sdk.tool()
    async def add_legacy_tool(ctx: Context) -> str:
        """Add a tool and tell a 2025-era client through the session."""
        sdk.add_tool(lambda: "new", name="legacy_new", description="New.")
        await ctx.session.send_tool_list_changed()
        return "added"

    class Legacy(InProcessServer):
        def _new_client(self) -> Any:
            from mcp import Client

            return Client(self.sdk, mode="legacy", message_handler=self._on_message)

    server = Legacy(sdk)
    async with server:
        server.refreshed.clear()
        (adder,) = [t for t in server.tools if t.name == "add_legacy_tool"]
        assert await adder.invoke(ToolContext(session_id="s-1"), {}) == "added"
        await asyncio.wait_for(server.refreshed.wait(), 10)
        assert "legacy_new" in [t.name for t in server.tools]
