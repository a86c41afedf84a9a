"""Model layer: history sanitising, the OpenAI-compatible client over real HTTP, routing,
and the scripted test model."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.config import Settings
from bot.core.messages import Message, Role, ToolCall
from bot.core.models import (
    GEMINI_BASE_URL,
    INVALID_JSON_ARGUMENTS,
    ChatModel,
    ModelRouter,
    ModelSettings,
    OfflineModel,
    OpenAICompatibleModel,
    ScriptedModel,
    ScriptExhaustedError,
    ToolSpec,
    default_model_name,
    gemini_compatible_schema,
    route_model,
    sanitize_history,
    to_openai_messages,
)
from bot.errors import ConfigurationError, ModelError
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, validate_chat_request

LOOKUP = ToolSpec(
    "lookup_order",
    "Look up an order.",
    {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
)


def user(text: str) -> Message:
    return Message(role=Role.USER, content=text)


def model_calls(*ids: str) -> Message:
    return Message(role=Role.MODEL, tool_calls=[ToolCall(id=i, name="t") for i in ids])


def result(call_id: str) -> Message:
    return Message(role=Role.TOOL, tool_call_id=call_id, content="r")


# -- sanitize_history -------------------------------------------------------------------


def test_sanitize_drops_orphan_results_and_unanswered_calls() -> None:
    history = [
        result("ghost"),
        user("u1"),
        model_calls("a", "b"),
        result("a"),
        result("zzz"),
        Message(role=Role.MODEL, content="done"),
        user("u2"),
        model_calls("c"),
    ]
    clean = sanitize_history(history)
    assert [(m.role, m.content) for m in clean] == [
        (Role.USER, "u1"),
        (Role.MODEL, None),
        (Role.TOOL, "r"),
        (Role.MODEL, "done"),
        (Role.USER, "u2"),
    ]
    assert [c.id for c in clean[1].tool_calls] == ["a"]


def test_sanitize_merges_consecutive_user_messages_and_keeps_system() -> None:
    history = [
        Message(role=Role.SYSTEM, content="rules"),
        user("one"),
        user("two"),
        Message(role=Role.MODEL, content="x"),
    ]
    clean = sanitize_history(history)
    assert [(m.role, m.content) for m in clean] == [
        (Role.SYSTEM, "rules"),
        (Role.USER, "one\n\ntwo"),
        (Role.MODEL, "x"),
    ]


def test_sanitize_keeps_text_of_a_model_message_whose_calls_were_unanswered() -> None:
    msg = Message(role=Role.MODEL, content="let me check", tool_calls=[ToolCall(id="x", name="t")])
    clean = sanitize_history([user("u"), msg])
    assert clean[-1].content == "let me check"
    assert clean[-1].tool_calls == []


def _roles() -> st.SearchStrategy[list[Message]]:
    ids = st.sampled_from(["a", "b", "c"])
    message = st.one_of(
        st.builds(user, st.sampled_from(["u", "v"])),
        st.builds(lambda i: model_calls(*i), st.lists(ids, min_size=1, max_size=2, unique=True)),
        st.builds(lambda: Message(role=Role.MODEL, content="m")),
        st.builds(result, ids),
        st.builds(lambda: Message(role=Role.SYSTEM, content="s")),
    )
    return st.lists(message, max_size=12)


@given(_roles())
def test_sanitized_history_is_always_accepted_by_openai_rules(history: list[Message]) -> None:
    clean = sanitize_history(history)
    body = {"model": "m", "messages": to_openai_messages("sys", clean)}
    assert validate_chat_request(body) is None
    non_system = [m for m in clean if m.role is not Role.SYSTEM]
    if non_system:
        assert non_system[0].role is Role.USER
    for before, after in itertools.pairwise(non_system):
        assert not (before.role is Role.USER and after.role is Role.USER)


def test_translation_puts_one_system_message_first() -> None:
    call = ToolCall(id="c1", name="lookup_order", arguments={"order_id": "ü1"})
    messages = to_openai_messages(
        "Be brief.",
        [
            Message(role=Role.SYSTEM, content="Customer is VIP."),
            user("hi"),
            Message(role=Role.MODEL, tool_calls=[call]),
            Message(role=Role.TOOL, tool_call_id="c1", content="ok"),
        ],
    )
    assert messages == [
        {"role": "system", "content": "Be brief.\n\nCustomer is VIP."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order_id": "ü1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]


# -- OpenAICompatibleModel over HTTP --------------------------------------------------


class Sleeps:
    """An injectable retry sleep that records the SDK's waits and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def client(server: FakeOpenAIServer, sleeps: Sleeps) -> AsyncIterator[OpenAICompatibleModel]:
    model = OpenAICompatibleModel(
        server.api_key, server.base_url, max_retries=3, request_timeout=5, sleep=sleeps
    )
    yield model
    await model.aclose()


