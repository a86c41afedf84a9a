"""Re-export of ``bot.platforms.whatsapp_payload`` under its DESIGN.md path."""

from bot.platforms.whatsapp_payload import *  # noqa: F403
from bot.platforms.whatsapp_payload import __all__ as __all__
