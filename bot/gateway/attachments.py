"""Sending a reply that carries files: its text first, then each file, as one obligation.

The ledger row holds references (``Obligation.attachments``); the bytes are
read back from the media store just before the send. The text goes through
``send`` as ever (with ``RECOVERED_MARKER`` when the row says so), the files
through the adapter's ``send_attachments`` hook. Text and files are one reply:
if the files fail after the text went out, the failure is reported
``ambiguous``, so the retry resends the whole reply with the marker, the same
rule as a text split into parts that fails half way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from bot.core.attachments import OutgoingPart
from bot.core.media_store import MediaStore
from bot.core.messages import AudioPart, ImagePart
from bot.errors import PlatformError
from bot.gateway.contract import OutgoingButton, OutgoingFile, PlatformAdapter, SendResult
from bot.gateway.ledger.obligations import Obligation

__all__ = ["load_files", "send_files_after_text", "send_reply", "send_text"]

logger = logging.getLogger(__name__)


async def load_files(
    parts: Sequence[OutgoingPart], store: MediaStore | None
) -> tuple[list[OutgoingFile], int]:
    """The files to send, read from ``store``, and how many are no longer there. A spoken
    reply (``AudioPart``) is no file: ``bot.gateway.voice_replies`` sends it."""
    files: list[OutgoingFile] = []
    missing = 0
    for part in parts:
        if isinstance(part, AudioPart):
            continue
        data = await store.read(part.sha256) if store is not None else None
        if data is None:
            missing += 1
            continue
        files.append(
            OutgoingFile(
                kind="image" if isinstance(part, ImagePart) else "document",
                data=data,
                mime_type=part.mime_type,
                file_name=part.file_name or "file",
                path=store.path_of(part.sha256) if store is not None else None,
            )
        )
    return files, missing


async def send_text(adapter: PlatformAdapter, obligation: Obligation, text: str) -> SendResult:
    """Send ``text`` for ``obligation``, with its buttons under the last part if it has any
    (``send_with_buttons``; a channel without buttons lists them as numbered lines)."""
    if not obligation.buttons:
        return await adapter.send(
            obligation.chat_id, text, thread_id=obligation.thread_id, reply_to=obligation.reply_to
        )
    buttons = [OutgoingButton(b.token, b.label) for b in obligation.buttons]
    # A structural adapter (not a PlatformAdapter subclass) may lack the hook: use the default.
    hook = getattr(adapter, "send_with_buttons", None)
    if hook is None:
        return await PlatformAdapter.send_with_buttons(
            adapter,
            obligation.chat_id,
            text,
            buttons,
            thread_id=obligation.thread_id,
            reply_to=obligation.reply_to,
        )
    result: SendResult = await hook(
        obligation.chat_id,
        text,
        buttons,
        thread_id=obligation.thread_id,
        reply_to=obligation.reply_to,
    )
    return result


async def send_reply(
    adapter: PlatformAdapter, obligation: Obligation, store: MediaStore | None
) -> SendResult:
    """Send ``obligation``'s text, then its files; ``PlatformError`` as ``send`` raises it."""
    if not obligation.attachments:
        return await send_text(adapter, obligation, obligation.outgoing_text)
    files, missing = await load_files(obligation.attachments, store)
    text = obligation.outgoing_text
    if missing:
        # Pruned by retention (or the media directory was wiped): say so, send the rest.
        logger.warning(
            "reply %s: %d attached file(s) are no longer stored", obligation.obligation_id, missing
        )
        text += f"\n\n({missing} attached file(s) could not be sent: no longer available.)"
    sent = await send_text(adapter, obligation, text)
    if not files:
        return sent
    more = await send_files_after_text(adapter, obligation, files)
    logger.info("reply %s sent with %d file(s)", obligation.obligation_id, len(files))
    return SendResult(message_ids=[*sent.message_ids, *more.message_ids])


async def send_files_after_text(
    adapter: PlatformAdapter, obligation: Obligation, files: Sequence[OutgoingFile]
) -> SendResult:
    """Send ``files`` once part of ``obligation`` went out: a failure is ``ambiguous``."""
    # A structural adapter (not a PlatformAdapter subclass) may lack the hook: use the default.
    hook = getattr(adapter, "send_attachments", None)
    try:
        if hook is None:
            return await PlatformAdapter.send_attachments(
                adapter, obligation.chat_id, files, thread_id=obligation.thread_id
            )
        result: SendResult = await hook(obligation.chat_id, files, thread_id=obligation.thread_id)
        return result
    except PlatformError as exc:
        raise PlatformError(
            f"{exc} (the reply's text was sent, its files were not)",
            platform=exc.platform,
            retryable=exc.retryable,
            retry_after=exc.retry_after,
            ambiguous=True,  # the user has part of the reply: a resend must be marked
            code=exc.code,
        ) from exc
