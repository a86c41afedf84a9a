"""The console's Jinja2 templates and static files, read once from the package.

Loaded in a thread at start-up (``ConsoleAssets.load``), so no request reads a
file on the event loop. Autoescaping is on for every template: message text
is shown literally (``<script>`` as text), never interpreted. Every value a
template prints also passes ``show_bidi_controls`` (the environment's
``finalize``, so no template spot can forget it): a bidirectional control
character, invisible yet able to reorder what follows it (``invoice\u202efdp.exe``
displays as "invoiceexe.pdf"), is shown as its code point instead, ``<U+202E>``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from jinja2 import Environment, PackageLoader, StrictUndefined, Template
from markupsafe import Markup, escape

__all__ = ["BIDI_CONTROLS", "STATIC_TYPES", "ConsoleAssets", "show_bidi_controls"]

BIDI_CONTROLS: Final = frozenset(
    chr(code)
    for code in (
        0x061C,  # Arabic letter mark
        0x200E,  # left-to-right mark
        0x200F,  # right-to-left mark
        *range(0x202A, 0x202F),  # embeddings, overrides and their pop (LRE..RLO)
        *range(0x2066, 0x206A),  # isolates and their pop (LRI..PDI)
    )
)
"""Characters that change the display order of the text around them."""
_VISIBLE: Final = {ord(char): f"<U+{ord(char):04X}>" for char in BIDI_CONTROLS}
_VISIBLE_ESCAPED: Final = {code: str(escape(text)) for code, text in _VISIBLE.items()}

STATIC_TYPES: Final = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
"""The static files served (by name only: there is no listing)."""
_TEMPLATES: Final = (
    "base.html",
    "login.html",
    "conv_list.html",
    "conversations.html",
    "head.html",
    "transcript.html",
    "messages.html",
    "live.html",
    "ledger.html",
    "scheduled.html",
    "knowledge.html",
    "approvals.html",
    "web.html",
    "memory.html",
)


def show_bidi_controls(value: Any) -> Any:
    """``value`` with each bidi control written out as ``<U+XXXX>``; not a string: as is.

    Runs before autoescaping, so the marker is escaped like the rest of the text;
    markup already escaped (``Markup``) gets the marker escaped by hand.
    """
    if isinstance(value, Markup):
        return Markup(str(value).translate(_VISIBLE_ESCAPED))
    if isinstance(value, str):
        return value.translate(_VISIBLE)
    return value


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
            finalize=show_bidi_controls,
        )
        templates = {name: env.get_template(name) for name in _TEMPLATES}
        folder = resources.files("bot.console") / "static"
        static = {name: (folder / name).read_bytes() for name in STATIC_TYPES}
        return cls(templates, static)

    def render(self, name: str, **context: Any) -> str:
        """Render one template."""
        return self.templates[name].render(**context)
