"""Function tools: typed Python functions the model may call.

``@tool`` reads a function's signature and docstring once, builds a pydantic
model for its arguments (the JSON schema the model sees) and wraps the call so
that nothing a tool does can crash a turn: invalid arguments, exceptions and
timeouts all come back to the model as an error result it can react to.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, get_type_hints, overload

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import PydanticSerializationError, to_json

from bot.core._schema import build_json_schema
from bot.core.attachments import ToolOutput

__all__ = [
    "DEFAULT_TOOL_TIMEOUT",
    "ApprovalPolicy",
    "ApprovalVerdict",
    "Decline",
    "FunctionTool",
    "ParsedDocstring",
    "ToolContext",
    "build_json_schema",
    "error_result",
    "parse_docstring",
    "tool",
]

logger = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT = 30.0
"""Seconds a tool may run before it is cancelled and reported as timed out."""


@dataclass(frozen=True, slots=True)
class Decline:
    """A ``needs_approval`` check's answer for a call that cannot happen (an unpaid
    invoice's refund): no question is asked, the tool does not run, and the model reads
    ``reason`` as the call's result."""

    reason: str
    """Why not, in words the model can pass on ("Invoice INV-2003 is not paid yet.")."""


ApprovalVerdict = bool | str | Decline | None
"""What a ``needs_approval`` function returns: ``False`` or ``None`` (run it now),
``True`` (ask, with the default question), a ``str`` (ask this question) or a
``Decline`` (refuse without asking)."""

ApprovalPolicy = (
    bool
    | str
    | Callable[["ToolContext", dict[str, Any]], ApprovalVerdict | Awaitable[ApprovalVerdict]]
)
"""``needs_approval``: always (``True``), never (``False``), always with this question
(a ``str``: a template whose ``{field}`` names are the call's arguments, e.g. ``"May I
refund order {order_id} for {amount:.2f}?"``), or a function of the call's context and
arguments (sync or async) returning an ``ApprovalVerdict``, each time the model calls
the tool."""

_TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_MAX_ERROR_TEXT = 500


@dataclass(frozen=True)
class ToolContext:
    """What a tool may know about the turn that called it.

    Declare it as a tool's first parameter (annotated ``ToolContext``) to get
    it; it is injected by the runner and never shown to the model.
    """

    session_id: str
    """The session the turn runs in."""
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """A read-only snapshot of the session's metadata."""
    inbound_message_id: str | None = None
    """Platform id of the message that started the turn: an idempotency key for
    tools with side effects (the same inbound message may be re-run after a crash)."""
    agent_name: str = ""
    """Name of the agent whose model requested the call."""
    store: Any = None
    """The Runner's session store (a ``BaseSessionStore``; typed loosely, as the stores
    import this module), for built-in tools that keep rows in its database."""
    effects: list[object] = field(default_factory=list)
    """Requests a tool leaves for the turn's own commit (``RunResult.effects``): a
    host applies them in the turn's transaction, so a rolled-back turn leaves none."""
    services: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))
    """Host settings for built-in tools, by name (e.g. ``bot.core.scheduling.POLICY``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, MappingProxyType):
            object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))


def error_result(message: str) -> str:
    """The text a failed tool call returns to the model: ``{"error": message}``."""
    return json.dumps({"error": message}, ensure_ascii=False)


def _serialise(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    try:
        return to_json(value).decode()
    except (PydanticSerializationError, TypeError, ValueError):
        return str(value)


@dataclass(frozen=True)
class ParsedDocstring:
    """The parts of a docstring a tool schema uses."""

    description: str
    """Summary and long description, paragraphs kept, lines joined."""
    params: Mapping[str, str]
    """Parameter name -> description, from the ``Args:`` (or ``Parameters``) section."""


def _reflow(text: str | None) -> str:
    """Paragraphs kept, the lines inside each joined by single spaces."""
    paragraphs = re.split(r"\n\s*\n", text or "")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def parse_docstring(doc: str | None) -> ParsedDocstring:
    """A docstring's description and ``Args:`` entries (Google, NumPy or reST style)."""
    if not doc:
        return ParsedDocstring("", {})
    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return ParsedDocstring(_reflow(inspect.cleandoc(doc)), {})
    params = {p.arg_name: _reflow(p.description) for p in parsed.params}
    return ParsedDocstring(_reflow(parsed.description), params)


