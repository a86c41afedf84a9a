"""Settings, ``.env.example`` and the README's table say the same thing."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from bot.config import Settings

ROOT = Path(__file__).resolve().parents[1]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "settings_table", ROOT / "scripts" / "settings_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_generated_from_settings() -> None:
    script = _script()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    expected = script.with_table(readme, script.settings_table())
    assert readme == expected, "run: python scripts/settings_table.py --write"


def test_every_setting_has_a_description_for_the_table() -> None:
    undocumented = [name for name, info in Settings.model_fields.items() if not info.description]
    assert undocumented == []


def test_env_example_names_every_setting_and_nothing_else() -> None:
    example = (ROOT / ".env.example").read_text(encoding="utf-8")
    named = set(re.findall(r"^#? ?([A-Z][A-Z0-9_]+)=", example, flags=re.MULTILINE))
    settings = {name.upper() for name in Settings.model_fields}
    assert sorted(settings - named) == [], "settings missing from .env.example"
    assert sorted(named - settings) == [], ".env.example names what is no setting"