async def complete(client: ChatModel, messages: list[Message] | None = None) -> Any:
    return await client.complete(
        model="gpt-test", system="Be brief.", messages=messages or [user("hi")], tools=[LOOKUP]
    )


async def test_plain_answer_and_request_shape(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    server.add(server.reply("hello", prompt_tokens=7, completion_tokens=3))
    response = await complete(client)
    assert response.content == "hello"
    assert response.tool_calls == []
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total) == (
        7,
        3,
        10,
    )
    [request] = server.chat_requests
    assert request.body["model"] == "gpt-test"
    assert request.roles == ["system", "user"]
    assert request.tool_names == ["lookup_order"]
    assert request.headers["authorization"] == "Bearer sk-test"


async def test_the_request_body_is_sent_as_built(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    # The client posts the JSON it built, unchanged: no key added, none dropped or renamed
    # (it bypasses the SDK's per-message request transform, which only costs CPU here).
    server.add(server.reply("hello"))
    history = [user("where is order 1001?"), Message(role=Role.MODEL, content="Looking.")]
    history.append(user("and 1002?"))
    await complete(client, history)
    [request] = server.chat_requests
    assert set(request.body) == {"model", "messages", "tools"}
    assert request.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "where is order 1001?"},
        {"role": "assistant", "content": "Looking."},
        {"role": "user", "content": "and 1002?"},
    ]
    assert request.body["tools"][0]["function"]["name"] == "lookup_order"


