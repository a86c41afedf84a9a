"""Building and closing a Runner: agent and model validation, model settings (explicit
or from the environment, B1), secrets kept out of logs, and ``async with``."""

from __future__ import annotations

import asyncio
import logging

import pytest

from bot.core.agent import Agent
from bot.core.models import OFFLINE_PREFIX, ModelSettings, ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.in_memory import SessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import ConfigurationError, ModelError
from tests.core.runner_support import (
    SID,
    clear_tool_log,
    make_agents,
    server,
    sqlite_store,
    tool_log,
)
from tests.fakes.openai_server import FakeOpenAIServer

# The fixtures, imported for this module's tests.
__all__ = ["clear_tool_log", "server", "sqlite_store"]


# -- construction and model validation ------------------------------------------------------


def test_duplicate_agent_names_are_rejected() -> None:
    a = Agent("Support", "one")
    b = Agent("Support", "two")
    root = Agent("Root", "", handoffs=[a])
    a.handoffs = (b,)
    with pytest.raises(ValueError, match="Support"):
        Runner(root, model=ScriptedModel())


def test_all_reachable_agents_are_registered_as_resolver(sqlite_store: SQLiteSessionStore) -> None:
    triage, billing = make_agents()
    runner = Runner(triage, sqlite_store, model=ScriptedModel())
    assert runner.get_agent("Billing") is billing
    assert set(runner.agents) == {"Triage", "Billing"}
    assert sqlite_store._resolve_agent("Billing") is billing


@pytest.mark.parametrize(
    ("model", "setting"),
    [("claude-3-opus", "DEFAULT_MODEL"), ("gpt-4o", "OPENAI_API_KEY")],
    ids=["unroutable", "missing-key"],
)
def test_bad_models_fail_at_construction(model: str, setting: str) -> None:
    billing = Agent("Billing", "", model=model)
    triage = Agent("Triage", "", model="offline", handoffs=[billing])
    store = SessionStore()
    with pytest.raises(ConfigurationError) as info:
        Runner(triage, store)
    assert info.value.setting == setting


def test_bad_default_model_fails_at_construction() -> None:
    with pytest.raises(ConfigurationError) as info:
        Runner(Agent("A", ""), model_settings=ModelSettings(default_model="mystery-9"))
    assert info.value.setting == "DEFAULT_MODEL"


async def test_no_key_and_no_default_model_runs_offline_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    triage, _ = make_agents()
    with caplog.at_level(logging.WARNING, logger="bot.core.runner"):
        runner = Runner(triage)
    warnings = [r for r in caplog.records if r.name == "bot.core.runner"]
    assert len(warnings) == 1
    assert "offline" in warnings[0].getMessage()
    assert "\n" not in warnings[0].getMessage()
    result = await runner.run_async(SID, "refund for order #12 please")
    await runner.aclose()
    assert result.agent == "Billing"
    assert result.content.startswith(OFFLINE_PREFIX)
    assert "shipped" in result.content  # Billing looked the order up after the handoff
    assert tool_log[0][1]["order_id"] == "12"


async def test_default_model_from_settings_routes_agents_without_a_model(
    server: FakeOpenAIServer,
) -> None:
    triage, _ = make_agents()
    settings = ModelSettings(
        openai_api_key=server.api_key,
        openai_base_url=server.base_url,
        default_model="openai/local-model",
    )
    runner = Runner(triage, model_settings=settings)
    server.add(server.reply("from the default"))
    try:
        result = await runner.run_async(SID, "hi")
    finally:
        await runner.aclose()
    assert result.content == "from the default"
    assert server.chat_requests[0].body["model"] == "local-model"


# -- settings from the environment (B1) ---------------------------------------------------


