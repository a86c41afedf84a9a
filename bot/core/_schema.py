"""JSON-schema shaping for tool parameters.

``build_json_schema`` turns a pydantic arguments model into the schema a model
sees (no titles, closed objects, ``$ref`` inlined where it can be);
``object_parameters`` lifts what OpenAI refuses at the top of a parameters
schema (``anyOf``/``allOf``/``oneOf``...) into a plain object schema;
``gemini_compatible_schema`` rewrites a schema into Gemini's dialect.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

__all__ = [
    "SchemaTransform",
    "build_json_schema",
    "gemini_compatible_schema",
    "object_parameters",
    "plain_copy",
]

SchemaTransform = Callable[[Mapping[str, Any]], dict[str, Any]]
"""Rewrites a tool's parameter schema for a provider's JSON-schema dialect."""

# The fields of Gemini's function ``Schema`` (a select subset of OpenAPI 3.0, as
# Google documents it for ``FunctionDeclaration.parameters``); any other key is
# answered with 400 "Unknown name ...". ``$ref``/``$defs``, ``allOf``, ``oneOf``,
# ``not``, ``if``/``then``/``else``, ``const``, ``additionalProperties``,
# ``propertyNames``, ``prefixItems``, ``$anchor``... are not among them.
_GEMINI_KEYS = frozenset(
    {
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "items",
        "minItems",
        "maxItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "propertyOrdering",
        "minLength",
        "maxLength",
        "pattern",
        "minimum",
        "maximum",
        "anyOf",
        "default",
        "example",
    }
)
# ``format`` per type, as Gemini documents it: "only 'enum' and 'date-time' are
# supported for STRING type"; float/double for numbers, int32/int64 for integers.
_GEMINI_FORMATS = {
    "string": frozenset({"enum", "date-time"}),
    "number": frozenset({"float", "double"}),
    "integer": frozenset({"int32", "int64"}),
}
_GEMINI_TYPES = frozenset({"string", "number", "integer", "boolean", "array", "object"})
# What OpenAI refuses at the top of a function's parameters ("schema must have
# type 'object' and not have 'oneOf'/'anyOf'/'allOf'/'enum'/'not' at the top level").
_TOP_LEVEL_REFUSED = ("anyOf", "oneOf", "allOf", "enum", "not", "if", "then", "else")
_MAX_SHAPES = 256


def plain_copy(value: Any) -> Any:
    """Deep copy into plain dicts and lists (schemas may hold read-only mappings)."""
    if isinstance(value, Mapping):
        return {str(key): plain_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain_copy(item) for item in value]
    return value


def _clean_schema(node: Any, *, in_name_map: bool = False) -> Any:
    """Drop pydantic's titles and close objects (``additionalProperties: false``)."""
    if isinstance(node, list):
        return [_clean_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    if in_name_map:
        # Keys here are property or definition names, never schema keywords.
        return {key: _clean_schema(value) for key, value in node.items()}
    cleaned: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        cleaned[key] = _clean_schema(value, in_name_map=key in ("properties", "$defs"))
    # Close every object with named properties; a mapping (``dict[str, int]``)
    # keeps its own ``additionalProperties`` schema.
    if "properties" in cleaned and "additionalProperties" not in cleaned:
        cleaned["additionalProperties"] = False
    return cleaned


def _refs_in(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            found.add(ref.removeprefix("#/$defs/"))
        for value in node.values():
            found |= _refs_in(value)
    elif isinstance(node, list):
        for item in node:
            found |= _refs_in(item)
    return found


def _is_recursive(name: str, defs: Mapping[str, Any]) -> bool:
    seen: set[str] = set()
    stack = list(_refs_in(defs.get(name)))
    while stack:
        current = stack.pop()
        if current == name:
            return True
        if current in seen:
            continue
        seen.add(current)
        stack.extend(_refs_in(defs.get(current)))
    return False


def _inline_refs(node: Any, defs: Mapping[str, Any], keep: set[str]) -> Any:
    """Replace ``$ref`` to non-recursive definitions by the definition itself.

    Several providers (Gemini's endpoint among them) handle inline schemas
    better than ``$defs`` references.
    """
    if isinstance(node, list):
        return [_inline_refs(item, defs, keep) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.removeprefix("#/$defs/")
        if name not in keep and name in defs:
            merged = copy.deepcopy(_inline_refs(defs[name], defs, keep))
            for key, value in node.items():
                if key != "$ref":
                    merged[key] = _inline_refs(value, defs, keep)
            return merged
    return {key: _inline_refs(value, defs, keep) for key, value in node.items()}


def build_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema a model sees for an arguments model: closed objects, refs inlined."""
    schema = _clean_schema(model.model_json_schema())
    defs: dict[str, Any] = schema.pop("$defs", {})
    keep = {name for name in defs if _is_recursive(name, defs)}
    result: dict[str, Any] = _inline_refs(schema, defs, keep)
    if keep:
        result["$defs"] = {name: _inline_refs(defs[name], defs, keep) for name in sorted(keep)}
    result.setdefault("required", [])
    return result


def _is_object_branch(branch: Mapping[str, Any]) -> bool:
    kind = branch.get("type", "object")
    return kind == "object" or (isinstance(kind, list) and "object" in kind)


def _resolve(branch: Any, defs: Mapping[str, Any]) -> Any:
    """A top-level branch that is a ``$ref`` to a definition, as the definition."""
    if isinstance(branch, Mapping):
        ref = branch.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return defs.get(ref.removeprefix("#/$defs/"), branch)
    return branch


def _object_fields(
    branch: Any, defs: Mapping[str, Any], depth: int = 0
) -> list[tuple[dict[str, Any], set[str]]]:
    """Each alternative shape of ``branch`` as (properties, required).

    ``allOf`` merges its parts into each shape; ``anyOf``/``oneOf`` give one
    shape per branch. Raises ``ValueError`` for a branch that is not an object.
    """
    branch = _resolve(branch, defs)
    if not isinstance(branch, Mapping) or depth > 8:
        raise ValueError("a top-level alternative is not an object schema")
    if branch.get("type") == "null":
        return []  # arguments are never null: this alternative cannot be taken
    if not _is_object_branch(branch):
        raise ValueError(f"a top-level alternative is of type {branch.get('type')!r}")
    properties = branch.get("properties")
    required = branch.get("required")
    shapes: list[tuple[dict[str, Any], set[str]]] = [
        (
            dict(properties) if isinstance(properties, Mapping) else {},
            {name for name in required if isinstance(name, str)}
            if isinstance(required, list)
            else set(),
        )
    ]
    for part in branch.get("allOf") or ():
        merged: list[tuple[dict[str, Any], set[str]]] = []
        for props, needed in shapes:
            for more_props, more_needed in _object_fields(part, defs, depth + 1):
                merged.append(({**more_props, **props}, needed | more_needed))
        shapes = merged
    for key in ("anyOf", "oneOf"):
        alternatives = branch.get(key)
        if not alternatives:
            continue
        choices = [
            shape for item in alternatives for shape in _object_fields(item, defs, depth + 1)
        ]
        shapes = [
            ({**more_props, **props}, needed | more_needed)
            for props, needed in shapes
            for more_props, more_needed in choices
        ]
    if len(shapes) > _MAX_SHAPES:
        raise ValueError(f"more than {_MAX_SHAPES} top-level alternatives")
    return shapes


def object_parameters(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` as a plain object schema, its top-level combinators lifted.

    OpenAI refuses ``anyOf``/``oneOf``/``allOf``/``enum``/``not`` at the top of
    a function's parameters. ``allOf`` parts are merged; the alternatives of
    ``anyOf``/``oneOf`` become one object offering every alternative's
    properties, requiring those every alternative requires. The model sees a
    looser schema; the server's own schema still judges the arguments. Raises
    ``ValueError`` when an alternative is not an object (nothing the model
    could send as arguments).
    """
    result: dict[str, Any] = plain_copy(dict(schema))
    if not any(key in result for key in _TOP_LEVEL_REFUSED):
        return result
    defs = result.get("$defs") if isinstance(result.get("$defs"), Mapping) else {}
    assert isinstance(defs, Mapping)
    shapes = _object_fields(result, defs)
    if not shapes:
        raise ValueError("no top-level alternative is an object schema")
    properties: dict[str, Any] = {}
    for props, _needed in shapes:
        for name, value in props.items():
            properties.setdefault(name, value)
    required = set.intersection(*(needed for _props, needed in shapes))
    for key in _TOP_LEVEL_REFUSED:
        result.pop(key, None)
    result["type"] = "object"
    result["properties"] = properties
    if required:
        result["required"] = [name for name in properties if name in required]
    else:
        result.pop("required", None)
    return result


def _gemini_type(node: dict[str, Any], source: Mapping[str, Any]) -> None:
    """``type: [X, "null"]`` as ``type: X, nullable: true``; several types as ``anyOf``."""
    kind = source.get("type")
    if not isinstance(kind, list):
        if isinstance(kind, str) and kind in _GEMINI_TYPES:
            node["type"] = kind
        elif kind == "null":
            node["nullable"] = True
        return
    kinds = [k for k in kind if isinstance(k, str) and k in _GEMINI_TYPES]
    if "null" in kind:
        node["nullable"] = True
    if len(kinds) == 1:
        node["type"] = kinds[0]
    elif kinds and "anyOf" not in source:
        node["anyOf"] = [{"type": k} for k in kinds]


def gemini_compatible_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tool schema in the subset of OpenAPI 3.0 that Gemini's function ``Schema`` has.

    Gemini (also through its OpenAI endpoint) answers 400 to a key its
    ``Schema`` lacks (``additionalProperties``, ``$ref``, ``allOf``,
    ``propertyNames``...) and to a string ``format`` other than ``enum`` and
    ``date-time`` (``uri``, ``email``...). Those are dropped; ``const`` becomes
    a one-value ``enum``, ``type: [X, "null"]`` becomes ``nullable``, an
    ``anyOf`` branch ``{"type": "null"}`` too, and a ``$ref`` (kept only for a
    recursive model) becomes an object without a shape. What a key constrained
    is still checked where the tool runs.
    """

    def clean(source: Any, depth: int = 0) -> Any:
        if not isinstance(source, Mapping):
            return {}
        if isinstance(source.get("$ref"), str) or depth > 32:
            kept = {k: source[k] for k in ("description",) if isinstance(source.get(k), str)}
            return {"type": "object", **kept}
        node: dict[str, Any] = {}
        _gemini_type(node, source)
        for key, value in source.items():
            if key not in _GEMINI_KEYS or key == "type":
                continue
            if key == "properties" and isinstance(value, Mapping):
                node[key] = {str(name): clean(item, depth + 1) for name, item in value.items()}
            elif key == "items":
                if isinstance(value, Mapping):
                    node[key] = clean(value, depth + 1)
            elif key == "anyOf" and isinstance(value, list):
                branches = [item for item in value if isinstance(item, Mapping)]
                if any(item.get("type") == "null" for item in branches):
                    node["nullable"] = True
                alternatives = [
                    clean(item, depth + 1) for item in branches if item.get("type") != "null"
                ]
                if len(alternatives) == 1:
                    node.update({k: v for k, v in alternatives[0].items() if k not in node})
                elif alternatives:
                    node[key] = alternatives
            elif key == "format":
                allowed = _GEMINI_FORMATS.get(str(node.get("type")), frozenset())
                if value in allowed:
                    node[key] = value
            else:
                node[str(key)] = plain_copy(value)
        if "const" in source and "enum" not in node:
            node["enum"] = [plain_copy(source["const"])]
        return node

    cleaned: dict[str, Any] = clean(schema)
    return cleaned
