"""Session and message ids: validation, and the form of a session id fit for logs.

Core knows no id format. A session id chosen by a library user may be a phone
number, so every id is hashed in logs unless a predicate registered with
``set_log_safe_session_ids`` says the id is already safe (the gateway registers
its ``<platform>-<16 hex>`` ids, which are hashes themselves).
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable

from bot.core.paths import is_path_unsafe

__all__ = [
    "LogSafePredicate",
    "check_message_id",
    "log_session_id",
    "new_hex_id",
    "set_log_safe_session_ids",
    "validate_session_id",
]

# A generator of its own (the module's global one belongs to callers and test tools),
# seeded from the OS, and again in a forked child so two processes never share ids.
_generator = random.Random()
os.register_at_fork(after_in_child=_generator.seed)
_random_bits = _generator.getrandbits


def new_hex_id() -> str:
    """32 random hex digits (128 bits): an id that must be unique, never one that must be secret.

    The Mersenne Twister, seeded from the OS, makes it without the system call the
    CSPRNG (``uuid4``, ``secrets``) costs per id; never use it for tokens or keys.
    """
    return f"{_random_bits(128):032x}"


LogSafePredicate = Callable[[str], bool]
"""True for a session id that may appear in logs as it is."""

_log_safe: LogSafePredicate | None = None


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a safe, non-empty string; raise otherwise."""
    if not isinstance(session_id, str):
        raise TypeError(f"session_id must be a str, not {type(session_id).__name__}")
    if is_path_unsafe(session_id):
        raise ValueError(
            "session_id must be non-empty and free of '..', '/', '\\', drive letters "
            "and control characters"
        )
    return session_id


def check_message_id(message_id: object) -> str:
    """Return ``message_id`` if it is a non-empty string (a dedup key); raise otherwise."""
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("message_id must be a non-empty str")
    return message_id


def set_log_safe_session_ids(predicate: LogSafePredicate | None) -> LogSafePredicate | None:
    """Register which session ids logs may show as they are; return the previous predicate.

    ``None`` (the default) hashes every id. The predicate is process-wide.
    """
    global _log_safe
    previous, _log_safe = _log_safe, predicate
    return previous


def log_session_id(session_id: str) -> str:
    """A form of ``session_id`` fit for logs: as it is if registered safe, else hashed."""
    if _log_safe is not None and _log_safe(session_id):
        return session_id
    return "sid#" + hashlib.sha256(session_id.encode("utf-8")).hexdigest()[:12]
