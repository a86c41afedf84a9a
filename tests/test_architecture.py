"""The house rules: one-way arrows between rooms, and modules of one concept (≤ 500 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 500

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
    "bot/gateway": ("bot.platforms", "bot.console", "bot.app", "bot.cli", "bot.doctor", "agents"),
    "bot/platforms": ("bot.core", "bot.console", "bot.app", "bot.cli", "bot.config", "agents"),
    # The console sits beside the gateway: it reads the stores and steers the
    # gateway, and knows no platform and no operator agent.
    "bot/console": ("bot.platforms", "bot.app", "bot.cli", "agents"),
    "agents": ("bot.core", "bot.gateway", "bot.platforms", "bot.console", "bot.app"),
}
# what the adapters may use of the gateway: its port, nothing else
PLATFORM_GATEWAY_ALLOWED = ("bot.gateway.contract",)


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


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


@pytest.mark.parametrize("room", ["bot", "platforms"], ids=str)
def test_no_module_over_the_limit(room: str) -> None:
    lines = {
        str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
        for path in _modules(room)
    }
    assert {name: n for name, n in lines.items() if n > MAX_LINES} == {}