async def test_tool_calls_are_parsed(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    server.add(server.tool_calls(server.tool_call("lookup_order", {"order_id": "9"}, call_id="c9")))
    response = await complete(client)
    assert response.tool_calls == [
        ToolCall(id="c9", name="lookup_order", arguments={"order_id": "9"})
    ]
    assert response.invalid_tool_calls == {}


@pytest.mark.parametrize("raw", ['{"order_id": ', "[1, 2]"], ids=["truncated", "not-an-object"])
async def test_malformed_tool_arguments_are_kept_as_an_invalid_call(
    server: FakeOpenAIServer, client: OpenAICompatibleModel, raw: str
) -> None:
    server.add(server.tool_calls(server.tool_call("lookup_order", raw, call_id="bad")))
    response = await complete(client)
    assert response.tool_calls == [ToolCall(id="bad", name="lookup_order", arguments={})]
    assert response.invalid_tool_calls == {"bad": INVALID_JSON_ARGUMENTS}


async def test_500_then_429_with_retry_after_then_success(
    server: FakeOpenAIServer, client: OpenAICompatibleModel, sleeps: Sleeps
) -> None:
    server.add(server.error(500), server.rate_limited(retry_after=7), server.reply("finally"))
    response = await complete(client)
    assert response.content == "finally"
    assert [r.status for r in server.chat_requests] == [500, 429, 200]
    assert len(sleeps.delays) == 2
    assert 0.25 <= sleeps.delays[0] <= 0.5  # the SDK's first backoff: 0.5 s less jitter
    assert sleeps.delays[1] == 7.0  # Retry-After honoured


async def test_retries_exhausted_raise_a_retryable_model_error(
    server: FakeOpenAIServer, client: OpenAICompatibleModel, sleeps: Sleeps
) -> None:
    server.add(*(server.error(503) for _ in range(4)))
    with pytest.raises(ModelError) as info:
        await complete(client)
    assert info.value.retryable
    assert info.value.status_code == 503
    assert isinstance(info.value.__cause__, openai.InternalServerError)
    assert len(server.chat_requests) == 4
    assert [r.headers["x-stainless-retry-count"] for r in server.chat_requests] == list("0123")
    assert len(sleeps.delays) == 3
    assert sleeps.delays == sorted(sleeps.delays)  # exponential growth


@pytest.mark.parametrize(
    ("response", "status"),
    [
        (FakeOpenAIServer.error(400, "bad request"), 400),
        (FakeOpenAIServer.error(404, "no such model"), 404),
        (FakeOpenAIServer.rate_limited(1, code="insufficient_quota"), 429),
    ],
    ids=["400", "404", "quota"],
)
async def test_permanent_errors_are_not_retried(
    server: FakeOpenAIServer,
    client: OpenAICompatibleModel,
    sleeps: Sleeps,
    response: Any,
    status: int,
) -> None:
    server.add(response)
    with pytest.raises(ModelError) as info:
        await complete(client)
    assert not info.value.retryable
    assert info.value.status_code == status
    assert isinstance(info.value.__cause__, openai.APIStatusError)
    assert len(server.chat_requests) == 1
    assert sleeps.delays == []


async def test_wrong_key_is_a_401_model_error(server: FakeOpenAIServer) -> None:
    model = OpenAICompatibleModel("sk-wrong", server.base_url)
    try:
        with pytest.raises(ModelError) as info:
            await complete(model)
    finally:
        await model.aclose()
    assert info.value.status_code == 401
    assert not info.value.retryable


async def test_retry_after_past_the_deadline_fails_at_once(
    server: FakeOpenAIServer, sleeps: Sleeps
) -> None:
    model = OpenAICompatibleModel(server.api_key, server.base_url, total_timeout=10, sleep=sleeps)
    server.add(server.rate_limited(retry_after=120))
    try:
        with pytest.raises(ModelError) as info:
            await complete(model)
    finally:
        await model.aclose()
    assert info.value.retry_after == 120
    assert info.value.retryable
    assert len(server.chat_requests) == 1
    assert sleeps.delays == []


def _no_choices() -> FakeResponse:
    body = FakeOpenAIServer.completion("x")
    body["choices"] = []
    return FakeResponse(body=body)


@pytest.mark.parametrize(
    ("unusable", "message"),
    [(FakeOpenAIServer.malformed(), "malformed JSON"), (_no_choices(), "without choices")],
    ids=["malformed-json", "no-choices"],
)
async def test_an_unusable_answer_is_retried_then_reported(
    server: FakeOpenAIServer, sleeps: Sleeps, unusable: FakeResponse, message: str
) -> None:
    model = OpenAICompatibleModel(server.api_key, server.base_url, max_retries=1, sleep=sleeps)
    server.add(unusable, server.reply("ok"))
    try:
        assert (await complete(model)).content == "ok"
        assert len(sleeps.delays) == 1
        server.add(unusable, unusable)
        with pytest.raises(ModelError, match=message) as info:
            await complete(model)
    finally:
        await model.aclose()
    assert info.value.retryable
    assert isinstance(info.value.__cause__, openai.APIConnectionError)
    assert len(server.chat_requests) == 4


async def test_request_timeout_is_retried_then_reported(
    server: FakeOpenAIServer, sleeps: Sleeps
) -> None:
    model = OpenAICompatibleModel(
        server.api_key, server.base_url, max_retries=1, request_timeout=0.05, sleep=sleeps
    )
    server.add(server.held(server.reply("late")), server.held(server.reply("late")))
    try:
        with pytest.raises(ModelError, match="timed out") as info:
            await complete(model)
    finally:
        await model.aclose()
    assert info.value.retryable
    assert isinstance(info.value.__cause__, openai.APITimeoutError)
    assert len(server.chat_requests) == 2
    assert len(sleeps.delays) == 1


async def test_connection_refused_is_a_retryable_model_error(sleeps: Sleeps) -> None:
    server = FakeOpenAIServer()
    await server.start()
    base_url = server.base_url
    await server.stop()  # nothing listens on that port any more
    model = OpenAICompatibleModel("sk", base_url, max_retries=2, sleep=sleeps)
    try:
        with pytest.raises(ModelError, match="could not reach") as info:
            await complete(model)
    finally:
        await model.aclose()
    assert info.value.retryable
    assert type(info.value.__cause__) is openai.APIConnectionError
    assert len(sleeps.delays) == 2


# The SDK's own waits, nothing injected: the server directs them with retry-after-ms.


async def test_the_sdk_waits_out_retry_after_ms(server: FakeOpenAIServer) -> None:
    model = OpenAICompatibleModel(server.api_key, server.base_url)
    server.add(server.error(503, headers={"retry-after-ms": "50"}), server.reply("ok"))
    try:
        assert (await complete(model)).content == "ok"
    finally:
        await model.aclose()
    first, second = server.chat_requests
    assert second.received_at - first.received_at >= 0.045
    assert second.headers["x-stainless-retry-count"] == "1"


async def test_total_timeout_bounds_the_call_retries_and_waits_included(
    server: FakeOpenAIServer,
) -> None:
    # A deadline long enough for a second try even on a busy machine (two test workers
    # and bot subprocesses share two cores), far shorter than 1,000 retries would take.
    deadline, wait = 1.0, 0.02
    server.responder = lambda _: FakeOpenAIServer.error(503, headers={"retry-after-ms": "20"})
    model = OpenAICompatibleModel(
        server.api_key, server.base_url, max_retries=1000, total_timeout=deadline
    )
    started = time.monotonic()
    try:
        with pytest.raises(ModelError) as info:  # the last 503, or "gave up after 1 s"
            await complete(model)
    finally:
        await model.aclose()
    assert time.monotonic() - started < deadline + 0.5
    assert info.value.retryable
    assert 2 <= len(server.chat_requests) <= deadline / wait + 1


async def test_total_timeout_cuts_a_request_slower_than_it(server: FakeOpenAIServer) -> None:
    model = OpenAICompatibleModel(
        server.api_key, server.base_url, request_timeout=30, total_timeout=0.1
    )
    server.add(server.held(server.reply("late")))
    started = time.monotonic()
    try:
        with pytest.raises(ModelError, match="gave up") as info:
            await complete(model)
    finally:
        await model.aclose()
    assert time.monotonic() - started < 1.0
    assert info.value.retryable


async def test_orphans_are_removed_before_the_request(
    server: FakeOpenAIServer, client: OpenAICompatibleModel
) -> None:
    server.add(server.reply("fine"))
    history = [result("ghost"), user("a"), user("b"), model_calls("never-answered")]
    assert (await complete(client, history)).content == "fine"
    assert server.validation_errors == []
    assert server.chat_requests[0].roles == ["system", "user"]
    assert server.chat_requests[0].messages[1]["content"] == "a\n\nb"


async def test_fake_server_refuses_orphans_like_openai(server: FakeOpenAIServer) -> None:
    """The fake's validation is what the runner tests rely on: prove it bites."""
    import httpx

    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "z", "content": "r"},
        ],
    }
    async with httpx.AsyncClient() as http:
        answer = await http.post(
            f"{server.base_url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {server.api_key}"},
        )
    assert answer.status_code == 400
    assert "must be a response to a preceeding message" in answer.json()["error"]["message"]
    unanswered = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "x"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [server.tool_call("t", {}, call_id="q")],
            },
            {"role": "user", "content": "y"},
        ],
    }
    assert "did not have response messages: q" in (validate_chat_request(unanswered) or "")


