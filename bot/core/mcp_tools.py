"""MCP tools as the runtime's tools: names, schemas, calls and results.

The ``mcp`` SDK, ``mcp_types`` and ``jsonschema`` are imported where first
used, so ``import bot`` stays light for bots without MCP servers.

An MCP server's tool becomes an ``MCPTool``: a name every provider accepts,
a schema the model sees, and ``invoke(ctx, arguments)`` with the same promise
as ``FunctionTool.invoke``: nothing a server does fails the turn. Invalid
arguments, a dead server, a timeout or a server error all come back to the
model as an ``{"error": ...}`` result it can read.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# The ``@tool`` schema helpers: one way to inline definitions for every tool.
from bot.core._schema import _inline_refs, _is_recursive, plain_copy
from bot.core.attachments import Attachment, ToolOutput
from bot.core.models.base import ToolSpec
from bot.core.tools import ToolContext, error_result

if TYPE_CHECKING:
    import jsonschema
    import mcp_types as types

    from bot.core.mcp_connection import MCPServer

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "META_AGENT",
    "META_INBOUND_MESSAGE_ID",
    "META_SESSION_ID",
    "MCPTool",
    "build_tools",
    "clean_schema",
    "render_result",
    "sanitize_tool_name",
]

DEFAULT_MAX_OUTPUT_CHARS = 20_000
"""Characters of one tool result the model may see; the rest is cut with a note."""

META_SESSION_ID = "chatflow/session_id"
"""``_meta`` key of a call: the session the turn runs in."""
META_INBOUND_MESSAGE_ID = "chatflow/inbound_message_id"
"""``_meta`` key of a call: the inbound message's id, an idempotency key for side effects."""
META_AGENT = "chatflow/agent"
"""``_meta`` key of a call: the agent whose model asked for it."""

# What OpenAI (^[A-Za-z0-9_-]{1,64}$) and Gemini (a letter or _ first, then
# [A-Za-z0-9_.:-], 64 at most) both accept; a name passes to every provider.
_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
_MAX_NAME = 64


def sanitize_tool_name(name: str, taken: Iterable[str] = ()) -> str:
    """``name`` as every provider accepts it, distinct from the names in ``taken``.

    Other characters become ``_``, a leading digit or dash gets a ``_`` prefix, a
    name over 64 characters (or one already taken) ends with a short hash.
    """
    used = set(taken)
    clean = re.sub(r"[^A-Za-z0-9_-]", "_", name)
    if not clean or not re.match(r"[A-Za-z_]", clean[0]):
        clean = "_" + clean
    if _VALID_NAME.match(clean) and clean not in used:
        return clean
    digest = hashlib.sha256(name.encode()).hexdigest()
    for size in (8, 12, 16, 24):
        candidate = clean[: _MAX_NAME - size - 1] + "_" + digest[:size]
        if candidate not in used:
            return candidate
    raise ValueError(f"cannot find a free tool name for {name!r}")


def _drop_titles(node: Any, *, name_map: bool = False) -> Any:
    if isinstance(node, list):
        return [_drop_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    if name_map:  # property or definition names, never keywords
        return {key: _drop_titles(value) for key, value in node.items()}
    return {
        key: _drop_titles(value, name_map=key in ("properties", "$defs"))
        for key, value in node.items()
        if key != "title"
    }


def clean_schema(schema: Mapping[str, Any] | None) -> dict[str, Any]:
    """An input schema every provider takes: an object schema with ``properties``.

    MCP servers send what their framework made: no ``type``, a ``$schema`` key,
    ``properties`` missing on a tool without arguments, pydantic's titles and
    ``$defs``. Gemini refuses the first ones; ``$ref`` to a definition that is
    not recursive is inlined, as for ``@tool`` schemas. The Gemini route
    rewrites the rest (``additionalProperties``, ``const``) for every tool.
    """
    result: dict[str, Any] = _drop_titles(plain_copy(dict(schema or {})))
    for key in ("$schema", "$id"):
        result.pop(key, None)
    defs = result.pop("$defs", None)
    if isinstance(defs, dict) and defs:
        keep = {name for name in defs if _is_recursive(name, defs)}
        result = _inline_refs(result, defs, keep)
        if keep:
            result["$defs"] = {name: _inline_refs(defs[name], defs, keep) for name in keep}
    result["type"] = "object"
    if not isinstance(result.get("properties"), dict):
        result["properties"] = {}
    return result


def _describe_schema_error(error: jsonschema.ValidationError) -> str:
    where = ".".join(str(part) for part in error.absolute_path) or "arguments"
    return f"{where}: {error.message}"


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return text[:limit] + f"\n…[{cut} more characters cut]"


def _render_block(block: types.ContentBlock) -> str:
    import mcp_types as types

    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.EmbeddedResource):
        inner = block.resource
        if isinstance(inner, types.TextResourceContents):
            return inner.text
        return f"[resource {inner.uri} ({inner.mime_type or 'binary'}), not shown]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}]"
    if isinstance(block, types.ImageContent):
        return ""  # attached (``_image``): the runtime's note says so
    # Audio: no way to hand it to the model or the user as a tool's file.
    return f"[{block.type} ({block.mime_type}), not shown]"


