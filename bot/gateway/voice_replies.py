"""Voice replies: the answer spoken, stored and owed with its text, sent as a voice note.

When the mode says so (``bot.core.voice``: ``VOICE_REPLIES`` or the agent's
``Voice``), ``speak`` runs after the model's final answer and before tx 2
(the runner's ``before_commit``): the text is synthesized (``SpeechModel``, in
parts of at most 4,096 characters), the OGG/Opus bytes go into the media
store, and an ``AudioPart(voice=True)`` per part joins the turn's attachments.
So the obligation recorded in tx 2 covers the audio (by SHA-256): a crash
before tx 2 re-runs the turn (nothing was owed yet), a crash after it resends
the stored audio, never a new synthesis.

``send`` delivers such an obligation: the voice notes first, the text as the
caption of a single note when the platform allows one and it fits, else as a
message after them (only with ``VOICE_WITH_TEXT``, or when a resend must
carry the recovery marker), then any files. A chat that refuses voice notes
(Telegram's ``VOICE_MESSAGES_FORBIDDEN``) gets the text instead, and is
remembered in ``chatflow_voice_refusals`` (by a hash of its id), so no later
reply there is synthesized. A speech failure leaves the reply as text, with a
WARNING that names the error type only: never silence, never texts or ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from bot.core.agent import Agent
from bot.core.media_store import MediaStore
from bot.core.messages import AudioPart, MessagePart
from bot.core.models.routing import ModelSettings, default_model_name
from bot.core.models.speech import MAX_SPEECH_BYTES, OpenAISpeech, SilentSpeech, SpeechModel
from bot.core.runner import RunResult
from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional
from bot.core.voice import Voice, resolve_voice, speech_chunks, wants_voice
from bot.errors import PlatformError
from bot.gateway.attachments import load_files, send_files_after_text, send_reply, send_text
from bot.gateway.contract import (
    VOICE_FORBIDDEN,
    MessageEvent,
    OutgoingFile,
    PlatformAdapter,
    SendResult,
)
from bot.gateway.ledger.obligations import Obligation
from bot.metrics import Metrics

__all__ = ["VOICE_FILE_NAME", "VoiceReplies", "build_voice_replies", "plays_voice", "speakable"]

logger = logging.getLogger(__name__)

VOICE_FILE_NAME = "voice.ogg"
"""The name a stored voice note is uploaded under."""

_COMPONENT = "voice_refusals"
_TABLE = "chatflow_voice_refusals"
_MIGRATIONS = {
    1: (
        f"""CREATE TABLE IF NOT EXISTS {_TABLE} (
            platform TEXT NOT NULL,
            chat_hash TEXT NOT NULL,
            refused_at REAL NOT NULL,
            PRIMARY KEY (platform, chat_hash)
        )""",
    ),
}

# Markdown a speech model would read out loud ("asterisk asterisk"), and link targets.
_LINK = re.compile(r"\[([^\]]+)\]\([^)]+\)")
_MARKS = re.compile(r"[*_`~#>|]+")


def speakable(text: str) -> str:
    """``text`` without the formatting marks a voice would read out (links keep their label)."""
    return re.sub(r"[ \t]+", " ", _MARKS.sub("", _LINK.sub(r"\1", text))).strip()


def plays_voice(adapter: PlatformAdapter | None) -> bool:
    """Whether ``adapter`` sends voice notes (overrides ``send_voice``)."""
    if adapter is None:
        return False
    hook = getattr(type(adapter), "send_voice", None)
    return hook is not None and hook is not PlatformAdapter.send_voice


def refusal_chat_hash(chat_id: str) -> str:
    """The key a voice refusal is kept under (``forget-user`` deletes by it): the refusal is
    kept, the raw chat id is not."""
    return hashlib.sha256(chat_id.encode("utf-8", "surrogatepass")).hexdigest()


class VoiceReplies:
    """Speaks replies before tx 2 and sends the obligations that carry them."""

    def __init__(
        self,
        store: TransactionalStore,
        media: MediaStore,
        speech: SpeechModel | None,
        *,
        default: Voice,
        with_text: bool = True,
        agents: Callable[[str], Agent | None] = lambda name: None,
        metrics: Metrics | None = None,
    ) -> None:
        """``default``: the settings' mode, voice and model (an agent's ``Voice`` wins);
        ``speech`` ``None``: nothing is spoken (owed voice notes are still sent);
        ``metrics``: replies to be spoken counted by outcome."""
        self._metrics = metrics
        self._store = require_transactional(store, "the voice refusals")
        self.media = media
        self.speech = speech
        self.default = default
        self.with_text = with_text
        self._agents = agents
        self._refused: set[tuple[str, str]] = set()

    async def open(self) -> None:
        """Create the refusals table."""
        async with self._store.transaction() as tx:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)

    # -- refusals ------------------------------------------------------------------

    async def is_refused(self, platform: str, chat_id: str) -> bool:
        """Whether ``chat_id`` refused a voice note before (this process or any other)."""
        key = (platform, refusal_chat_hash(chat_id))
        if key in self._refused:
            return True

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(
                f"SELECT 1 FROM {_TABLE} WHERE platform = ? AND chat_hash = ?", key
            )

        row = await self._store.run(body, write=False)
        if row is not None:
            self._refused.add(key)
        return row is not None

    async def refuse(self, platform: str, chat_id: str) -> None:
        """Remember that ``chat_id`` accepts no voice notes."""
        key = (platform, refusal_chat_hash(chat_id))
        self._refused.add(key)
        async with self._store.transaction() as tx:
            await tx.execute(
                f"INSERT INTO {_TABLE} (platform, chat_hash, refused_at) VALUES (?, ?, ?) "
                "ON CONFLICT (platform, chat_hash) DO NOTHING",
                (*key, self._store.now().timestamp()),
            )

    # -- before tx 2 ---------------------------------------------------------------

    def voice_for(self, agent_name: str) -> Voice:
        """The voice settings of ``agent_name``: its ``Voice`` over the defaults."""
        agent = self._agents(agent_name)
        return resolve_voice(agent.voice if agent is not None else None, self.default)

    async def wanted(
        self,
        event: MessageEvent,
        parts: Sequence[MessagePart],
        agent_name: str,
        adapter: PlatformAdapter | None,
    ) -> Voice | None:
        """The voice to answer ``event`` in, or ``None`` for a text-only reply."""
        voice = self.voice_for(agent_name)
        inbound_voice = any(m.kind == "voice" for m in event.media) or any(
            isinstance(p, AudioPart) and p.voice for p in parts
        )
        private = event.source.chat_type == "dm"
        if not wants_voice(voice.mode, inbound_voice=inbound_voice, private=private):
            return None
        if self.speech is None or not plays_voice(adapter):
            return None
        if await self.is_refused(event.platform, event.source.chat_id):
            return None
        return voice

    async def speak(
        self,
        event: MessageEvent,
        parts: Sequence[MessagePart],
        result: RunResult,
        adapter: PlatformAdapter | None,
    ) -> RunResult:
        """``result`` with its answer spoken (voice parts added) when the mode says so;
        unchanged when it does not, or when speech fails (the reply goes as text)."""
        voice = await self.wanted(event, parts, result.agent, adapter)
        if voice is None or self.speech is None:
            return result
        text = speakable(result.content)
        if not text:
            return result
        notes: list[AudioPart] = []
        try:
            for chunk in speech_chunks(text):
                notes.append(await self._synthesize(chunk, voice))
        except Exception as exc:
            # Never silence: the text reply still goes, and the operator sees why.
            logger.warning(
                "voice reply not synthesized (%s); the reply goes as text", type(exc).__name__
            )
            self._count("failed")
            return result
        self._count("synthesized")
        logger.info("reply spoken in %d voice note(s)", len(notes))
        return dataclasses.replace(result, attachments=[*result.attachments, *notes])

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.voice_replies.labels(outcome).inc()

    async def _synthesize(self, text: str, voice: Voice) -> AudioPart:
        assert self.speech is not None and voice.voice is not None and voice.model is not None
        data = await self.speech.synthesize(text, voice=voice.voice, model=voice.model)
        sha256 = await self.media.put(data)
        return AudioPart(
            sha256=sha256,
            mime_type="audio/ogg",
            size=len(data),
            file_name=VOICE_FILE_NAME,
            voice=True,
            transcript=text,
        )

    # -- the send --------------------------------------------------------------------

    async def send(
        self, adapter: PlatformAdapter, obligation: Obligation, store: MediaStore | None
    ) -> SendResult:
        """Send ``obligation``: its voice notes, its text (caption or message), its files.

        Falls back to ``send_reply`` (text and files) when the chat refuses voice
        notes, the channel has none, or the audio is no longer stored."""
        spoken = [p for p in obligation.attachments if isinstance(p, AudioPart) and p.voice]
        if not spoken:
            return await send_reply(adapter, obligation, store)
        as_text = dataclasses.replace(
            obligation, attachments=tuple(p for p in obligation.attachments if p not in spoken)
        )
        if not plays_voice(adapter) or await self.is_refused(
            obligation.platform, obligation.chat_id
        ):
            return await send_reply(adapter, as_text, store)
        notes = await self._load(spoken, store)
        if notes is None:
            logger.warning("reply %s: its voice note is no longer stored", obligation.obligation_id)
            return await send_reply(adapter, as_text, store)
        text = obligation.outgoing_text
        caption = text if len(notes) == 1 and _fits(text, adapter) else None
        if not (self.with_text or obligation.needs_marker):
            caption = None  # the voice note alone; a resend keeps its marker in text
        if obligation.buttons:
            caption = None  # the keyboard goes under the text, sent as a message after it
        ids: list[str] = []
        for index, note in enumerate(notes):
            try:
                sent = await adapter.send_voice(
                    obligation.chat_id,
                    note,
                    caption=caption if index == 0 else None,
                    thread_id=obligation.thread_id,
                    reply_to=obligation.reply_to if index == 0 else None,
                )
            except PlatformError as exc:
                if not ids and exc.code == VOICE_FORBIDDEN:
                    await self.refuse(obligation.platform, obligation.chat_id)
                    self._count("refused_by_chat")
                    logger.info("%s chat accepts no voice notes: text from now on", exc.platform)
                    return await send_reply(adapter, as_text, store)
                if not ids and not (exc.retryable or exc.ambiguous):
                    # Refused for good (a closed WhatsApp window...): the text may still go.
                    logger.warning("voice note refused (%s); the reply goes as text", exc.code)
                    return await send_reply(adapter, as_text, store)
                if not ids:
                    raise
                raise _partly(exc) from exc
            ids += sent.message_ids
        if caption is None and (self.with_text or obligation.needs_marker or obligation.buttons):
            try:
                if obligation.buttons:  # bot.gateway.attachments.send_text: with its keyboard
                    sent = await send_text(
                        adapter, dataclasses.replace(obligation, reply_to=None), text
                    )
                else:
                    sent = await adapter.send(
                        obligation.chat_id, text, thread_id=obligation.thread_id
                    )
            except PlatformError as exc:
                raise _partly(exc) from exc
            ids += sent.message_ids
        files, missing = await load_files(as_text.attachments, store)
        if missing:
            logger.warning(
                "reply %s: %d attached file(s) are no longer stored",
                obligation.obligation_id,
                missing,
            )
        if files:
            ids += (await send_files_after_text(adapter, obligation, files)).message_ids
        logger.info("reply %s sent as %d voice note(s)", obligation.obligation_id, len(notes))
        return SendResult(message_ids=ids)

    async def _load(
        self, parts: Sequence[AudioPart], store: MediaStore | None
    ) -> list[OutgoingFile] | None:
        store = store or self.media
        notes: list[OutgoingFile] = []
        for part in parts:
            data = await store.read(part.sha256)
            if data is None:
                return None
            notes.append(
                OutgoingFile(
                    kind="voice",
                    data=data,
                    mime_type=part.mime_type,
                    file_name=part.file_name or VOICE_FILE_NAME,
                    path=store.path_of(part.sha256),
                )
            )
        return notes

    async def aclose(self) -> None:
        """Close the speech client's connections."""
        close = getattr(self.speech, "aclose", None)
        if close is not None:
            await close()


