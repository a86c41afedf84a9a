"""The real bot (``python -m bot run``) with MCP servers: a stdio child and Streamable HTTP.

The fake model (an OpenAI-compatible server) calls the MCP tools; the fake
Bot API carries the user's messages and the bot's replies.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.botprocess import ROOT, BotProcess
from tests.fakes.mcp_http import FakeMCPHttpServer
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fakes.telegram_server import FakeTelegramServer

pytestmark = pytest.mark.e2e

DATA = Path(__file__).resolve().parents[1] / "data" / "telegram"
SECRET = "crm-api-key-SECRET-77c1"


def update(update_id: int, text: str) -> dict[str, Any]:
    payload: dict[str, Any] = copy.deepcopy(json.loads((DATA / "private_text.json").read_text()))
    payload["update_id"] = update_id
    payload["message"].update(text=text, message_id=100 + update_id)
    return payload


def tool_message(request_messages: list[dict[str, Any]]) -> str:
    """The content of the last ``tool`` message the model was sent."""
    tools = [m for m in request_messages if m.get("role") == "tool"]
    assert tools, request_messages
    return str(tools[-1]["content"])


@pytest.fixture
async def fakes() -> AsyncIterator[tuple[FakeTelegramServer, FakeOpenAIServer, FakeMCPHttpServer]]:
    async with (
        FakeTelegramServer() as telegram,
        FakeOpenAIServer() as model,
        FakeMCPHttpServer(prefix="kb_") as http,
    ):
        yield telegram, model, http


def bot_env(
    tmp_path: Path, telegram: FakeTelegramServer, model: FakeOpenAIServer, **extra: str
) -> dict[str, str]:
    return {
        "TELEGRAM_BOT_TOKEN": telegram.token,
        "TELEGRAM_API_BASE_URL": telegram.base_url,
        "OPENAI_API_KEY": model.api_key,
        "OPENAI_BASE_URL": model.base_url,
        "DEFAULT_MODEL": "gpt-4o-mini",
        "AGENTS_MODULE": "tests.fakes.mcp_agents",
        "MCP_E2E_PID_FILE": str(tmp_path / "crm.pid"),
        "MCP_E2E_REFUSE_FILE": str(tmp_path / "crm.refuse"),
        "MCP_E2E_SECRET": SECRET,
        **extra,
    }


async def test_the_model_calls_stdio_and_http_tools_and_a_killed_server_is_an_error_result(
    tmp_path: Path, fakes: tuple[FakeTelegramServer, FakeOpenAIServer, FakeMCPHttpServer]
) -> None:
    telegram, model, http = fakes
    bot = BotProcess(
        tmp_path / "data", bot_env(tmp_path, telegram, model, MCP_E2E_HTTP_URL=http.url)
    )
    model.add(
        model.call("crm_lookup_order", order_id="1001"),
        model.reply("Order 1001 is in transit."),
        model.call("kb_crm_lookup_order", order_id="2002"),
        model.reply("Order 2002 is in transit too."),
        model.call("crm_lookup_order", order_id="3003"),
        model.reply("The order system is down right now, sorry."),
        model.reply("Still here."),
    )
    await bot.start()
    try:
        telegram.push_update(update(1, "where is order 1001?"))
        (first,) = await telegram.wait_for_sent(1, within=30)
        assert first.text == "Order 1001 is in transit."
        offered = model.chat_requests[0].tool_names
        assert "crm_lookup_order" in offered and "kb_crm_lookup_order" in offered
        result = tool_message(model.chat_requests[1].messages)
        assert "order 1001 is in transit via FakeCarrier" in result
        assert "inbound=telegram:" in result and "session=telegram-" in result

        telegram.push_update(update(2, "and order 2002?"))
        sent = await telegram.wait_for_sent(2, within=30)
        assert sent[1].text == "Order 2002 is in transit too."
        assert "order 2002 is in transit" in tool_message(model.chat_requests[3].messages)

        # The stdio server dies (and stays dead) mid-conversation.
        (tmp_path / "crm.refuse").touch()
        os.kill(int((tmp_path / "crm.pid").read_text()), signal.SIGKILL)
        telegram.push_update(update(3, "and order 3003?"))
        sent = await telegram.wait_for_sent(3, within=30)
        assert sent[2].text == "The order system is down right now, sorry."
        assert "'crm'" in json.loads(tool_message(model.chat_requests[5].messages))["error"]

        telegram.push_update(update(4, "are you there?"))
        sent = await telegram.wait_for_sent(4, within=30)
        assert sent[3].text == "Still here."  # the conversation goes on
        assert await bot.stop() == 0
    finally:
        await bot.kill()
    log = "\n".join(bot.log)
    assert SECRET not in log
    assert "MCP server crm connected" in log and "MCP server kb connected" in log


async def test_shutdown_stops_the_stdio_child(
    tmp_path: Path, fakes: tuple[FakeTelegramServer, FakeOpenAIServer, FakeMCPHttpServer]
) -> None:
    telegram, model, _http = fakes
    bot = BotProcess(tmp_path / "data", bot_env(tmp_path, telegram, model))
    await bot.start()
    child = int((tmp_path / "crm.pid").read_text())
    os.kill(child, 0)  # alive while the bot runs
    assert await bot.stop() == 0
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


@pytest.mark.parametrize(
    "command",
    [pytest.param(["run", "--no-console"], id="run"), pytest.param(["chat"], id="chat")],
)
async def test_a_required_server_that_cannot_start_stops_the_bot_in_one_line(
    tmp_path: Path,
    fakes: tuple[FakeTelegramServer, FakeOpenAIServer, FakeMCPHttpServer],
    command: list[str],
) -> None:
    telegram, model, _http = fakes
    env = BotProcess(tmp_path / "data", bot_env(tmp_path, telegram, model, MCP_E2E_BROKEN="1")).env
    (tmp_path / "data").mkdir()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        *command,
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(b"where is my order?\n"), 60)
    assert proc.returncode == 1
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith("chatflow: MCPServerError: MCP server 'orders' failed to start: ")
    assert SECRET not in err.decode()
    assert not [r for r in telegram.requests if r.method == "getUpdates"]


async def test_doctor_lists_each_server_with_its_status_and_tools(
    tmp_path: Path, fakes: tuple[FakeTelegramServer, FakeOpenAIServer, FakeMCPHttpServer]
) -> None:
    telegram, model, http = fakes
    extra = {"MCP_E2E_HTTP_URL": http.url, "MCP_E2E_BROKEN": "1"}
    env = BotProcess(tmp_path / "data", bot_env(tmp_path, telegram, model, **extra)).env
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot",
        "doctor",
        cwd=ROOT,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    lines = {line[5:].split(":", 1)[0]: line for line in out.decode().splitlines()}
    assert lines["mcp crm"].startswith("ok   mcp crm: stdio: ")
    assert "9 tools: crm_lookup_order, count_items" in lines["mcp crm"]
    assert lines["mcp kb"].startswith(
        f"ok   mcp kb: http: {http.url}: 9 tools: kb_crm_lookup_order"
    )
    assert lines["mcp orders"].startswith("FAIL mcp orders: stdio: /nonexistent/orders-mcp: failed")
    assert proc.returncode == 1