def _image(block: types.ContentBlock) -> Attachment | None:
    """An image block as a file the reply carries (like a function tool's ``Attachment``)."""
    import mcp_types as types

    if not isinstance(block, types.ImageContent):
        return None
    try:
        data = base64.b64decode(block.data, validate=True)
    except (binascii.Error, ValueError):
        return None  # not base64: left out, as the note below says
    return Attachment.image(data, mime_type=block.mime_type) if data else None


def render_result(
    result: types.CallToolResult, limit: int = DEFAULT_MAX_OUTPUT_CHARS
) -> str | ToolOutput:
    """What the model reads for one MCP result, its text cut to ``limit`` characters.

    Text blocks are joined; a result with structured content and no text is its
    JSON; ``is_error`` results become ``{"error": ...}`` like any failed tool.
    Image blocks become the result's attachments (``ToolOutput``): kept in the
    media store and sent with the reply, as for a function tool's files.
    """
    parts = [_render_block(block) for block in result.content]
    text = "\n".join(part for part in parts if part)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    if result.is_error:
        return error_result(_truncate(text or "the tool reported an error", limit))
    images = [found for block in result.content if (found := _image(block)) is not None]
    unreadable = sum(1 for b in result.content if b.type == "image") - len(images)
    if unreadable:
        text = "\n".join(filter(None, (text, f"[{unreadable} unreadable image(s) left out]")))
    text = _truncate(text, limit)
    return ToolOutput(text, images) if images else text


@dataclass(frozen=True, eq=False)
class MCPTool:
    """One tool of an MCP server, as the runner offers and calls it."""

    name: str
    """The name the model calls it by (sanitised for every provider)."""
    mcp_name: str
    """The name the server gave it (what ``tools/call`` sends)."""
    description: str
    """What it does, for the model."""
    params_json_schema: Mapping[str, Any]
    """The schema the model sees (``clean_schema`` of the server's)."""
    server: MCPServer = field(repr=False)
    """The server that runs it."""
    input_schema: Mapping[str, Any] = field(repr=False, default_factory=dict)
    """The server's own schema, arguments are checked against it before the call."""

    def spec(self) -> ToolSpec:
        """This tool as offered to the model."""
        return ToolSpec(
            name=self.name, description=self.description, parameters=dict(self.params_json_schema)
        )

    def validate(self, arguments: Mapping[str, Any]) -> str | None:
        """Why ``arguments`` do not fit the tool's schema, or ``None`` if they do."""
        import jsonschema  # loaded on the first MCP call, not by ``import bot``

        try:
            validator_class = jsonschema.validators.validator_for(self.input_schema)
            validator = validator_class(self.input_schema)
            error = jsonschema.exceptions.best_match(validator.iter_errors(dict(arguments)))
        except jsonschema.SchemaError:
            return None  # the server's schema is broken: let the server judge the call
        return None if error is None else _describe_schema_error(error)

    async def invoke(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> str | ToolOutput:
        """Check the arguments, call the server and return the result (text, or text and
        the images it returned).

        Never raises for the server's failure; only cancellation propagates.
        """
        problem = self.validate(arguments)
        if problem is not None:
            return error_result(f"invalid arguments for tool '{self.name}': {problem}")
        meta: dict[str, Any] = {META_SESSION_ID: ctx.session_id, META_AGENT: ctx.agent_name}
        if ctx.inbound_message_id is not None:
            meta[META_INBOUND_MESSAGE_ID] = ctx.inbound_message_id
        return await self.server.call_tool(self, dict(arguments), meta)


def build_tools(server: MCPServer, listed: Iterable[types.Tool]) -> list[MCPTool]:
    """The server's listed tools as ``MCPTool``s, names sanitised and distinct."""
    tools: list[MCPTool] = []
    taken: set[str] = set()
    for item in listed:
        name = sanitize_tool_name(item.name, taken)
        taken.add(name)
        tools.append(
            MCPTool(
                name=name,
                mcp_name=item.name,
                description=item.description or item.title or item.name,
                params_json_schema=clean_schema(item.input_schema),
                server=server,
                input_schema=copy.deepcopy(item.input_schema),
            )
        )
    return tools