async def test_gemini_dialect_strips_keys_gemini_rejects(server: FakeOpenAIServer) -> None:
    spec = ToolSpec(
        "pick",
        "Pick.",
        {
            "type": "object",
            "properties": {
                "kind": {"const": "a"},
                "additionalProperties": {"type": "string"},  # a property with that name stays
            },
            "required": [],
            "additionalProperties": False,
        },
    )
    model = OpenAICompatibleModel(
        server.api_key, server.base_url, schema_transform=gemini_compatible_schema
    )
    server.add(server.reply("ok"))
    try:
        await model.complete(
            model="gemini-2.5-flash", system="", messages=[user("x")], tools=[spec]
        )
    finally:
        await model.aclose()
    sent = server.chat_requests[0].body["tools"][0]["function"]["parameters"]
    assert sent == {
        "type": "object",
        "properties": {"kind": {"enum": ["a"]}, "additionalProperties": {"type": "string"}},
        "required": [],
    }
    assert spec.parameters["additionalProperties"] is False  # the spec itself is untouched


def test_router_gives_gemini_its_schema_dialect() -> None:
    gemini, _ = ModelRouter(KEYS).resolve("gemini-2.5-flash")
    openai_model, _ = ModelRouter(KEYS).resolve("gpt-4o")
    assert isinstance(gemini, OpenAICompatibleModel)
    assert isinstance(openai_model, OpenAICompatibleModel)
    assert gemini.schema_transform is gemini_compatible_schema
    assert openai_model.schema_transform is None


# -- routing ---------------------------------------------------------------------------

KEYS = ModelSettings(openai_api_key="sk-o", gemini_api_key="g-key", ollama_base_url=None)


@pytest.mark.parametrize(
    ("name", "provider", "model_name", "base_url", "key"),
    [
        ("offline", "offline", "offline", None, None),
        ("gpt-4o", "openai", "gpt-4o", None, "sk-o"),
        ("o3-mini", "openai", "o3-mini", None, "sk-o"),
        ("chatgpt-4o-latest", "openai", "chatgpt-4o-latest", None, "sk-o"),
        ("openai/my-vllm-model", "openai", "my-vllm-model", None, "sk-o"),
        ("gemini-2.5-flash", "gemini", "gemini-2.5-flash", GEMINI_BASE_URL, "g-key"),
        ("ollama/llama3.2", "ollama", "llama3.2", "http://localhost:11434/v1", "ollama"),
    ],
    ids=["offline", "gpt", "o3", "chatgpt", "openai-prefix", "gemini", "ollama"],
)
def test_routes(
    name: str, provider: str, model_name: str, base_url: str | None, key: str | None
) -> None:
    route = route_model(name, KEYS)
    assert (route.provider, route.model_name, route.base_url, route.api_key) == (
        provider,
        model_name,
        base_url,
        key,
    )


