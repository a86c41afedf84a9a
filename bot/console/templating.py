"""The console's Jinja2 templates and static files, read once from the package.

Loaded in a thread at start-up (``ConsoleAssets.load``), so no request reads a
file on the event loop. Autoescaping is on for every template: message text
is shown literally (``<script>`` as text), never interpreted.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from jinja2 import Environment, PackageLoader, StrictUndefined, Template

__all__ = ["STATIC_TYPES", "ConsoleAssets"]

STATIC_TYPES: Final = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
"""The static files served (by name only: there is no listing)."""
_TEMPLATES: Final = (
    "base.html",
    "login.html",
    "conversations.html",
    "transcript.html",
    "messages.html",
    "ledger.html",
    "web.html",
)


@dataclass(frozen=True, slots=True)
class ConsoleAssets:
    """Compiled templates and static file bytes."""

    templates: dict[str, Template]
    """By file name."""
    static: dict[str, bytes]
    """By file name (``STATIC_TYPES``)."""

    @classmethod
    async def load(cls) -> ConsoleAssets:
        """Read and compile everything (in a thread)."""
        return await asyncio.to_thread(cls._load)

    @classmethod
    def _load(cls) -> ConsoleAssets:
        env = Environment(
            loader=PackageLoader("bot.console", "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            auto_reload=False,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        templates = {name: env.get_template(name) for name in _TEMPLATES}
        folder = resources.files("bot.console") / "static"
        static = {name: (folder / name).read_bytes() for name in STATIC_TYPES}
        return cls(templates, static)

    def render(self, name: str, **context: Any) -> str:
        """Render one template."""
        return self.templates[name].render(**context)