async def test_runner_reads_openai_key_and_base_url_from_the_environment(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    triage, _ = make_agents()  # no model named: the key picks gpt-4o-mini
    server.add(server.reply("real answer"))
    async with Runner(triage) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content == "real answer"
    [request] = server.chat_requests
    assert request.body["model"] == "gpt-4o-mini"
    assert request.headers["authorization"] == f"Bearer {server.api_key}"


async def test_named_openai_model_uses_the_key_from_the_environment(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    server.add(server.reply("from gpt"))
    async with Runner(Agent("B", "", model="gpt-4o-mini")) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content == "from gpt"


async def test_default_model_and_ollama_url_come_from_the_environment(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fake server stands in for Ollama, which takes the fixed key "ollama".
    server.api_key = "ollama"
    monkeypatch.setenv("DEFAULT_MODEL", "ollama/llama3.2")
    monkeypatch.setenv("OLLAMA_BASE_URL", server.base_url)
    server.add(server.reply("local answer"))
    async with Runner(Agent("A", "")) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content == "local answer"
    assert server.chat_requests[0].body["model"] == "llama3.2"


@pytest.mark.parametrize(
    ("env", "raises"),
    [({"GEMINI_API_KEY": "g-key"}, False), ({"GEMINI_API_KEY": ""}, True), ({}, True)],
    ids=["key-set", "key-empty", "key-unset"],
)
async def test_gemini_key_from_the_environment(
    env: dict[str, str], raises: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    agent = Agent("G", "", model="gemini-2.5-flash")
    if raises:
        with pytest.raises(ConfigurationError) as info:
            Runner(agent)
        assert info.value.setting == "GEMINI_API_KEY"
    else:
        async with Runner(agent):  # resolves, no network until a turn
            pass


async def test_model_timeout_comes_from_the_environment(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("MODEL_TIMEOUT_SECONDS", "0.3")
    server.add(server.held(server.reply("too late")))  # released when the server stops
    async with Runner(Agent("A", "")) as runner:
        # The outer deadline only keeps a regression from hanging the suite.
        async with asyncio.timeout(20):
            with pytest.raises(ModelError):
                await runner.run_async(SID, "hi")


def test_bad_model_timeout_in_the_environment_names_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MODEL_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ConfigurationError) as info:
        Runner(Agent("A", ""))
    assert info.value.setting == "MODEL_TIMEOUT_SECONDS"


async def test_explicit_settings_win_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.setenv("DEFAULT_MODEL", "gpt-4o")
    async with Runner(Agent("A", ""), model_settings=ModelSettings()) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content.startswith(OFFLINE_PREFIX)


async def test_runner_accepts_the_app_settings(server: FakeOpenAIServer) -> None:
    from bot.config import Settings

    settings = Settings(
        openai_api_key=server.api_key,
        openai_base_url=server.base_url,
        default_model="gpt-4o",
    )
    server.add(server.reply("via Settings"))
    async with Runner(Agent("A", ""), model_settings=settings) as runner:
        result = await runner.run_async(SID, "hi")
    assert result.content == "via Settings"
    assert server.chat_requests[0].body["model"] == "gpt-4o"


@pytest.mark.parametrize(
    "bad",
    [{"openai_api_key": "sk-x", "default_model": "gpt-4o"}, "gpt-4o", object()],
    ids=["dict", "str", "object"],
)
def test_model_settings_of_another_type_raise_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match="ModelSettings"):
        Runner(Agent("A", ""), model_settings=bad)  # type: ignore[arg-type]


async def test_api_key_never_reaches_a_log_or_a_repr(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "sk-very-secret-0123456789"
    server.api_key = secret
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("GEMINI_API_KEY", "g-very-secret-0123456789")
    triage, _ = make_agents()
    server.add(server.reply("fine"), server.error(400, "bad request"))
    with caplog.at_level(logging.DEBUG):
        async with Runner(triage) as runner:
            await runner.run_async(SID, "hi")
            with pytest.raises(ModelError) as info:
                await runner.run_async(SID, "again")
            texts = [
                repr(ModelSettings.from_env()),
                str(ModelSettings.from_env()),
                repr(runner),
                str(info.value),
                *(repr(model) for model, _ in runner._models.values()),
            ]
    texts.append(caplog.text)
    for text in texts:
        assert secret not in text
        assert "g-very-secret" not in text


# -- async with -------------------------------------------------------------------------


async def test_runner_is_an_async_context_manager_that_closes(
    server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    closed: list[Runner] = []
    original = Runner.aclose

    async def spy(self: Runner) -> None:
        closed.append(self)
        await original(self)

    monkeypatch.setattr(Runner, "aclose", spy)
    server.add(server.reply("hi"))
    made = Runner(Agent("A", ""))
    async with made as runner:
        assert runner is made
        await runner.run_async(SID, "hello")
        assert closed == []
    assert closed == [made]


async def test_async_with_closes_the_runner_when_the_block_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    closed: list[Runner] = []
    original = Runner.aclose

    async def spy(self: Runner) -> None:
        closed.append(self)
        await original(self)

    monkeypatch.setattr(Runner, "aclose", spy)
    with pytest.raises(LookupError):
        async with Runner(Agent("A", ""), model=ScriptedModel()) as runner:
            raise LookupError("user code failed")
    assert closed == [runner]


async def test_a_conversation_on_a_gone_agent_moves_on_with_one_info_line(
    tmp_path: object, caplog: pytest.LogCaptureFixture
) -> None:
    # N11: switching AGENTS_MODULE printed two WARNINGs for an expected move.
    path = f"{tmp_path}/moved.db"
    billing = Agent(name="Billing", instructions="x")
    first = ScriptedModel([ScriptedModel.reply("hi")])
    async with Runner(billing, SQLiteSessionStore(path), model=first) as runner:
        await runner.run_async("s1", "hello")
    reminders = Agent(name="Reminders", instructions="x")
    store = SQLiteSessionStore(path)
    later = ScriptedModel([ScriptedModel.reply("hi again")])
    async with Runner(reminders, store, model=later) as runner:
        with caplog.at_level(logging.DEBUG):
            result = await runner.run_async("s1", "hello again")
    assert result.agent == "Reminders"
    assert [r.levelname for r in caplog.records if r.levelno >= logging.WARNING] == []
    (moved,) = [r for r in caplog.records if "moved to" in r.getMessage()]
    assert moved.levelno == logging.INFO
    assert "'Reminders': its agent 'Billing' is gone" in moved.getMessage()
