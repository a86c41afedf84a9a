"""The media step of a turn: fetch what came attached, check it, turn it into message parts.

It runs after tx 1 and before the turn, inside the same work item, so a crash
anywhere in it leaves the inbox row ``received`` and the next start runs it
again from the journal. Nothing is fetched twice needlessly: the bytes are
content-addressed in the ``MediaStore`` and a note maps the platform's file id
to them (and the audio's hash to its transcript), so a re-run after a crash
reads what the first run already got. A WhatsApp media id outlives its
download URL, so a re-run fetches a fresh URL.

Whatever goes wrong with one attachment (too big, a type we do not read, bytes
that are not what the MIME type says, a failed download, an unreadable PDF, a
PDF that takes too long to read, a bug or a library's surprise) becomes one
plain sentence for the user; the turn still runs on the text. PDFs are read in
child processes that are killed at ``DOCUMENT_TIMEOUT_SECONDS`` (see
``bot.core.documents``), so a hostile file costs its own turn and nothing else.
Logs name attachments by kind and size only: never bytes, transcripts or file names.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from bot.config import Settings
from bot.core.documents import (
    DOCUMENT_TIMEOUT,
    MAX_DOCUMENT_CHARS,
    DocumentReader,
    is_readable_document,
)
from bot.core.media_store import MediaStore
from bot.core.messages import (
    AudioPart,
    ContactPart,
    DocumentPart,
    ImagePart,
    LocationPart,
    MessagePart,
)
from bot.core.mime import sniff_mime
from bot.core.models.base import Usage
from bot.core.models.transcription import MeteredTranscriber, OpenAITranscriber, Transcriber
from bot.errors import ChatflowError, MediaError, ModelError
from bot.gateway.contract import MediaAttachment, MessageEvent, PlatformAdapter
from bot.logs import log_ref
from bot.tracing import names, spans

__all__ = [
    "FILE_KINDS",
    "MEDIA_STEP_TIMEOUT",
    "MediaFetcher",
    "PreparedMedia",
    "build_media_fetcher",
]

logger = logging.getLogger(__name__)

FILE_KINDS = frozenset({"image", "voice", "audio", "document"})
"""Attachment kinds whose bytes are downloaded."""
MEDIA_STEP_TIMEOUT = 180.0
"""Longest one attachment may take (download, transcription, reading), so a stuck
platform or speech service never holds its conversation up for good."""

_VISION_TYPES = frozenset({"image/jpeg", "image/png", "image/webp", "image/gif"})
_NOUN = {"image": "photo", "voice": "voice note", "audio": "audio file", "document": "file"}


@dataclass(frozen=True)
class PreparedMedia:
    """The outcome of the media step."""

    parts: tuple[MessagePart, ...] = ()
    """Parts for the turn's user message."""
    notices: tuple[str, ...] = field(default_factory=tuple)
    """One sentence per attachment that could not be used, said before the answer."""
    transcriptions: tuple[Usage, ...] = ()
    """Token usage of each transcription call that reported any (the turn records it)."""


def _extension(mime: str) -> str:
    return {
        "audio/ogg": "ogg",
        "audio/mpeg": "mp3",
        "audio/mp4": "m4a",
        "audio/wav": "wav",
        "audio/aac": "aac",
        "audio/amr": "amr",
        "audio/webm": "webm",
    }.get(mime, "bin")


