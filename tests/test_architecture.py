"""The house rules: one-way arrows between rooms, no import circle, one concept a module.

Rooms are folders. Each may import only what its arrows allow (``FORBIDDEN``);
no module takes part in an import circle, counting every import (module level,
``TYPE_CHECKING`` and function-local: a deferred import is still a dependency);
a module over ``REVIEW_LINES`` says in its docstring's first line which one
concept it holds, and none grows past ``MAX_LINES``.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REVIEW_LINES = 500
MAX_LINES = 800

# room -> import prefixes it must not use
FORBIDDEN = {
    "bot/core": (
        "bot.gateway",
        "bot.platforms",
        "bot.console",
        "bot.app",
        "bot.cli",
        "bot.config",
        "agents",
    ),
    # Stores keep sessions; they know agents only by name (a resolver), never the loop.
    "bot/core/stores": ("bot.core.runner", "bot.core.mcp", "bot.core.models"),
    # MCP servers hand tools to agents; they know no agent, runner or store.
    "bot/core/mcp": ("bot.core.agent", "bot.core.runner", "bot.core.stores"),
    "bot/core/models": ("bot.core.agent", "bot.core.runner", "bot.core.stores", "bot.core.mcp"),
    "bot/gateway": ("bot.platforms", "bot.console", "bot.app", "bot.cli", "bot.doctor", "agents"),
    # The ledger is the bottom of the gateway: rows and their states, nothing that uses them.
    "bot/gateway/ledger": (
        "bot.gateway.access",
        "bot.gateway.gateway",
        "bot.gateway.outbox",
        "bot.gateway.takeover",
        "bot.gateway.turns",
        "bot.core.runner",
    ),
    "bot/gateway/access": ("bot.gateway.gateway", "bot.gateway.outbox", "bot.core.runner"),
    "bot/platforms": ("bot.core", "bot.console", "bot.app", "bot.cli", "bot.config", "agents"),
    # The console sits beside the gateway: it reads the stores and steers the
    # gateway, and knows no platform and no operator agent.
    "bot/console": ("bot.platforms", "bot.app", "bot.cli", "agents"),
    "agents": ("bot.core", "bot.gateway", "bot.platforms", "bot.console", "bot.app"),
    # Spans for every room (the core, the gateway and the logs use it): it uses none of them.
    "bot/tracing": (
        "bot.core",
        "bot.gateway",
        "bot.platforms",
        "bot.console",
        "bot.app",
        "bot.cli",
        "bot.config",
        "bot.logs",
        "bot.metrics",
        "bot.errors",
        "agents",
    ),
}
# what the adapters may use of the gateway: its port, nothing else
PLATFORM_GATEWAY_ALLOWED = ("bot.gateway.contract",)


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path) -> Iterator[tuple[str, str | None]]:
    """``(module, name)`` for every import in ``path``: ``name`` may be a submodule."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = _name(path) if path.name == "__init__.py" else _name(path).rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                yield module, alias.name


def _imports(path: Path) -> list[str]:
    return [module for module, _ in _imported(path)]


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("room", sorted(FORBIDDEN), ids=str)
def test_arrows_run_one_way(room: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules(room)
        for name in _imports(path)
        if any(_matches(name, prefix) for prefix in FORBIDDEN[room])
        or (
            room == "bot/platforms"
            and _matches(name, "bot.gateway")
            and not any(_matches(name, ok) for ok in PLATFORM_GATEWAY_ALLOWED)
        )
    ]
    assert wrong == []


def _graph() -> dict[str, set[str]]:
    modules = {_name(path): path for path in _modules("bot")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, item in _imported(path):
            target = f"{module}.{item}" if f"{module}.{item}" in modules else module
            if target in modules and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_no_import_circle() -> None:
    assert _circles(_graph()) == []


def test_the_circle_check_sees_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("room", ["bot", "platforms"], ids=str)
def test_no_module_over_the_limit(room: str) -> None:
    lines = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in _modules(room)
    }
    assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}


def test_a_long_module_names_its_concept_first() -> None:
    unnamed = []
    for path in _modules("bot"):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) <= REVIEW_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if not docstring.strip().splitlines()[:1]:
            unnamed.append(str(path.relative_to(ROOT)))
    assert unnamed == []


def test_span_helpers_are_called_through_the_module() -> None:
    # spans.install rebinds the helpers to the live recorder's methods: a helper
    # imported by name keeps whatever was installed at the import (the no-op).
    rebound = {"span", "start", "capture", "resume", "detached", "traceparent", "log_ids"}
    found = [
        f"{path.relative_to(ROOT)}: {name}"
        for folder in ("bot", "agents", "tests", "bench")
        for path in _modules(folder)
        for module, name in _imported(path)
        if module == "bot.tracing.spans" and name in rebound
    ]
    assert found == []
