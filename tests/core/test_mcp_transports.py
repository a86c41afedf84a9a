"""The real transports: a stdio child process killed mid-conversation, Streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from bot import MCPServerStdio, MCPServerStreamableHttp
from bot.core.agent import Agent
from bot.core.messages import Role
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import Runner, RunResult
from bot.core.tools import ToolContext
from tests.fakes.mcp_http import FakeMCPHttpServer
from tests.fakes.mcp_server import stdio_params

SECRET = "sk-live-SECRET-do-not-log-4242"


class WatchedStdio(MCPServerStdio):
    """Tells the test each time it has (re)listed its tools."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.listed = asyncio.Event()

    async def _refresh(self, client: Any) -> None:
        await super()._refresh(client)
        self.listed.set()


def tool_results(result: RunResult) -> list[str]:
    return [m.content or "" for m in result.new_messages if m.role is Role.TOOL]


async def test_a_killed_stdio_server_gives_an_error_result_then_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    pid_file, refuse = tmp_path / "pid", tmp_path / "refuse"
    server = WatchedStdio(
        params=stdio_params(
            FAKE_MCP_PID_FILE=str(pid_file),
            FAKE_MCP_REFUSE_FILE=str(refuse),
            FAKE_MCP_SECRET=SECRET,
        ),
        name="crm",
    )
    agent = Agent("Support", "Help.", mcp_servers=[server])
    model = ScriptedModel()
    async with Runner(agent, model=model) as runner:
        model.add(ScriptedModel.call("secret_length"), ScriptedModel.reply("ok"))
        first = await runner.run_async("s-1", "check")
        assert tool_results(first) == [str(len(SECRET))]  # the env reached the child

        refuse.touch()  # the server stays dead after the kill
        server.listed.clear()
        os.kill(int(pid_file.read_text()), signal.SIGKILL)
        model.add(
            ScriptedModel.call("crm_lookup_order", order_id="1001"),
            ScriptedModel.reply("The order system is down, sorry."),
        )
        second = await runner.run_async("s-1", "where is 1001?")
        (error,) = tool_results(second)
        assert "'crm'" in json.loads(error)["error"]
        assert second.content == "The order system is down, sorry."  # the turn committed

        refuse.unlink()  # the server can start again: the backoff loop reconnects
        await asyncio.wait_for(server.listed.wait(), 30)
        model.add(
            ScriptedModel.call("crm_lookup_order", order_id="1001"), ScriptedModel.reply("ok")
        )
        third = await runner.run_async("s-1", "and now?")
        assert "order 1001 is in transit" in tool_results(third)[0]
        session = await runner.store.get("s-1")
        assert session is not None and len(session.history) == 12  # three whole turns
    assert SECRET not in caplog.text
    assert any("unavailable" in r.getMessage() for r in caplog.records)


async def test_streamable_http_sends_the_headers_and_survives_the_server_going_away(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with FakeMCPHttpServer() as http:
        server = MCPServerStreamableHttp(
            params={"url": http.url, "headers": {"Authorization": f"Bearer {SECRET}"}},
            name="kb",
            connect_timeout_seconds=10,
        )
        async with server:
            assert "crm_lookup_order" in [t.name for t in server.tools]
            assert server.describe() == f"http: http://127.0.0.1:{http.port}/mcp"
            lookup = next(t for t in server.tools if t.name == "crm_lookup_order")
            context = ToolContext(session_id="s-9", inbound_message_id="wa:1")
            text = await lookup.invoke(context, {"order_id": "7"})
            assert isinstance(text, str)  # text only: no image in this result
            assert "order 7 is in transit" in text and "session=s-9" in text
            assert all(h.get("authorization") == f"Bearer {SECRET}" for h in http.headers)
            await http.stop()
            failed = await lookup.invoke(context, {"order_id": "7"})
            assert isinstance(failed, str) and "error" in json.loads(failed)
    assert SECRET not in caplog.text and SECRET not in repr(server)


def test_describe_names_the_command_but_not_the_environment() -> None:
    server = MCPServerStdio(
        params={"command": "npx", "args": ["-y", "crm-mcp"], "env": {"CRM_KEY": SECRET}}
    )
    assert server.name == "npx crm-mcp"
    assert server.describe() == "stdio: npx -y crm-mcp"
    assert SECRET not in repr(server)
