"""What both adapters share when they download a user's file: the byte cap, kept while
the body streams in (a missing or lying size never lets more in), and the user's words
for a file a platform would not hand over (too big, or gone).

The errors are raised from the adapters' ``fetch_media`` hook; the gateway puts the
message into the reply as it is, so it speaks to the user, not the operator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.errors import MediaError
from bot.gateway.contract import MediaAttachment

if TYPE_CHECKING:
    import httpx

__all__ = ["media_gone", "media_noun", "media_too_big", "read_capped"]

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


async def read_capped(response: httpx.Response, media: MediaAttachment, max_bytes: int) -> bytes:
    """The body of a streamed ``response``, or ``media_too_big`` once past ``max_bytes``."""
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > max_bytes:
            raise media_too_big(media, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)
