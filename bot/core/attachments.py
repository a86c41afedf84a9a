"""Files a tool hands to the user: ``Attachment``, ``ToolOutput`` and where their bytes go.

A tool returns ``ToolOutput(text, attachments=[Attachment.image(jpeg)])``
instead of a plain value. The model sees ``text`` and one line per file saying
that it goes along with the answer; the bytes go into the media store
(``DATA_DIR/media/``, content-addressed) and the turn's ``RunResult`` carries
them as ``ImagePart``/``DocumentPart`` references, which the gateway records
with the reply it owes and sends after it. Message rows and ledger rows only
ever hold the references.

A path must be inside the attachments folder (``ATTACHMENTS_DIR``, default
``DATA_DIR/outbox``; a relative path is read from there), after symlinks are
resolved: a tool cannot be talked into mailing ``/etc/passwd``, the database,
the installation secret or other users' files from ``DATA_DIR/media`` to a chat.
"""

from __future__ import annotations

import asyncio
import logging
import mimetypes
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bot.core.buttons import Button, normalise_buttons
from bot.core.media_store import DEFAULT_MAX_MEDIA_BYTES, MediaStore
from bot.core.messages import AudioPart, DocumentPart, ImagePart
from bot.core.mime import sniff_mime
from bot.core.parts import describe_size
from bot.errors import StorageError

__all__ = [
    "Attachment",
    "AttachmentKind",
    "OutgoingPart",
    "ToolFiles",
    "ToolOutput",
    "attachment_note",
]

logger = logging.getLogger(__name__)

AttachmentKind = Literal["image", "document"]
"""``image`` goes as a photo (Telegram ``sendPhoto``, WhatsApp image); ``document`` as a file."""
OutgoingPart = ImagePart | DocumentPart | AudioPart
"""A stored attachment: what ``RunResult.attachments`` and the ledger hold. An
``AudioPart`` with ``voice=True`` is the reply spoken (``bot.gateway.voice_replies``)."""

_PHOTO_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_DEFAULT_MEDIA_DIR = "data/media"
_OUTSIDE = "the path is outside the attachments folder (ATTACHMENTS_DIR)"


@dataclass(frozen=True, slots=True)
class Attachment:
    """One file a tool returns: bytes, or a path in the attachments folder.

    ``kind`` ``None`` means a photo for JPEG/PNG/GIF/WebP bytes, a document
    otherwise. ``mime_type`` ``None`` is read from the bytes or the file name.
    """

    data: bytes | None = None
    """The file's bytes (or give ``path``)."""
    path: str | os.PathLike[str] | None = None
    """A file inside ``ATTACHMENTS_DIR`` (default ``DATA_DIR/outbox``; relative paths
    are read from there)."""
    kind: AttachmentKind | None = None
    """``image`` or ``document``; ``None``: decided from the type."""
    file_name: str | None = None
    """The name the user sees for a document (default: the path's name, or ``file.<ext>``)."""
    mime_type: str | None = None
    """MIME type; ``None``: sniffed from the bytes, else guessed from the name."""

    def __post_init__(self) -> None:
        if (self.data is None) == (self.path is None):
            raise ValueError("an Attachment needs exactly one of data or path")
        if self.kind not in (None, "image", "document"):
            raise ValueError(f"attachment kind must be image or document, not {self.kind!r}")

    @classmethod
    def image(
        cls,
        data: bytes | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        file_name: str | None = None,
        mime_type: str | None = None,
    ) -> Attachment:
        """A photo (JPEG, PNG, GIF or WebP)."""
        return cls(data=data, path=path, kind="image", file_name=file_name, mime_type=mime_type)

    @classmethod
    def file(
        cls,
        data: bytes | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        file_name: str | None = None,
        mime_type: str | None = None,
    ) -> Attachment:
        """A document (PDF, CSV, anything), sent as a file."""
        return cls(data=data, path=path, kind="document", file_name=file_name, mime_type=mime_type)


@dataclass(frozen=True, slots=True)
class ToolOutput:
    """What a tool may return instead of a plain value: text for the model, files for the user."""

    text: str
    """The result the model reads."""
    attachments: Sequence[Attachment] = ()
    """Files sent to the user with the answer of this turn."""
    buttons: Sequence[str | Button] = ()
    """Choices shown under the turn's final reply (strings are labels); normalised to
    ``tuple[Button, ...]``. More than ``MAX_BUTTONS`` is an error result for the tool."""
    anyone_may_tap: bool = False
    """False (the default): the keyboard belongs to the person the turn answered; in a
    group another member's tap is refused ("Only the person who asked can answer
    this."). True: any member may tap it (a poll for the whole group); the first tap
    answers it, in the conversation that showed it, as the tapper's message."""

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError("ToolOutput.text must be a str")
        object.__setattr__(self, "attachments", tuple(self.attachments))
        object.__setattr__(self, "buttons", normalise_buttons(self.buttons))


