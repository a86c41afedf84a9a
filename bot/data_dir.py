"""``DATA_DIR``: made if missing, and proven a writable folder before anything uses it.

The database, the installation secret, media files and the instance lock all
live there; a wrong value (a file, a path under ``/proc``, a folder the bot's
user may not write) must stop start-up with one line naming ``DATA_DIR``, not
with a traceback from whichever of them touches it first.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from bot.errors import ConfigurationError

__all__ = ["ensure_data_dir"]


def ensure_data_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) if missing; ``ConfigurationError`` unless it is
    then a folder this process can write in. Returns ``path``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:
        raise _wrong(f"{path} is a file, not a folder") from exc
    except OSError as exc:
        raise _wrong(f"cannot create {path} ({exc.strerror or type(exc).__name__})") from exc
    if not path.is_dir():
        raise _wrong(f"{path} is not a folder")
    try:
        # Permission bits lie to root and on some mounts: only a real write tells.
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise _wrong(f"cannot write in {path} ({exc.strerror or type(exc).__name__})") from exc
    return path


def _wrong(why: str) -> ConfigurationError:
    return ConfigurationError(
        f"DATA_DIR: {why}; set DATA_DIR to a folder the bot may write in", setting="DATA_DIR"
    )
