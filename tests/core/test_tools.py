"""@tool: schemas from type hints and docstrings, validation, errors, timeouts, context."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from enum import Enum
from typing import Annotated, Any, Literal

import docstring_parser
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from bot.core.agent import FunctionTool as ReexportedFunctionTool
from bot.core.agent import tool as reexported_tool
from bot.core.tools import FunctionTool, ToolContext, parse_docstring, tool

CTX = ToolContext(session_id="s1", metadata={"lang": "es"}, inbound_message_id="m1", agent_name="A")


class Color(Enum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    street: str
    zip_code: int | None = None


class Node(BaseModel):
    value: int
    children: list[Node] = []


def test_agent_module_reexports_tool_and_function_tool() -> None:
    assert reexported_tool is tool
    assert ReexportedFunctionTool is FunctionTool


def test_bare_decorator_builds_schema_from_hints_and_google_docstring() -> None:
    @tool
    def lookup_order(order_id: str, include_items: bool = False) -> str:
        """Look up an order by its id.

        Returns the status line.

        Args:
            order_id: The order number, e.g. "1234".
            include_items: Whether to list the items
                in the order as well.
        """
        return order_id

    assert isinstance(lookup_order, FunctionTool)
    assert lookup_order.name == "lookup_order"
    assert lookup_order.description == "Look up an order by its id.\n\nReturns the status line."
    schema = lookup_order.params_json_schema
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["order_id"]
    assert schema["properties"]["order_id"] == {
        "type": "string",
        "description": 'The order number, e.g. "1234".',
    }
    assert schema["properties"]["include_items"] == {
        "type": "boolean",
        "default": False,
        "description": "Whether to list the items in the order as well.",
    }


def test_options_override_name_description_and_timeout() -> None:
    @tool(name="find", description="Finds things.", timeout=2.5)
    async def search(query: str) -> str:
        """Ignored docstring."""
        return query

    assert (search.name, search.description, search.timeout) == ("find", "Finds things.", 2.5)


def test_optional_literal_enum_nested_and_recursive_models_in_schema() -> None:
    @tool
    def ship(
        address: Address,
        mode: Literal["air", "sea"] = "sea",
        color: Color = Color.RED,
        note: str | None = None,
        tree: Node | None = None,
        count: Annotated[int, Field(ge=1, description="How many")] = 1,
    ) -> str:
        """Ship something."""
        return "ok"

    props = ship.params_json_schema["properties"]
    assert ship.params_json_schema["required"] == ["address"]
    # Nested models are inlined and closed like the top level.
    assert props["address"]["type"] == "object"
    assert props["address"]["additionalProperties"] is False
    assert props["address"]["required"] == ["street"]
    assert props["mode"] == {"type": "string", "enum": ["air", "sea"], "default": "sea"}
    assert props["color"]["enum"] == ["red", "blue"]
    assert props["color"]["default"] == "red"
    assert {"type": "null"} in props["note"]["anyOf"]
    assert props["note"]["default"] is None
    assert props["count"]["minimum"] == 1
    assert props["count"]["description"] == "How many"
    # A recursive model cannot be inlined: it stays in $defs, also closed.
    assert ship.params_json_schema["$defs"]["Node"]["additionalProperties"] is False
    assert "title" not in json.dumps(ship.params_json_schema)


def test_mapping_parameters_keep_their_value_schema() -> None:
    @tool
    def tag(labels: dict[str, int], extra: dict[str, Any] | None = None) -> str:
        """Tag."""
        return ""

    props = tag.params_json_schema["properties"]
    assert props["labels"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert {"type": "object", "additionalProperties": True} in props["extra"]["anyOf"]


def test_property_called_title_survives_title_stripping() -> None:
    @tool
    def rename(title: str) -> str:
        """Rename."""
        return title

    assert rename.params_json_schema["properties"] == {"title": {"type": "string"}}


async def test_tool_context_is_injected_and_excluded_from_schema() -> None:
    seen: list[ToolContext] = []

    @tool
    def whoami(ctx: ToolContext, greeting: str) -> str:
        """Say who is asking."""
        seen.append(ctx)
        return f"{greeting} {ctx.session_id}"

    assert whoami.takes_context
    assert list(whoami.params_json_schema["properties"]) == ["greeting"]
    assert await whoami.invoke(CTX, {"greeting": "hi"}) == "hi s1"
    assert seen[0].inbound_message_id == "m1"
    with pytest.raises(TypeError):
        seen[0].metadata["lang"] = "en"  # type: ignore[index]


def test_tool_context_elsewhere_than_first_is_rejected() -> None:
    def bad(x: int, ctx: ToolContext) -> str:
        return ""

    with pytest.raises(TypeError, match="first parameter"):
        tool(bad)


@pytest.mark.parametrize(
    "name",
    ["has space", "", "x" * 65, "naïve"],
    ids=["space", "empty", "too-long", "non-ascii"],
)
def test_invalid_tool_names_are_rejected(name: str) -> None:
    def f() -> str:
        return ""

    with pytest.raises(ValueError, match="tool name"):
        tool(name=name)(f)


def test_var_args_are_rejected() -> None:
    def f(*args: int) -> str:
        return ""

    with pytest.raises(TypeError, match=r"\*args"):
        tool(f)


async def test_async_tool_result_is_serialised() -> None:
    @tool
    async def status(order_id: int) -> dict[str, Any]:
        """Status."""
        return {"order_id": order_id, "state": "shipped"}

    result = await status.invoke(CTX, {"order_id": 7})
    assert json.loads(result) == {"order_id": 7, "state": "shipped"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("plain", "plain"),
        ([1, 2], "[1,2]"),
        (Address(street="Main"), '{"street":"Main","zip_code":null}'),
        (None, "null"),
    ],
    ids=["str", "list", "model", "none"],
)
async def test_results_become_text(value: Any, expected: str) -> None:
    @tool
    def give() -> Any:
        """Give."""
        return value

    assert await give.invoke(CTX, {}) == expected


async def test_sync_tool_runs_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()

    @tool
    def where() -> str:
        """Where am I."""
        return str(threading.get_ident())

    assert await where.invoke(CTX, {}) != str(loop_thread)


async def test_nested_model_argument_is_validated_into_the_model() -> None:
    received: list[Address] = []

    @tool
    def ship(address: Address) -> str:
        """Ship."""
        received.append(address)
        return "ok"

    assert await ship.invoke(CTX, {"address": {"street": "Main", "zip_code": "8000"}}) == "ok"
    assert received == [Address(street="Main", zip_code=8000)]


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "order_id: Field required"),
        ({"order_id": "abc"}, "order_id: Input should be a valid integer"),
        ({"order_id": 1, "extra": 2}, "extra: Extra inputs are not permitted"),
    ],
    ids=["missing", "wrong-type", "unknown-argument"],
)
async def test_invalid_arguments_become_an_error_result_without_calling(
    arguments: dict[str, Any], fragment: str
) -> None:
    calls: list[int] = []

    @tool
    def cancel(order_id: int) -> str:
        """Cancel."""
        calls.append(order_id)
        return "cancelled"

    result = json.loads(await cancel.invoke(CTX, arguments))
    assert fragment in result["error"]
    assert calls == []


async def test_exception_becomes_error_result_and_logs_only_the_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    @tool
    def explode(secret: str) -> str:
        """Explode."""
        raise KeyError(f"no such thing {secret}")

    with caplog.at_level(logging.WARNING, logger="bot.core.tools"):
        result = await explode.invoke(CTX, {"secret": "hunter2"})
    error = json.loads(result)["error"]
    assert "KeyError" in error
    assert "explode" in error
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert "KeyError" in caplog.text
    assert "hunter2" not in caplog.text


async def test_async_exception_becomes_error_result() -> None:
    @tool
    async def fail() -> str:
        """Fail."""
        raise RuntimeError("db down")

    assert json.loads(await fail.invoke(CTX, {})) == {
        "error": "tool 'fail' failed: RuntimeError: db down"
    }


async def test_timeout_cancels_the_tool_and_reports_it() -> None:
    never = asyncio.Event()
    cancelled = asyncio.Event()

    @tool(timeout=0.01)
    async def slow() -> str:
        """Slow."""
        try:
            await never.wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "done"

    result = json.loads(await slow.invoke(CTX, {}))
    assert result == {"error": "tool 'slow' timed out after 0.01 s"}
    assert cancelled.is_set()


async def test_timeout_error_raised_by_the_tool_itself_is_not_a_timeout() -> None:
    @tool(timeout=5)
    async def upstream() -> str:
        """Upstream."""
        raise TimeoutError("upstream API timed out")

    error = json.loads(await upstream.invoke(CTX, {}))["error"]
    assert error == "tool 'upstream' failed: TimeoutError: upstream API timed out"


async def test_caller_cancellation_propagates() -> None:
    started = asyncio.Event()

    @tool
    async def wait_forever() -> str:
        """Wait."""
        started.set()
        await asyncio.Event().wait()
        return ""

    task = asyncio.create_task(wait_forever.invoke(CTX, {}))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_docstring_parser_handles_types_and_other_sections() -> None:
    parsed = parse_docstring(
        """Summary line.

        Args:
            a (int): First.
            b: Second,
                continued.

        Returns:
            str: not a parameter.
        """
    )
    assert parsed.description == "Summary line."
    assert dict(parsed.params) == {"a": "First.", "b": "Second, continued."}


@pytest.mark.parametrize(
    "doc",
    [
        "Find it.\n\nParameters\n----------\nname : str\n    What to\n    find.\n",
        "Find it.\n\n:param name: What to\n    find.\n:returns: the thing.\n",
    ],
    ids=["numpy", "rest"],
)
def test_numpy_and_rest_docstrings_describe_parameters_too(doc: str) -> None:
    parsed = parse_docstring(doc)
    assert parsed.description == "Find it."
    assert dict(parsed.params) == {"name": "What to find."}


def test_a_docstring_the_parser_refuses_becomes_the_description(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(text: str | None, style: object = None) -> None:
        raise docstring_parser.ParseError("refused")

    monkeypatch.setattr(docstring_parser, "parse", refuse)

    @tool
    def find(name: str) -> str:
        """Find it
        by name.

        Args:
            name: What.
        """
        return name

    assert find.description == "Find it by name.\n\nArgs: name: What."
    assert "description" not in find.params_json_schema["properties"]["name"]


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=4))
def test_tool_context_metadata_is_a_read_only_snapshot(data: dict[str, Any]) -> None:
    source = dict(data)
    ctx = ToolContext(session_id="s", metadata=source)
    source["added-later"] = 1
    assert dict(ctx.metadata) == data
    with pytest.raises(TypeError):
        ctx.metadata["x"] = 1  # type: ignore[index]
