"""MCP servers at the unit level: the SDK's in-process server, the Runner, a scripted model."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any, Literal

import pytest
from mcp.server.mcpserver import Context
from mcp.server.mcpserver import MCPServer as SDKServer
from mcp.server.mcpserver.utilities.types import Image
from pydantic import AnyUrl, BaseModel

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


# -- issue 24: change streams, refreshes, schemas, filters, images -----------------------


class Folder(BaseModel):
    """A recursive argument, as a Python-SDK server lists one (``$defs`` and ``$ref`` kept)."""

    name: str
    children: list[Folder] = []


def fast_backoff() -> Any:
    """Re-listen and reconnect waits of 10 ms (doubling), not 0.5 s."""
    from bot.core.mcp.retry import Backoff

    return Backoff(first=0.01, limit=0.04)


def ending_listen_streams(sdk: SDKServer) -> list[int]:
    """Make ``sdk`` answer every ``subscriptions/listen`` at once with its result: the
    spec's graceful close of the change stream (as a proxy capping responses does)."""
    opened: list[int] = []

    async def close_at_once(ctx: Any, params: Any) -> Any:
        from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY

        opened.append(1)
        return types.SubscriptionsListenResult(_meta={SUBSCRIPTION_ID_META_KEY: ctx.request_id})

    import mcp_types as types

    sdk._lowlevel_server.add_request_handler(
        "subscriptions/listen", types.SubscriptionsListenRequestParams, close_at_once
    )
    return opened


async def test_a_closed_change_stream_keeps_the_connection_and_the_calls_in_flight(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    sdk = build_fake_server()
    opened = ending_listen_streams(sdk)
    server = InProcessServer(sdk)
    server._backoff = fast_backoff()
    context = ToolContext(session_id="s-1", inbound_message_id="telegram:5:77")
    async with server:
        slow = next(t for t in server.tools if t.name == "slow")
        lookup = next(t for t in server.tools if t.name == "crm_lookup_order")
        in_flight = asyncio.create_task(slow.invoke(context, {"seconds": 0.3}))
        answers = [await lookup.invoke(context, {"order_id": str(n)}) for n in range(20)]
        assert await in_flight == "done"
        assert all("is in transit" in str(answer) for answer in answers), answers
        assert server.status == "connected"
        assert len(opened) >= 2  # listened to again after each close
    assert not [r for r in caplog.records if "unavailable" in r.getMessage()]


class GatedRefreshes(InProcessServer):
    """Counts the tool-list refreshes and holds each until the test opens the gate."""

    def __init__(self, sdk: SDKServer, **options: Any) -> None:
        super().__init__(sdk, **options)
        self.entered = 0
        self.started = asyncio.Event()
        self.gate = asyncio.Event()
        self.gate.set()

    async def _refresh(self, client: Any) -> None:
        self.entered += 1
        self.started.set()
        await self.gate.wait()
        await super()._refresh(client)


async def test_a_burst_of_list_changed_notifications_is_coalesced_into_one_refresh() -> None:
    sdk = build_fake_server()

    @sdk.tool()
    async def announce(times: int, ctx: Context) -> str:
        """Say the tool list changed, ``times`` times."""
        for _ in range(times):
            await ctx.notify_tools_changed()
        return "sent"

    server = GatedRefreshes(sdk)
    context = ToolContext(session_id="s-1")
    async with server:
        await asyncio.wait_for(server.refreshed.wait(), 10)  # the one after the stream opened
        (announcer,) = [t for t in server.tools if t.name == "announce"]
        (counter,) = [t for t in server.tools if t.name == "count_items"]
        server.gate.clear()
        server.started.clear()
        before = server.entered
        assert await announcer.invoke(context, {"times": 50}) == "sent"
        await asyncio.wait_for(server.started.wait(), 10)
        await counter.invoke(context, {"count": 1})  # every notification has arrived
        held = server.entered - before
        server.refreshed.clear()
        server.gate.set()
        await asyncio.wait_for(server.refreshed.wait(), 10)
        await counter.invoke(context, {"count": 1})
    assert held == 1  # one refresh running, the rest folded into one more
    assert server.entered - before <= 2


async def test_a_change_announced_while_the_first_list_is_on_its_way_is_not_lost() -> None:
    class AnnouncesDuringList(SDKServer):
        announced = False

        async def _handle_list_tools(self, ctx: Any, params: Any) -> Any:
            listed = await super()._handle_list_tools(ctx, params)
            if not self.announced:
                self.announced = True
                self.add_tool(lambda: "late", name="late_tool", description="Late.")
                await ctx.session.send_tool_list_changed()
            return listed

    server = InMode(build_fake_server(cls=AnnouncesDuringList), "legacy")
    async with server:
        for _ in range(3):
            if "late_tool" in [t.name for t in server.tools]:
                break
            server.refreshed.clear()
            await asyncio.wait_for(server.refreshed.wait(), 5)
        assert "late_tool" in [t.name for t in server.tools]


class TaskOnlySlow(SDKServer):
    """Marks ``slow`` as a tool that must be called as a task (2025-11-25 ``execution``)."""

    async def list_tools(self) -> list[Any]:
        import mcp_types as types

        required = types.ToolExecution(task_support="required")
        return [
            tool.model_copy(update={"execution": required}) if tool.name == "slow" else tool
            for tool in await super().list_tools()
        ]


async def test_a_tool_the_server_runs_only_as_a_task_is_not_offered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)

    # taskSupport exists on the 2025-11-25 wire only.
    server = InMode(build_fake_server(cls=TaskOnlySlow), "legacy")
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel([ScriptedModel.reply("Hi."), ScriptedModel.reply("Hi again.")])
    async with Runner(agent, model=model) as runner:
        await runner.run_async("s-1", "hi")
        server.refreshed.clear()
        await server._refresh(server._client)  # a second listing warns no more
        await runner.run_async("s-1", "hi")
    offered = model.requests[0].tool_names
    assert "slow" not in offered and "crm_lookup_order" in offered
    warnings = [r.getMessage() for r in caplog.records if "'slow'" in r.getMessage()]
    assert len(warnings) == 1 and "task" in warnings[0]


