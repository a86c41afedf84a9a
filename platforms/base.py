"""Re-export of ``bot.platforms.base`` under its DESIGN.md path."""

from bot.platforms.base import *  # noqa: F403
from bot.platforms.base import __all__ as __all__
