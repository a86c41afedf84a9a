"""The console's templates and static files ship in a non-editable install.

``tests/test_packaging.py`` builds a real install; this checks the configuration
it builds from covers every file the console reads (a new template with an
unlisted suffix would otherwise be missing only from installs).
"""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "bot" / "console"


def test_every_template_and_static_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for folder in ("templates", "static"):
        package = f"bot.console.{folder}"
        assert package in config["packages"]
        patterns = config["package-data"][package]
        files = [p.name for p in (CONSOLE / folder).iterdir() if p.is_file()]
        assert files
        assert [f for f in files if not any(fnmatch(f, pat) for pat in patterns)] == []
