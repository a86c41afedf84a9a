"""Re-export of ``bot.platforms.whatsapp`` under its DESIGN.md path."""

from bot.platforms.whatsapp import *  # noqa: F403
from bot.platforms.whatsapp import __all__ as __all__