class MediaFetcher:
    """Downloads, checks and reads a message's attachments (the turn's media step)."""

    def __init__(
        self,
        store: MediaStore,
        *,
        transcriber: Transcriber | None = None,
        transcription_model: str = "",
        max_document_chars: int = MAX_DOCUMENT_CHARS,
        timeout: float = MEDIA_STEP_TIMEOUT,
        document_timeout: float = DOCUMENT_TIMEOUT,
    ) -> None:
        self.timeout = timeout
        self.documents = DocumentReader(timeout=document_timeout)
        self.store = store
        self.transcriber = transcriber
        self.transcription_model = transcription_model
        self.max_document_chars = max_document_chars

    @property
    def max_bytes(self) -> int:
        """Largest file accepted (``MAX_MEDIA_BYTES``)."""
        return self.store.max_bytes

    async def prepare(self, event: MessageEvent, adapter: PlatformAdapter | None) -> PreparedMedia:
        """Parts and notices for ``event``'s attachments.

        Never raises for an attachment: any failure of one becomes a notice and
        the others are still prepared (only cancellation goes through).
        """
        parts: list[MessagePart] = []
        notices: list[str] = []
        spent: list[Usage] = []
        for media in event.media:
            try:
                async with asyncio.timeout(self.timeout):
                    part = await self._prepare_one(event, media, adapter, notices, spent)
            except TimeoutError:
                logger.warning(
                    "%s attachment of %s timed out", media.kind, log_ref(event.message_id)
                )
                noun = _NOUN.get(media.kind, "file")
                notices.append(f"Your {noun} took too long to fetch; please send it again.")
                continue
            except MediaError as exc:
                logger.info("%s attachment of %s refused", media.kind, log_ref(event.message_id))
                notices.append(str(exc))
                continue
            except ChatflowError as exc:  # the media store failed (disk full...)
                logger.warning(
                    "%s attachment of %s not kept: %s",
                    media.kind,
                    log_ref(event.message_id),
                    type(exc).__name__,
                )
                notices.append(f"I couldn't keep your {_NOUN.get(media.kind, 'file')}, sorry.")
                continue
            except Exception as exc:
                # A bug or a library's surprise (a lookup answer missing a field): a
                # sentence for this file, and a row that would fail the same at every
                # start is answered now instead. The type only: messages can quote content.
                logger.error(
                    "%s attachment of %s failed unexpectedly: %s",
                    media.kind,
                    log_ref(event.message_id),
                    type(exc).__name__,
                )
                logger.debug("the unexpected failure", exc_info=True)
                notices.append(f"I couldn't read your {_NOUN.get(media.kind, 'file')}, sorry.")
                continue
            if part is not None:
                parts.append(part)
        return PreparedMedia(tuple(parts), tuple(notices), tuple(spent))

    async def _prepare_one(
        self,
        event: MessageEvent,
        media: MediaAttachment,
        adapter: PlatformAdapter | None,
        notices: list[str],
        spent: list[Usage],
    ) -> MessagePart | None:
        if media.kind == "location" and media.latitude is not None and media.longitude is not None:
            return LocationPart(
                latitude=media.latitude,
                longitude=media.longitude,
                name=media.title,
                address=media.address,
            )
        if media.kind == "contact":
            return ContactPart(name=media.title or "(no name)", phones=list(media.phones))
        if media.kind not in FILE_KINDS or media.file_id is None:
            return None
        noun = _NOUN[media.kind]
        if media.size is not None and media.size > self.max_bytes:
            raise MediaError(f"Your {noun} is too big for me (the limit is {_mb(self.max_bytes)}).")
        sha, data = await self._bytes(event, media, adapter, noun)
        claimed = (media.mime_type or "").split(";", 1)[0].strip().lower()
        sniffed = sniff_mime(data)
        kind = media.kind
        if kind == "document" and claimed in _VISION_TYPES and sniffed == claimed:
            kind = "image"  # a photo sent "as a file", uncompressed
        if kind == "image":
            if sniffed not in _VISION_TYPES:
                raise MediaError(f"That {noun} is not an image I can open, so I couldn't use it.")
            return ImagePart(
                sha256=sha, mime_type=sniffed, size=len(data), file_name=media.file_name
            )
        if kind in ("voice", "audio"):
            if sniffed is None or not sniffed.startswith("audio/"):
                raise MediaError(f"That {noun} is not audio I can play, so I couldn't use it.")
            transcript = await self._transcript(event, sha, data, sniffed, noun, notices, spent)
            return AudioPart(
                sha256=sha,
                mime_type=sniffed,
                size=len(data),
                file_name=media.file_name,
                voice=kind == "voice",
                transcript=transcript,
            )
        return await self._document(sha, data, claimed, media, notices)

    async def _bytes(
        self,
        event: MessageEvent,
        media: MediaAttachment,
        adapter: PlatformAdapter | None,
        noun: str,
    ) -> tuple[str, bytes]:
        """The attachment's hash and bytes: from the store if a run already fetched them."""
        note = f"fetched:{event.platform}:{media.unique_id or media.file_id}"
        known = await self.store.recall(note)
        if known is not None:
            data = await self.store.read(known)
            if data is not None:
                return known, data
        if adapter is None:
            raise MediaError(f"I couldn't download your {noun}; please send it again.")
        try:
            data = await adapter.fetch_media(media, max_bytes=self.max_bytes)
        except MediaError:
            raise
        except ChatflowError as exc:
            logger.warning(
                "%s download for %s failed: %s",
                media.kind,
                log_ref(event.message_id),
                type(exc).__name__,
            )
            raise MediaError(f"I couldn't download your {noun}; please send it again.") from exc
        if not data:
            raise MediaError(f"The {noun} you sent is empty.")
        if len(data) > self.max_bytes:
            raise MediaError(f"Your {noun} is too big for me (the limit is {_mb(self.max_bytes)}).")
        sha = await self.store.put(data)
        await self.store.remember(note, sha)
        logger.info(
            "%s for %s fetched (%d bytes)", media.kind, log_ref(event.message_id), len(data)
        )
        return sha, data

    async def _transcript(
        self,
        event: MessageEvent,
        sha: str,
        data: bytes,
        mime: str,
        noun: str,
        notices: list[str],
        spent: list[Usage],
    ) -> str | None:
        if self.transcriber is None:
            notices.append(f"I can't listen to your {noun}: no speech-to-text service is set up.")
            return None
        note = f"transcript:{self.transcription_model}:{sha}"
        known = await self.store.recall(note)
        if known is not None:
            return known
        file_name = f"{noun.replace(' ', '-')}.{_extension(mime)}"
        traced = spans.span(
            names.TRANSCRIPTION,
            {"gen_ai.request.model": self.transcription_model, "chatflow.media.bytes": len(data)},
            kind="client",
        )
        with traced as span:
            text = await self._transcribed(event, data, file_name, mime, noun, notices, spent)
            span.set("chatflow.media.outcome", "failed" if text is None else "ok")
        if text is None:
            return None
        await self.store.remember(note, text)
        return text

    async def _transcribed(
        self,
        event: MessageEvent,
        data: bytes,
        file_name: str,
        mime: str,
        noun: str,
        notices: list[str],
        spent: list[Usage],
    ) -> str | None:
        """The transcriber's text, or ``None`` (and the notice) when it failed."""
        assert self.transcriber is not None
        try:
            if isinstance(self.transcriber, MeteredTranscriber):
                metered = await self.transcriber.transcribe_metered(
                    data, file_name=file_name, mime_type=mime
                )
                text = metered.text
                if metered.usage is not None:
                    spent.append(metered.usage)  # billed, whatever the turn does next
            else:
                text = await self.transcriber.transcribe(data, file_name=file_name, mime_type=mime)
        except ModelError as exc:
            logger.warning(
                "transcription for %s failed: %s", log_ref(event.message_id), type(exc).__name__
            )
            notices.append(f"I couldn't make out your {noun}; could you type it instead?")
            return None
        return text

    async def _document(
        self,
        sha: str,
        data: bytes,
        claimed: str,
        media: MediaAttachment,
        notices: list[str],
    ) -> DocumentPart:
        mime = claimed or "application/octet-stream"
        text: str | None = None
        truncated = False
        if not is_readable_document(mime, media.file_name):
            notices.append("I can only read PDFs and text files, so I couldn't read that file.")
        else:
            # Kind and size only: a file's name is the user's content.
            attributes: dict[str, spans.AttributeValue] = {
                "chatflow.media.mime": mime,
                "chatflow.media.bytes": len(data),
            }
            with spans.span(names.DOCUMENT, attributes) as span:
                try:
                    extracted = await self.documents.read(
                        data, mime, media.file_name, max_chars=self.max_document_chars
                    )
                except MediaError as exc:
                    notices.append(str(exc))
                    span.set("chatflow.media.outcome", "unreadable")
                else:
                    text, truncated = extracted.text, extracted.truncated
                    span.set("chatflow.media.outcome", "ok")
        return DocumentPart(
            sha256=sha,
            mime_type=mime,
            size=len(data),
            file_name=media.file_name,
            text=text,
            truncated=truncated,
        )


def _mb(size: int) -> str:
    return f"{size / (1024 * 1024):g} MB"


def build_media_fetcher(settings: Settings) -> MediaFetcher:
    """The media step as the settings describe it: ``DATA_DIR/media``, ``MAX_MEDIA_BYTES``,
    ``DOCUMENT_TIMEOUT_SECONDS``, and transcription at ``OPENAI_BASE_URL`` with
    ``TRANSCRIPTION_MODEL`` when ``OPENAI_API_KEY`` is set (without a key voice notes
    get no transcript)."""
    store = MediaStore(settings.data_dir / "media", max_bytes=settings.max_media_bytes)
    transcriber: Transcriber | None = None
    if settings.openai_api_key is not None:
        transcriber = OpenAITranscriber(
            settings.openai_api_key.get_secret_value(),
            settings.openai_base_url or None,
            model=settings.transcription_model,
            timeout=settings.model_timeout_seconds,
        )
    return MediaFetcher(
        store,
        transcriber=transcriber,
        transcription_model=settings.transcription_model,
        document_timeout=settings.document_timeout_seconds,
    )