async def test_null_for_an_optional_argument_is_taken_as_not_given() -> None:
    sdk = build_fake_server()

    @sdk.tool()
    def search(query: str, verbose: bool = False) -> str:
        """Search the knowledge base."""
        return f"{query} verbose={verbose}"

    server = InProcessServer(sdk)
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel(
        [
            ScriptedModel.calls(
                ("search", {"query": "refunds", "verbose": None}),
                ("search", {"query": None, "verbose": True}),
            ),
            ScriptedModel.reply("Found it."),
        ]
    )
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s-1", "how do refunds work?")
    answered, refused = tool_results(result)
    assert answered == "refunds verbose=False"
    assert "invalid arguments for tool 'search'" in json.loads(refused)["error"]


class InMode(InProcessServer):
    """Connects in the given protocol mode (``"legacy"``: the 2025 handshake)."""

    def __init__(self, sdk: SDKServer, mode: str, **options: Any) -> None:
        super().__init__(sdk, **options)
        self.mode = mode

    def _new_client(self) -> Any:
        client = super()._new_client()
        client.mode = self.mode
        return client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_client_introduces_itself_as_chatflow_with_its_version(mode: str) -> None:
    from importlib.metadata import version

    async with InMode(build_fake_server(), mode) as server:
        (tool_,) = [t for t in server.tools if t.name == "client_name"]
        named = await tool_.invoke(ToolContext(session_id="s-1"), {})
    assert named == f"chatflow/{version('chatflow-bot')}"


