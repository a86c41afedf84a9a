"""Re-export of ``bot.platforms.telegram`` under its DESIGN.md path."""

from bot.platforms.telegram import *  # noqa: F403
from bot.platforms.telegram import __all__ as __all__
