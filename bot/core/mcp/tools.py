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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

# The ``@tool`` schema helpers: one way to inline definitions for every tool.
from bot.core._schema import _inline_refs, _is_recursive, object_parameters, plain_copy
from bot.core.attachments import Attachment, ToolOutput
from bot.core.models.base import ToolSpec
from bot.core.parts import describe_size
from bot.core.tools import ToolContext, error_result

if TYPE_CHECKING:
    import jsonschema
    import mcp_types as types

__all__ = [
    "DEFAULT_MAX_IMAGES",
    "DEFAULT_MAX_IMAGE_BYTES",
    "DEFAULT_MAX_OUTPUT_CHARS",
    "META_AGENT",
    "META_INBOUND_MESSAGE_ID",
    "META_SESSION_ID",
    "MCPTool",
    "ToolFilterStatic",
    "ToolServer",
    "build_tools",
    "check_tool_filter",
    "check_tool_name_prefix",
    "clean_schema",
    "create_static_tool_filter",
    "render_result",
    "sanitize_tool_name",
]

DEFAULT_MAX_OUTPUT_CHARS = 20_000
"""Characters of one tool result the model may see; the rest is cut with a note."""
DEFAULT_MAX_IMAGES = 4
"""Images of one tool result sent to the user; the rest are left out with a note."""
DEFAULT_MAX_IMAGE_BYTES = 10 * 1024 * 1024
"""Bytes of images (decoded) one tool result may send; the rest are left out with a note."""

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


class ToolFilterStatic(TypedDict, total=False):
    """Which of a server's tools an agent is offered (``tool_filter=``, as in openai-agents).

    Names are the server's own (what it lists, before any rewrite or prefix).
    With ``allowed_tool_names`` only those tools are offered; then those in
    ``blocked_tool_names`` are taken away.
    """

    allowed_tool_names: list[str] | None
    """Only these tools (``None``: every tool)."""
    blocked_tool_names: list[str] | None
    """Never these tools."""


def create_static_tool_filter(
    allowed_tool_names: Sequence[str] | None = None,
    blocked_tool_names: Sequence[str] | None = None,
) -> ToolFilterStatic | None:
    """A ``tool_filter`` from allow and block lists (``None`` when both are ``None``)."""
    if allowed_tool_names is None and blocked_tool_names is None:
        return None
    found: ToolFilterStatic = {}
    if allowed_tool_names is not None:
        found["allowed_tool_names"] = list(allowed_tool_names)
    if blocked_tool_names is not None:
        found["blocked_tool_names"] = list(blocked_tool_names)
    return found


def check_tool_filter(
    server: str, tool_filter: ToolFilterStatic | Mapping[str, Any] | None
) -> tuple[frozenset[str] | None, frozenset[str]]:
    """``tool_filter`` as (allowed names or ``None``, blocked names); ``ValueError`` if wrong."""
    if tool_filter is None:
        return None, frozenset()
    if callable(tool_filter) or not isinstance(tool_filter, Mapping):
        raise ValueError(
            f"MCP server {server!r}: tool_filter takes allowed_tool_names and "
            "blocked_tool_names (create_static_tool_filter); a function is not supported"
        )
    unknown = sorted(set(tool_filter) - {"allowed_tool_names", "blocked_tool_names"})
    if unknown:
        raise ValueError(f"MCP server {server!r}: unknown tool_filter key(s): {', '.join(unknown)}")
    lists: list[frozenset[str] | None] = []
    for key in ("allowed_tool_names", "blocked_tool_names"):
        names: Any = tool_filter.get(key)
        if names is None:
            lists.append(None)
            continue
        if not isinstance(names, list | tuple | set | frozenset) or not all(
            isinstance(n, str) for n in names
        ):
            raise ValueError(f"MCP server {server!r}: tool_filter[{key!r}] must be a list of names")
        lists.append(frozenset(names))
    return lists[0], lists[1] or frozenset()


_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,31}$")


def check_tool_name_prefix(server: str, prefix: str | None) -> str:
    """``prefix`` if every provider takes it at the start of a tool name; ``ValueError`` if not."""
    if not prefix:
        return ""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ValueError(
            f"MCP server {server!r}: tool_name_prefix must be 1 to 32 letters, digits, "
            "'_' or '-', starting with a letter or '_'"
        )
    return prefix


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
    not recursive is inlined, as for ``@tool`` schemas. A top-level
    ``anyOf``/``allOf``/``oneOf``, which OpenAI refuses, is lifted into one
    object (``object_parameters``); ``ValueError`` if that cannot be done. The
    Gemini route rewrites the rest (``gemini_compatible_schema``) for every tool.
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
    result = object_parameters(result)
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