async def test_tool_filter_and_prefix_choose_and_rename_a_servers_tools() -> None:
    from bot import create_static_tool_filter

    crm = InProcessServer(
        build_fake_server(),
        name="crm",
        tool_name_prefix="crm_",
        tool_filter=create_static_tool_filter(
            allowed_tool_names=["crm.lookup_order", "count_items", "slow"],
            blocked_tool_names=["slow"],
        ),
    )
    erp = InProcessServer(
        build_fake_server(),
        name="erp",
        tool_filter={"blocked_tool_names": ["big_report", "broken"]},
    )
    agent = Agent("Support", "Help.", mcp_servers=[crm, erp])
    model = ScriptedModel(
        [
            ScriptedModel.calls(
                ("crm_crm_lookup_order", {"order_id": "7"}), ("count_items", {"count": 2})
            ),
            ScriptedModel.reply("Done."),
        ]
    )
    async with Runner(agent, model=model) as runner:  # no clash: the prefix tells them apart
        result = await runner.run_async("s-1", "order 7?")
    offered = model.requests[0].tool_names
    assert sorted(t.name for t in crm.tools) == ["crm_count_items", "crm_crm_lookup_order"]
    assert "crm_lookup_order" in offered and "count_items" in offered  # erp's, unprefixed
    assert "big_report" not in offered and "broken" not in offered and "slow" in offered
    looked_up, counted = tool_results(result)
    assert "order 7 is in transit" in looked_up
    assert json.loads(counted) == {"count": 2, "double": 4}  # erp's count_items


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        pytest.param({"tool_filter": {"allowed": ["x"]}}, "unknown tool_filter key", id="bad-key"),
        pytest.param(
            {"tool_filter": {"blocked_tool_names": "x"}}, "list of names", id="bare-string"
        ),
        pytest.param({"tool_filter": lambda ctx, tool: True}, "not supported", id="callable"),
        pytest.param({"tool_name_prefix": "crm."}, "tool_name_prefix", id="bad-prefix"),
        pytest.param({"max_images": -1}, "max_images", id="negative-images"),
    ],
)
def test_wrong_filter_or_prefix_is_refused_naming_the_server(
    options: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        InProcessServer(build_fake_server(), name="crm", **options)
    assert "'crm'" in str(caught.value)


async def test_images_of_one_result_are_bounded(tmp_path: Path) -> None:
    sdk = build_fake_server()

    @sdk.tool()
    def charts() -> list[Image]:
        """Twelve charts."""
        return [Image(data=jpeg_bytes(padding=1000 + n), format="jpeg") for n in range(12)]

    server = InProcessServer(sdk)
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel([ScriptedModel.call("charts"), ScriptedModel.reply("Here.")])
    settings = ModelSettings(media_dir=str(tmp_path / "media"))
    async with Runner(agent, model=model, model_settings=settings) as runner:
        result = await runner.run_async("s-1", "draw")
    assert len(result.attachments) == 4
    (text,) = tool_results(result)
    assert "8 more image(s) left out" in text


async def test_the_gemini_route_sends_only_what_geminis_schema_has() -> None:
    from bot.core.models.openai_compat import OpenAICompatibleModel, gemini_compatible_schema
    from tests.fakes.openai_server import FakeOpenAIServer

    sdk = build_fake_server()

    @sdk.tool(name="gzip-file-as-resource")
    def gzip_file(
        name: str,
        data: AnyUrl,
        output_type: Literal["resourceLink", "resource"] = "resourceLink",
        tree: Folder | None = None,
    ) -> str:
        """Compress a file (server-everything's shape: a ``uri`` string, a recursive model)."""
        return "ok"

    gemini_fields = {
        "type", "format", "title", "description", "nullable", "enum", "items", "minItems",
        "maxItems", "properties", "required", "minProperties", "maxProperties",
        "propertyOrdering", "minLength", "maxLength", "pattern", "minimum", "maximum",
        "anyOf", "default", "example",
    }  # fmt: skip

    def problems(node: Any, where: str) -> list[str]:
        found = [f"{where}.{key}" for key in node if key not in gemini_fields]
        if node.get("type") == "string" and node.get("format") not in (None, "enum", "date-time"):
            found.append(f"{where}.format={node['format']}")
        for name, child in (node.get("properties") or {}).items():
            found += problems(child, f"{where}.{name}")
        for n, child in enumerate(node.get("anyOf") or []):
            found += problems(child, f"{where}[{n}]")
        if isinstance(node.get("items"), dict):
            found += problems(node["items"], f"{where}[]")
        return found

    async with FakeOpenAIServer() as fake:
        fake.add(fake.reply("ok"))
        gemini = OpenAICompatibleModel(
            fake.api_key, fake.base_url, schema_transform=gemini_compatible_schema
        )
        agent = Agent(
            "Support", "Help.", model="gemini-2.5-flash", mcp_servers=[InProcessServer(sdk)]
        )
        try:
            async with Runner(agent, model=gemini) as runner:
                await runner.run_async("s-1", "zip it")
        finally:
            await gemini.aclose()
        tools = fake.chat_requests[0].body["tools"]
    sent = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    schema = sent["gzip-file-as-resource"]
    assert problems(schema, "parameters") == []
    assert schema["properties"]["output_type"]["enum"] == ["resourceLink", "resource"]
    assert schema["properties"]["tree"]["nullable"] is True
    assert all(problems(params, name) == [] for name, params in sent.items())


async def test_a_tool_whose_schema_cannot_be_offered_is_left_out_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)

    class Combinators(SDKServer):
        async def list_tools(self) -> list[Any]:
            tools = await super().list_tools()
            shapes = {
                # Two ways to name the order: lifted into one object for OpenAI.
                "count_items": {
                    "type": "object",
                    "properties": {"count": {"type": "integer"}},
                    "allOf": [
                        {"anyOf": [{"required": ["count"]}, {"required": ["order_id"]}]},
                        {"properties": {"order_id": {"type": "string"}}},
                    ],
                    "if": {"required": ["count"]},
                    "then": {"properties": {"count": {"minimum": 1}}},
                },
                # No object could ever satisfy it: left out.
                "big_report": {
                    "type": "object",
                    "anyOf": [{"type": "string"}, {"type": "integer"}],
                },
            }
            return [
                tool.model_copy(update={"input_schema": shapes[tool.name]})
                if tool.name in shapes
                else tool
                for tool in tools
            ]

    server = InProcessServer(build_fake_server(cls=Combinators))
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel([ScriptedModel.reply("Hi."), ScriptedModel.reply("Hi.")])
    async with Runner(agent, model=model) as runner:
        await runner.run_async("s-1", "hi")
        await server._refresh(server._client)
        await runner.run_async("s-1", "hi")
    specs = {spec.name: spec.parameters for spec in model.requests[0].tools}
    assert "big_report" not in specs and "crm_lookup_order" in specs
    lifted = specs["count_items"]
    assert not {"anyOf", "allOf", "oneOf", "enum", "not", "if"} & set(lifted)
    assert lifted["type"] == "object"
    assert set(lifted["properties"]) == {"count", "order_id"}
    assert "required" not in lifted  # either one will do
    warnings = [r.getMessage() for r in caplog.records if "'big_report'" in r.getMessage()]
    assert len(warnings) == 1 and "left out" in warnings[0]
