"""The user's words for a file a platform would not hand over: too big, or gone.

Both adapters raise these from their ``fetch_media`` hook; the gateway puts the
message into the reply as it is, so it speaks to the user, not the operator.
"""

from __future__ import annotations

from bot.errors import MediaError
from bot.gateway.contract import MediaAttachment

__all__ = ["media_gone", "media_noun", "media_too_big"]

_NOUN = {"image": "photo", "voice": "voice note", "audio": "audio file"}


def media_noun(media: MediaAttachment) -> str:
    """``photo``, ``voice note``, ``audio file`` or ``file``."""
    return _NOUN.get(media.kind, "file")


def media_too_big(media: MediaAttachment, max_bytes: int) -> MediaError:
    """Over ``MAX_MEDIA_BYTES``: said with the limit."""
    return MediaError(
        f"Your {media_noun(media)} is too big for me "
        f"(the limit is {max_bytes / (1024 * 1024):g} MB)."
    )


def media_gone(media: MediaAttachment) -> MediaError:
    """Expired, refused or cut off: ask for it again."""
    return MediaError(f"I couldn't download your {media_noun(media)}; please send it again.")
