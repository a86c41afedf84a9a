"""The adapter contract under DESIGN.md's path: re-exported from ``bot.gateway.contract``.

Adapters implement the port the gateway defines; ``PlatformError`` (in
``bot.errors``) is the error family their ``send`` raises.
"""

from bot.errors import PlatformError
from bot.gateway.contract import EventHandler, PlatformAdapter, SendResult, StatusFailedHandler

__all__ = ["EventHandler", "PlatformAdapter", "PlatformError", "SendResult", "StatusFailedHandler"]
