"""Path-safety checks for identifiers that may reach the file system or a routing namespace.

Two checks on purpose (DESIGN §3.5):

- ``is_path_unsafe`` guards anything that may become a file name (a
  ``session_id``): no separators at all, no ``..``, no drive letter, no control
  characters, not empty.
- ``is_session_key_unsafe`` guards a *logical* routing key, which may hold
  ``/`` inside (Google-Chat style ``spaces/<id>/threads/<id>``): only ``..``
  segments, a leading separator, a drive letter, control characters or an empty
  key are refused.

Empty (or ``None``) values are unsafe for both: an empty file name resolves to
the directory itself, and an empty key would merge unrelated conversations.
"""

from __future__ import annotations

import re

__all__ = ["is_path_unsafe", "is_session_key_unsafe"]

_SEPARATORS = re.compile(r"[/\\]")


# Unicode category Cc is exactly these 65 code points: NUL and C0, DEL, C1.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def _has_control_chars(value: str) -> bool:
    return _CONTROL.search(value) is not None


def _has_drive_letter(value: str) -> bool:
    return len(value) >= 2 and value[0].isalpha() and value[1] == ":"


def is_path_unsafe(value: object) -> bool:
    """True if ``value`` could escape or misname a file inside a data directory.

    Unsafe: empty, ``..`` anywhere, ``/`` or ``\\`` anywhere, a leading drive
    letter (``C:``), NUL or any other control character.
    """
    if value is None:
        return True
    text = str(value)
    if not text:
        return True
    if ".." in text or _SEPARATORS.search(text):
        return True
    return _has_drive_letter(text) or _has_control_chars(text)


def is_session_key_unsafe(value: object) -> bool:
    """True if ``value`` could act as a traversal vector when used as a session key.

    Interior ``/`` is legitimate in a logical key; unsafe are: empty, a ``..``
    segment (between separators or at either end), a leading ``/`` or ``\\``, a
    leading drive letter, NUL or any other control character.
    """
    if value is None:
        return True
    text = str(value)
    if not text:
        return True
    if text[0] in "/\\" or _has_drive_letter(text) or _has_control_chars(text):
        return True
    return any(segment == ".." for segment in _SEPARATORS.split(text))