def attachment_note(part: OutgoingPart) -> str:
    """The line the model reads for a file it attached."""
    what = "photo" if isinstance(part, ImagePart) else "file"
    name = f' "{part.file_name}"' if part.file_name else ""
    size = describe_size(part.size)
    return f"[{what}{name} ({size}) attached: the user receives it with your answer]"


class ToolFiles:
    """Stores the files tools return and turns their output into text plus references."""

    def __init__(
        self,
        media_dir: str | os.PathLike[str] | None,
        *,
        max_bytes: int = 0,
        files_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``media_dir`` is ``DATA_DIR/media`` (``None``: ``data/media``); paths must be
        inside ``files_dir`` (``ATTACHMENTS_DIR``; ``None``: ``DATA_DIR/outbox``).
        ``max_bytes`` 0 is ``DEFAULT_MAX_MEDIA_BYTES``."""
        root = Path(media_dir if media_dir is not None else _DEFAULT_MEDIA_DIR)
        self.store = MediaStore(root, max_bytes=max_bytes or DEFAULT_MAX_MEDIA_BYTES)
        self.data_dir = root.parent
        self.files_dir = Path(files_dir) if files_dir is not None else self.data_dir / "outbox"

    async def keep(self, output: str | ToolOutput) -> tuple[str, list[OutgoingPart]]:
        """The text the model reads and the stored files of one tool result.

        A file that cannot be used (outside the attachments folder, missing, too
        big, empty) is left out and the model is told so in the text.
        """
        if isinstance(output, str):
            return output, []
        lines = [output.text] if output.text else []
        parts: list[OutgoingPart] = []
        for attachment in output.attachments:
            try:
                part = await self._store(attachment)
            except (ValueError, StorageError) as exc:
                logger.warning("A tool's attachment was refused: %s", type(exc).__name__)
                lines.append(f"[a file could not be attached: {exc}]")
                continue
            parts.append(part)
            lines.append(attachment_note(part))
        return "\n".join(lines), parts

    async def _store(self, attachment: Attachment) -> OutgoingPart:
        data = attachment.data
        name = attachment.file_name
        if attachment.path is not None:
            path = await asyncio.to_thread(self._inside_files_dir, Path(attachment.path))
            data = await asyncio.to_thread(_read, path, self.store.max_bytes)
            name = name or path.name
        assert data is not None
        if not data:
            raise ValueError("the file is empty")
        if len(data) > self.store.max_bytes:
            raise ValueError(f"the file is over {describe_size(self.store.max_bytes)}")
        mime = attachment.mime_type or sniff_mime(data)
        if mime is None and name:
            mime = mimetypes.guess_type(name)[0]
        mime = mime or "application/octet-stream"
        kind = attachment.kind or ("image" if mime in _PHOTO_TYPES else "document")
        if kind == "image" and sniff_mime(data) not in _PHOTO_TYPES:
            raise ValueError("the image is not a JPEG, PNG, GIF or WebP")
        if not name:
            extension = mimetypes.guess_extension(mime) or ".bin"
            name = f"{'image' if kind == 'image' else 'file'}{extension}"
        sha256 = await self.store.put(data)
        if kind == "image":
            return ImagePart(sha256=sha256, mime_type=mime, size=len(data), file_name=name)
        return DocumentPart(sha256=sha256, mime_type=mime, size=len(data), file_name=name)

    def _inside_files_dir(self, path: Path) -> Path:
        base = self.files_dir.resolve()
        if self.data_dir.resolve().is_relative_to(base):
            # A folder holding DATA_DIR would hand out the database and the secret.
            raise ValueError("ATTACHMENTS_DIR holds DATA_DIR, so no path is allowed")
        resolved = (path if path.is_absolute() else base / path).resolve()
        if not resolved.is_relative_to(base):
            raise ValueError(_OUTSIDE)
        return resolved


def _read(path: Path, max_bytes: int) -> bytes:
    try:
        if path.stat().st_size > max_bytes:
            raise ValueError(f"the file is over {describe_size(max_bytes)}")
        return path.read_bytes()
    except FileNotFoundError as exc:
        raise ValueError("no such file") from exc
    except IsADirectoryError as exc:
        raise ValueError("the path is a directory") from exc
    except OSError as exc:
        raise StorageError(f"could not read the file: {type(exc).__name__}") from exc
