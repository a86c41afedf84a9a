"""MCP tools as the runtime's tools: names, schemas, results (no server needed)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import mcp_types as types
import pytest

from bot.core._schema import gemini_compatible_schema
from bot.core.attachments import ToolOutput
from bot.core.mcp.tools import clean_schema, render_result, sanitize_tool_name

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


# -- issue 24 --------------------------------------------------------------------------

# server-everything's gzip-file-as-resource, as zod-to-json-schema lists it (draft-07).
GZIP_FILE_AS_RESOURCE = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "Name of the output file"},
        "data": {"type": "string", "format": "uri", "description": "URL or data URI"},
        "outputType": {"type": "string", "enum": ["resourceLink", "resource"]},
        "when": {"type": "string", "format": "date-time"},
        "level": {"type": "integer", "format": "int64", "const": 3},
        "tags": {"type": "array", "items": {"type": "string", "format": "email"}},
        "note": {"type": ["string", "null"], "propertyNames": {"pattern": "^x"}},
    },
    "required": ["name", "data"],
    "additionalProperties": False,
}


def test_the_gemini_rewrite_keeps_only_geminis_schema_fields_and_formats() -> None:
    sent = gemini_compatible_schema(clean_schema(GZIP_FILE_AS_RESOURCE))
    props = sent["properties"]
    assert "format" not in props["data"] and props["data"]["type"] == "string"
    assert props["when"]["format"] == "date-time"  # one of the two Gemini keeps for strings
    assert props["level"] == {"type": "integer", "format": "int64", "enum": [3]}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["note"] == {"type": "string", "nullable": True}
    assert "additionalProperties" not in sent and "$schema" not in sent
    assert sent["required"] == ["name", "data"]


def test_the_gemini_rewrite_gives_a_recursive_reference_a_plain_object() -> None:
    schema = {
        "type": "object",
        "properties": {"tree": {"anyOf": [{"$ref": "#/$defs/Folder"}, {"type": "null"}]}},
        "$defs": {"Folder": {"type": "object", "properties": {"children": {"type": "array"}}}},
    }
    sent = gemini_compatible_schema(schema)
    assert sent == {
        "type": "object",
        "properties": {"tree": {"type": "object", "nullable": True}},
    }


def test_top_level_alternatives_are_lifted_into_one_object_schema() -> None:
    # The conformance suite's json_schema_2020_12_tool has this shape at its top.
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"name": {"type": "string"}, "email": {"type": "string"}},
        "required": ["kind"],
        "allOf": [
            {"anyOf": [{"required": ["name"]}, {"required": ["email"]}]},
            {"properties": {"kind": {"enum": ["person", "team"]}}},
        ],
        "if": {"properties": {"kind": {"const": "team"}}},
        "then": {"required": ["email"]},
    }
    cleaned = clean_schema(schema)
    assert cleaned == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "email": {"type": "string"},
            "kind": {"enum": ["person", "team"]},
        },
        "required": ["kind"],
    }


def test_a_top_level_alternative_that_is_no_object_cannot_be_offered() -> None:
    with pytest.raises(ValueError, match=r"not an object|type 'string'"):
        clean_schema({"type": "object", "oneOf": [{"type": "string"}, {"type": "object"}]})


def _image_block(size: int) -> types.ImageContent:
    from tests.fakes.media_files import jpeg_bytes

    data = base64.b64encode(jpeg_bytes(padding=size)).decode()
    return types.ImageContent(type="image", data=data, mime_type="image/jpeg")


def test_images_of_one_result_are_bounded_in_count_and_bytes() -> None:
    result = types.CallToolResult(content=[_text("charts"), *[_image_block(400) for _ in range(6)]])
    by_count = render_result(result, max_images=2)
    assert isinstance(by_count, ToolOutput) and len(by_count.attachments) == 2
    assert "[4 more image(s) left out: one result sends at most 2 images" in by_count.text
    by_bytes = render_result(result, max_image_bytes=2500)  # each image is 737 bytes
    assert isinstance(by_bytes, ToolOutput) and len(by_bytes.attachments) == 3
    assert "3 more image(s) left out" in by_bytes.text
    assert sum(len(a.data or b"") for a in by_bytes.attachments) <= 2500


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        pytest.param(["--token", "abc"], ["--token", "***"], id="flag-value"),
        pytest.param(["--api-key=abc"], ["--api-key=***"], id="flag-equals"),
        pytest.param(["GITHUB_TOKEN=abc"], ["GITHUB_TOKEN=***"], id="variable"),
        pytest.param(
            ["postgres://crm:pw@db/crm"], ["postgres://crm:***@db/crm"], id="url-password"
        ),
        pytest.param(["sk-proj-4f9aK2mQ7xZ1pL8vR3tY6wE0"], ["***"], id="token-shaped"),
        pytest.param(
            ["-y", "@modelcontextprotocol/server-everything", "--port", "3001"],
            ["-y", "@modelcontextprotocol/server-everything", "--port", "3001"],
            id="nothing-secret",
        ),
        pytest.param(
            ["--host", "db01.eu-west-1.internal.example.com", "mcp-server-postgres-2024"],
            ["--host", "db01.eu-west-1.internal.example.com", "mcp-server-postgres-2024"],
            id="long-but-plain",
        ),
    ],
)
def test_credentials_in_stdio_arguments_are_masked(args: list[str], shown: list[str]) -> None:
    from bot.core.mcp.servers import mask_args

    assert mask_args(args) == shown
