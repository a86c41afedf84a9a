"""Re-export of ``bot.platforms.console`` under its DESIGN.md path."""

from bot.platforms.console import *  # noqa: F403
from bot.platforms.console import __all__ as __all__