def _images(
    blocks: Iterable[types.ContentBlock], max_images: int, max_bytes: int
) -> tuple[list[Attachment], list[str]]:
    """The image blocks as files the reply carries, and notes on those left out.

    At most ``max_images`` images and ``max_bytes`` decoded bytes: a server
    cannot fill the disk and the chat from one call.
    """
    import mcp_types as types

    images: list[Attachment] = []
    unreadable = over = 0
    room = max_bytes
    for block in blocks:
        if not isinstance(block, types.ImageContent):
            continue
        # The decoded size is known from the text's length: no decoding past the budget.
        if len(images) >= max_images or len(block.data) * 3 // 4 > room + 3:
            over += 1
            continue
        try:
            data = base64.b64decode(block.data, validate=True)
        except (binascii.Error, ValueError):
            data = b""
        if not data:
            unreadable += 1
            continue
        if len(data) > room:
            over += 1
            continue
        room -= len(data)
        images.append(Attachment.image(data, mime_type=block.mime_type))
    notes = [f"[{unreadable} unreadable image(s) left out]"] if unreadable else []
    if over:
        cap = f"{max_images} images or {describe_size(max_bytes)}"
        notes.append(f"[{over} more image(s) left out: one result sends at most {cap}]")
    return images, notes


def render_result(
    result: types.CallToolResult,
    limit: int = DEFAULT_MAX_OUTPUT_CHARS,
    *,
    max_images: int = DEFAULT_MAX_IMAGES,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
) -> str | ToolOutput:
    """What the model reads for one MCP result, its text cut to ``limit`` characters.

    Text blocks are joined; a result with structured content and no text is its
    JSON; ``is_error`` results become ``{"error": ...}`` like any failed tool.
    Image blocks become the result's attachments (``ToolOutput``): kept in the
    media store and sent with the reply, as for a function tool's files; past
    ``max_images`` images or ``max_image_bytes`` bytes they are left out with a note.
    """
    parts = [_render_block(block) for block in result.content]
    text = "\n".join(part for part in parts if part)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False, default=str)
    if result.is_error:
        return error_result(_truncate(text or "the tool reported an error", limit))
    images, notes = _images(result.content, max_images, max_image_bytes)
    text = "\n".join(filter(None, (text, *notes)))
    text = _truncate(text, limit)
    return ToolOutput(text, images) if images else text


class ToolServer(Protocol):
    """What an ``MCPTool`` needs of its server: a name for messages, and the call.

    ``bot.core.mcp.connection.MCPServer`` is one; typing against this protocol
    keeps the arrow one way (the connection knows its tools, the tools know
    only this).
    """

    @property
    def name(self) -> str:
        """The server's name, as the operator gave it."""
        ...

    async def call_tool(
        self, tool: MCPTool, arguments: dict[str, Any], meta: Mapping[str, Any]
    ) -> str | ToolOutput:
        """Call ``tool`` with ``arguments``; every failure is an error result."""
        ...


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
    server: ToolServer = field(repr=False)
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

    def prepare(self, arguments: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The arguments to send, and why they do not fit the schema (``None`` if they do).

        Models often send ``null`` for an optional argument they mean to leave
        out; where the schema does not take ``null`` there, it is left out.
        """
        given = dict(arguments)
        problem = self.validate(given)
        if problem is None:
            return given, None
        required = self.input_schema.get("required")
        needed = set(required) if isinstance(required, list) else set()
        without = {k: v for k, v in given.items() if v is not None or k in needed}
        if len(without) == len(given):
            return given, problem
        return without, self.validate(without)

    async def invoke(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> str | ToolOutput:
        """Check the arguments, call the server and return the result (text, or text and
        the images it returned).

        Never raises for the server's failure; only cancellation propagates.
        """
        sent, problem = self.prepare(arguments)
        if problem is not None:
            return error_result(f"invalid arguments for tool '{self.name}': {problem}")
        meta: dict[str, Any] = {META_SESSION_ID: ctx.session_id, META_AGENT: ctx.agent_name}
        if ctx.inbound_message_id is not None:
            meta[META_INBOUND_MESSAGE_ID] = ctx.inbound_message_id
        return await self.server.call_tool(self, sent, meta)


def _task_only(item: types.Tool) -> bool:
    execution = item.execution
    return execution is not None and execution.task_support == "required"


def build_tools(
    server: ToolServer,
    listed: Iterable[types.Tool],
    *,
    allowed: frozenset[str] | None = None,
    blocked: frozenset[str] = frozenset(),
    prefix: str = "",
    left_out: Callable[[str, str], None] | None = None,
) -> list[MCPTool]:
    """The server's listed tools as ``MCPTool``s, names sanitised and distinct.

    Only the tools ``allowed`` (``None``: all) and not ``blocked`` are kept
    (names as the server lists them); each name starts with ``prefix``. A tool
    that only runs as a task (``execution.taskSupport: "required"``: Chatflow
    makes plain calls) or whose schema cannot be made an object schema is left
    out, and ``left_out(name, why)`` is told.
    """
    tools: list[MCPTool] = []
    taken: set[str] = set()
    for item in listed:
        if (allowed is not None and item.name not in allowed) or item.name in blocked:
            continue
        if _task_only(item):
            if left_out is not None:
                left_out(item.name, "it only runs as a task, which Chatflow does not start")
            continue
        try:
            schema = clean_schema(item.input_schema)
        except ValueError as exc:
            if left_out is not None:
                left_out(item.name, f"its input schema cannot be offered to a model ({exc})")
            continue
        name = sanitize_tool_name(prefix + item.name, taken)
        taken.add(name)
        tools.append(
            MCPTool(
                name=name,
                mcp_name=item.name,
                description=item.description or item.title or item.name,
                params_json_schema=schema,
                server=server,
                input_schema=copy.deepcopy(item.input_schema),
            )
        )
    return tools