def _describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = ".".join(str(part) for part in err.get("loc", ())) or "arguments"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _truncate(text: str, limit: int = _MAX_ERROR_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, eq=False)
class FunctionTool:
    """A tool the model can call: its public description plus the wrapped function."""

    name: str
    """Name the model calls it by (``^[A-Za-z0-9_-]{1,64}$``)."""
    description: str
    """What it does, for the model."""
    params_json_schema: Mapping[str, Any]
    """JSON schema of the arguments object (closed: ``additionalProperties`` false)."""
    function: Callable[..., Any] = field(repr=False)
    """The decorated function, unchanged."""
    args_model: type[BaseModel] = field(repr=False)
    """Pydantic model the arguments are validated with before each call."""
    takes_context: bool = False
    """Whether the function's first parameter receives a ``ToolContext``."""
    timeout: float | None = DEFAULT_TOOL_TIMEOUT
    """Seconds before the call is cancelled and reported as timed out; ``None``: never."""
    needs_approval: ApprovalPolicy = False
    """Whether a call waits for a person's yes before it runs (``ApprovalPolicy``)."""

    @property
    def gated(self) -> bool:
        """Whether any call of this tool may wait for approval (``needs_approval`` set)."""
        return self.needs_approval is not False

    async def approval(
        self, ctx: ToolContext, arguments: Mapping[str, Any]
    ) -> str | Decline | None:
        """Whether this call must wait for a person's yes, and with which question.

        ``None``: run it now. A ``str``: ask first, with this question (``""``: the
        default question, ``bot.core.approvals.default_question``). A ``Decline``: do
        not ask and do not run. A function that raises counts as ``""`` (ask): a tool
        worth gating is not run because its check failed; so does a template that
        does not fit the arguments.
        """
        policy = self.needs_approval
        if isinstance(policy, bool):
            return "" if policy else None
        if isinstance(policy, str):
            return self._question(policy, arguments)
        try:
            verdict = policy(ctx, dict(arguments))
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:
            logger.warning(
                "needs_approval of tool %s raised %s; asking for approval",
                self.name,
                type(exc).__name__,
            )
            return ""
        if isinstance(verdict, Decline):
            return verdict
        if isinstance(verdict, str):
            return verdict.strip()
        return "" if verdict else None

    def _question(self, template: str, arguments: Mapping[str, Any]) -> str:
        """``template`` filled with the call's arguments; ``""`` (the default question)
        when it names one the call lacks or a format the value does not take."""
        try:
            return template.format_map(dict(arguments)).strip()
        except (KeyError, IndexError, ValueError, TypeError, AttributeError) as exc:
            logger.warning(
                "the approval question of tool %s does not fit its call (%s); "
                "asking with the default question",
                self.name,
                type(exc).__name__,
            )
            return ""

    async def invoke(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> str:
        """Validate ``arguments``, run the function and return its result as text.

        Never raises for a tool's own failure: invalid arguments, an exception
        or a timeout become an ``{"error": ...}`` result for the model. Only
        cancellation of the caller propagates. A ``ToolOutput`` result gives its
        text (``run`` keeps its attachments too).
        """
        output = await self.run(ctx, arguments)
        return output if isinstance(output, str) else output.text

    async def run(self, ctx: ToolContext, arguments: Mapping[str, Any]) -> str | ToolOutput:
        """``invoke``, but a ``ToolOutput`` the function returned comes back whole (the
        Runner stores its attachments)."""
        try:
            parsed = self.args_model.model_validate(dict(arguments))
        except ValidationError as exc:
            return error_result(
                f"invalid arguments for tool '{self.name}': {_describe_validation_error(exc)}"
            )
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        args: tuple[Any, ...] = (ctx,) if self.takes_context else ()
        try:
            async with asyncio.timeout(self.timeout) as scope:
                value = await self._call(args, kwargs)
        except TimeoutError as exc:
            if scope.expired():
                logger.warning("Tool %s timed out after %s s", self.name, self.timeout)
                return error_result(f"tool '{self.name}' timed out after {self.timeout:g} s")
            return self._failure(exc)
        except Exception as exc:
            return self._failure(exc)
        return value if isinstance(value, ToolOutput) else _serialise(value)

    def _failure(self, exc: Exception) -> str:
        logger.warning("Tool %s raised %s", self.name, type(exc).__name__)
        text = str(exc)
        detail = f"{type(exc).__name__}: {_truncate(text)}" if text else type(exc).__name__
        return error_result(f"tool '{self.name}' failed: {detail}")

    async def _call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if inspect.iscoroutinefunction(self.function):
            return await self.function(*args, **kwargs)
        # A sync tool may block (HTTP, disk): keep it off the event loop. On a
        # timeout the thread cannot be killed; it finishes in the background.
        value = await asyncio.to_thread(self.function, *args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        return value


def _tool_from_function(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    timeout: float | None,
    needs_approval: ApprovalPolicy = False,
) -> FunctionTool:
    if isinstance(fn, FunctionTool):
        raise TypeError(f"{fn.name!r} is already a tool")
    if not callable(fn):
        raise TypeError(f"@tool needs a function, got {type(fn).__name__}")
    tool_name: str = name if name is not None else str(getattr(fn, "__name__", ""))
    if not _TOOL_NAME_RE.match(tool_name):
        raise ValueError(f"tool name {tool_name!r} must match ^[A-Za-z0-9_-]{{1,64}}$")
    if timeout is not None and timeout <= 0:
        raise ValueError("tool timeout must be positive (or None for no limit)")
    if not isinstance(needs_approval, bool | str) and not callable(needs_approval):
        raise TypeError(
            f"tool {tool_name!r}: needs_approval must be a bool, a question or a callable"
        )
    if isinstance(needs_approval, str) and not needs_approval.strip():
        raise ValueError(f"tool {tool_name!r}: the approval question is empty")
    signature = inspect.signature(fn)
    try:
        hints = get_type_hints(fn, include_extras=True)
    except NameError as exc:
        raise TypeError(f"tool {tool_name!r}: cannot resolve a type hint: {exc}") from exc
    doc = parse_docstring(inspect.getdoc(fn))
    fields: dict[str, Any] = {}
    takes_context = False
    for index, param in enumerate(signature.parameters.values()):
        annotation = hints.get(param.name, Any)
        if annotation is ToolContext:
            if index != 0:
                raise TypeError(f"tool {tool_name!r}: ToolContext must be the first parameter")
            takes_context = True
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"tool {tool_name!r}: *args and **kwargs are not supported")
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {tool_name!r}: positional-only parameters are not supported")
        if param.name.startswith("_"):
            raise TypeError(f"tool {tool_name!r}: parameter names may not start with '_'")
        field_kwargs: dict[str, Any] = {}
        if doc.params.get(param.name):
            field_kwargs["description"] = doc.params[param.name]
        if param.default is not inspect.Parameter.empty:
            field_kwargs["default"] = param.default
        fields[param.name] = (annotation, Field(**field_kwargs))
    model_name = f"{tool_name}_args"
    args_model: type[BaseModel] = create_model(
        model_name,
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
        **fields,
    )
    try:
        schema = build_json_schema(args_model)
    except Exception as exc:  # pydantic raises several types for unsupported hints
        raise TypeError(f"tool {tool_name!r}: cannot build a JSON schema: {exc}") from exc
    tool_description = description if description is not None else doc.description
    return FunctionTool(
        name=tool_name,
        description=tool_description or tool_name.replace("_", " "),
        params_json_schema=schema,
        function=fn,
        args_model=args_model,
        takes_context=takes_context,
        timeout=timeout,
        needs_approval=needs_approval,
    )


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = DEFAULT_TOOL_TIMEOUT,
    needs_approval: ApprovalPolicy = False,
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = DEFAULT_TOOL_TIMEOUT,
    needs_approval: ApprovalPolicy = False,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Turn a typed function (sync or async) into a ``FunctionTool``.

    Use bare (``@tool``) or with options (``@tool(name=..., description=...,
    timeout=...)``). The schema comes from the type hints, the description
    from the docstring's text and the parameter descriptions from its
    ``Args:`` section. A first parameter annotated ``ToolContext`` is injected.
    ``needs_approval=True`` makes a call wait for a person's yes: the Runner ends
    the turn with a ``RunResult.pending_approval`` (the question, with Approve /
    Deny) instead of running it. A ``str`` is the question to ask, a template of
    the arguments (``"May I refund order {order_id}?"``); a function ``(ctx,
    arguments)``, sync or async, decides per call (``ApprovalVerdict``): no,
    yes, its own question, or ``Decline(reason)`` to refuse without asking.
    """
    if fn is not None:
        return _tool_from_function(
            fn, name=name, description=description, timeout=timeout, needs_approval=needs_approval
        )

    def decorate(func: Callable[..., Any]) -> FunctionTool:
        return _tool_from_function(
            func,
            name=name,
            description=description,
            timeout=timeout,
            needs_approval=needs_approval,
        )

    return decorate