def test_openai_base_url_and_ollama_base_url_are_honoured() -> None:
    settings = ModelSettings(
        openai_api_key="k", openai_base_url="http://127.0.0.1:9/v1", ollama_base_url="http://o:1/v1"
    )
    assert route_model("gpt-4o", settings).base_url == "http://127.0.0.1:9/v1"
    assert route_model("ollama/qwen", settings).base_url == "http://o:1/v1"


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("gpt-4o", "OPENAI_API_KEY"),
        ("openai/x", "OPENAI_API_KEY"),
        ("gemini-2.5-pro", "GEMINI_API_KEY"),
        ("claude-3-opus", "DEFAULT_MODEL"),
        ("ollama/", "DEFAULT_MODEL"),
    ],
    ids=["gpt-no-key", "openai-no-key", "gemini-no-key", "unroutable", "ollama-empty"],
)
def test_unusable_names_raise_configuration_error_naming_the_setting(
    name: str, setting: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        route_model(name, ModelSettings())
    assert info.value.setting == setting
    assert setting in str(info.value) or name in str(info.value)


def test_router_caches_one_client_per_endpoint_and_key() -> None:
    router = ModelRouter(KEYS)
    first, name_a = router.resolve("gpt-4o")
    second, name_b = router.resolve("openai/gpt-4.1")
    gemini, _ = router.resolve("gemini-2.5-flash")
    offline, _ = router.resolve("offline")
    assert first is second
    assert (name_a, name_b) == ("gpt-4o", "gpt-4.1")
    assert gemini is not first
    assert isinstance(first, OpenAICompatibleModel)
    assert isinstance(offline, OfflineModel)
    assert "sk-o" not in repr(first) and "sk-o" not in repr(KEYS)


def test_router_accepts_the_app_settings_with_secret_keys() -> None:
    settings = ModelSettings.from_settings(
        Settings(openai_api_key="sk-from-env", default_model="gpt-4o")
    )
    model, name = ModelRouter(settings).resolve("gpt-4o")
    assert isinstance(model, OpenAICompatibleModel)
    assert model.api_key == "sk-from-env"
    assert name == "gpt-4o"
    assert settings.default_model == "gpt-4o"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (ModelSettings(), "offline"),
        (ModelSettings(default_model="ollama/llama3"), "ollama/llama3"),
        (ModelSettings(openai_api_key="k"), "gpt-4o-mini"),
        (ModelSettings(gemini_api_key="k"), "gemini-2.5-flash"),
    ],
    ids=["nothing", "explicit", "openai-key", "gemini-key"],
)
def test_default_model_name(settings: ModelSettings, expected: str) -> None:
    assert default_model_name(settings) == expected


# -- ScriptedModel ----------------------------------------------------------------------


async def test_scripted_model_plays_steps_and_records_requests() -> None:
    boom = ModelError("scripted failure", retryable=True)

    async def dynamic(call: Any) -> Any:
        return ScriptedModel.reply(f"saw {len(call.messages)} messages")

    model = ScriptedModel(
        [
            ScriptedModel.call("lookup_order", order_id="1"),
            boom,
            dynamic,
            ScriptedModel.reply("bye"),
        ]
    )
    first = await complete(model)
    assert first.tool_calls[0].name == "lookup_order"
    assert first.tool_calls[0].arguments == {"order_id": "1"}
    with pytest.raises(ModelError, match="scripted failure"):
        await complete(model)
    assert (await complete(model, [user("a"), user("b")])).content == "saw 2 messages"
    assert (await complete(model)).content == "bye"
    with pytest.raises(ScriptExhaustedError):
        await complete(model)
    assert len(model.requests) == 5
    assert model.requests[0].system == "Be brief."
    assert model.requests[0].tool_names == ["lookup_order"]
    assert isinstance(model, ChatModel)


def test_scripted_tool_call_ids_are_unique() -> None:
    response = ScriptedModel.calls(("a", {}), ("a", {}))
    ids = [c.id for c in response.tool_calls]
    assert len(set(ids)) == 2
    assert json.dumps(response.tool_calls[0].arguments) == "{}"
