"""JSON-schema shaping for tool parameters.

``build_json_schema`` turns a pydantic arguments model into the schema a model
sees (no titles, closed objects, ``$ref`` inlined where it can be);
``gemini_compatible_schema`` rewrites such a schema into Gemini's dialect.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

__all__ = ["SchemaTransform", "build_json_schema", "gemini_compatible_schema", "plain_copy"]

SchemaTransform = Callable[[Mapping[str, Any]], dict[str, Any]]
"""Rewrites a tool's parameter schema for a provider's JSON-schema dialect."""

_GEMINI_DROPPED_KEYS = frozenset({"additionalProperties", "$schema"})


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


def gemini_compatible_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A tool schema Gemini accepts: no ``additionalProperties``/``$schema``, ``const`` as enum.

    Gemini (also through its OpenAI endpoint) answers 400 "Unknown name
    additionalProperties" to schemas that are fine for OpenAI.
    """

    def clean(node: Any, *, name_map: bool = False) -> Any:
        if isinstance(node, Mapping):
            if name_map:
                return {str(k): clean(v) for k, v in node.items()}
            result: dict[str, Any] = {}
            for key, value in node.items():
                if key in _GEMINI_DROPPED_KEYS:
                    continue
                if key == "const":
                    result["enum"] = [value]
                    continue
                result[str(key)] = clean(value, name_map=key in ("properties", "$defs"))
            return result
        if isinstance(node, list | tuple):
            return [clean(item) for item in node]
        return node

    cleaned: dict[str, Any] = clean(schema)
    return cleaned