def _fits(text: str, adapter: PlatformAdapter) -> bool:
    limit = getattr(adapter, "voice_caption_limit", 0)
    return bool(text) and len(text.encode("utf-16-le")) // 2 <= limit


def _partly(exc: PlatformError) -> PlatformError:
    """``exc`` after part of the reply went out: ``ambiguous``, so a resend is marked."""
    return PlatformError(
        f"{exc} (after part of the voice reply was sent)",
        platform=exc.platform,
        retryable=exc.retryable,
        retry_after=exc.retry_after,
        ambiguous=True,
        code=exc.code,
    )


def build_voice_replies(
    settings: ModelSettings,
    store: TransactionalStore,
    media: MediaStore,
    *,
    default: Voice,
    with_text: bool,
    agents: Callable[[str], Agent | None],
    timeout: float = 60.0,
    metrics: Metrics | None = None,
) -> VoiceReplies:
    """Voice replies as the settings describe them: speech at ``OPENAI_BASE_URL`` with
    ``OPENAI_API_KEY``; without a key, the silent demo voice when the model is the
    offline demo, else none (replies stay text, and a WARNING says so)."""
    speech: SpeechModel | None = None
    if settings.openai_api_key:
        speech = OpenAISpeech(
            settings.openai_api_key,
            settings.openai_base_url or None,
            timeout=timeout,
            max_bytes=min(MAX_SPEECH_BYTES, media.max_bytes),
        )
    elif default_model_name(settings) == "offline":
        speech = SilentSpeech()
    elif default.mode != "off":
        logger.warning("VOICE_REPLIES needs OPENAI_API_KEY (speech); replies stay text")
    return VoiceReplies(
        store, media, speech, default=default, with_text=with_text, agents=agents, metrics=metrics
    )
