"""Re-export of ``bot.platforms.text`` under its DESIGN.md path."""

from bot.platforms.text import *  # noqa: F403
from bot.platforms.text import __all__ as __all__
