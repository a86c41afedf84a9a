"""MCP tools as the runtime's tools: names, schemas, results (no server needed)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import mcp_types as types
import pytest

from bot.core.attachments import ToolOutput
from bot.core.mcp_tools import clean_schema, render_result, sanitize_tool_name

# What OpenAI and Gemini both accept (Gemini: a letter or underscore first).
PROVIDER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("lookup_order", "lookup_order", id="already-fine"),
        pytest.param("crm.lookup", "crm_lookup", id="dot"),
        pytest.param("orders/get status", "orders_get_status", id="slash-and-space"),
        pytest.param("2fa-check", "_2fa-check", id="leading-digit"),
        pytest.param("pedido_número", "pedido_n_mero", id="non-ascii"),
    ],
)
def test_names_are_sanitised_for_every_provider(name: str, expected: str) -> None:
    assert sanitize_tool_name(name) == expected
    assert PROVIDER_NAME.match(expected)


def test_long_and_taken_names_get_a_hash_and_stay_valid() -> None:
    long = sanitize_tool_name("a" * 100)
    assert len(long) == 64 and PROVIDER_NAME.match(long)
    first = sanitize_tool_name("crm.lookup")
    second = sanitize_tool_name("crm_lookup", taken={first})
    assert second != first and second.startswith("crm_lookup_") and PROVIDER_NAME.match(second)


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(None, id="none"),
        pytest.param({}, id="empty"),
        pytest.param(
            {"$schema": "https://json-schema.org/draft/2020-12/schema"}, id="dollar-schema"
        ),
        pytest.param({"type": "object", "properties": None}, id="null-properties"),
    ],
)
def test_schemas_become_object_schemas_with_properties(schema: dict[str, object] | None) -> None:
    cleaned = clean_schema(schema)
    assert cleaned["type"] == "object"
    assert cleaned["properties"] == {}
    assert "$schema" not in cleaned


def test_clean_schema_keeps_the_rest_and_does_not_touch_the_original() -> None:
    original = {"properties": {"id": {"type": "string"}}, "required": ["id"]}
    cleaned = clean_schema(original)
    assert cleaned == {
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "required": ["id"],
    }
    assert "type" not in original


def test_titles_go_and_definitions_are_inlined_as_for_tool_schemas() -> None:
    schema = {
        "title": "lookupArguments",
        "type": "object",
        "properties": {
            "title": {"title": "Title", "type": "string"},
            "address": {"$ref": "#/$defs/Address"},
        },
        "$defs": {"Address": {"title": "Address", "type": "object", "properties": {}}},
    }
    assert clean_schema(schema) == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "address": {"type": "object", "properties": {}},
        },
    }


def text_of(result: types.CallToolResult, limit: int | None = None) -> str:
    """``render_result`` of a result without images: plain text."""
    rendered = render_result(result) if limit is None else render_result(result, limit)
    assert isinstance(rendered, str)
    return rendered


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def test_text_blocks_are_joined_and_images_become_attachments() -> None:
    result = types.CallToolResult(
        content=[
            _text("first"),
            types.ImageContent(type="image", data="aGVsbG8=", mime_type="image/png"),
            _text("second"),
            types.AudioContent(type="audio", data="aGVsbG8=", mime_type="audio/ogg"),
        ]
    )
    output = render_result(result)
    assert isinstance(output, ToolOutput)
    assert output.text == "first\nsecond\n[audio (audio/ogg), not shown]"
    (image,) = output.attachments
    assert image.data == b"hello" and image.kind == "image" and image.mime_type == "image/png"


def test_an_image_that_is_not_base64_is_left_out_with_a_note() -> None:
    result = types.CallToolResult(
        content=[
            _text("chart"),
            types.ImageContent(type="image", data="%%%", mime_type="image/png"),
        ]
    )
    assert render_result(result) == "chart\n[1 unreadable image(s) left out]"


def test_structured_content_is_the_result_when_there_is_no_text() -> None:
    result = types.CallToolResult(content=[], structured_content={"count": 2})
    assert json.loads(text_of(result)) == {"count": 2}


def test_an_error_result_is_an_error_for_the_model() -> None:
    result = types.CallToolResult(content=[_text("CRM down")], is_error=True)
    assert json.loads(text_of(result)) == {"error": "CRM down"}


def test_output_is_cut_to_the_limit_with_a_note() -> None:
    result = types.CallToolResult(content=[_text("x" * 5000)])
    text = text_of(result, limit=1000)
    assert text.startswith("x" * 1000)
    assert len(text) < 1100 and "4000 more characters cut" in text


def test_import_bot_does_not_load_the_mcp_sdk() -> None:
    code = "import bot, sys; assert not {'mcp', 'mcp_types', 'jsonschema'} & set(sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
