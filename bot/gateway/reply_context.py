"""The line that tells the model which message the user replied to.

``[Replying to your earlier message: "…"]`` (a reply to the bot) or
``[Replying to Ana's message: "…"]`` goes before the user's text. Telegram
gives the quoted text inline (``MessageEvent.reply_to_text``); a WhatsApp
reply carries only the quoted wamid, which the delivery ledger maps back to
the bot's own reply it came from, and the inbox journal to a user's message
(``[Replying to their own earlier message: ...]`` or another member's), only
within the same chat. Quotes are someone else's words, so they are
flattened to one line and cut to ``MAX_QUOTE_CHARS``: a long or crafted quote
cannot pass for the user's own request.
"""

from __future__ import annotations

import re

from bot.errors import ChatflowError
from bot.gateway.contract import MessageEvent
from bot.gateway.inbox import Inbox
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import RECOVERED_MARKER

__all__ = ["MAX_QUOTE_CHARS", "reply_context", "with_reply_context"]

MAX_QUOTE_CHARS = 300
"""Longest quote shown to the model."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MEDIA_NOUN = {"image": "photo", "voice": "voice note", "audio": "audio file"}


def _flatten(text: str) -> str:
    flat = " ".join(_CONTROL.sub(" ", text).split()).replace('"', "'")
    if len(flat) > MAX_QUOTE_CHARS:
        flat = flat[: MAX_QUOTE_CHARS - 1] + "…"
    return flat


async def _from_journal(event: MessageEvent, inbox: Inbox) -> tuple[str, str] | None:
    """(quote, who) for a reply to a user's message the inbox journaled, in the same chat."""
    assert event.reply_to_id is not None
    try:
        quoted = await inbox.journaled_event(event.reply_to_id)
    except ChatflowError:  # best effort: the turn runs without the quote
        return None
    if quoted is None or (quoted.platform, quoted.source.chat_id) != (
        event.platform,
        event.source.chat_id,
    ):
        return None  # a quote is only ever read back into the chat it was written in
    kinds = [f"[{_MEDIA_NOUN.get(m.kind, m.kind)}]" for m in quoted.media]
    text = " ".join([*kinds, quoted.text] if quoted.text else kinds)
    if quoted.source.sender_id == event.source.sender_id:
        who = "their own earlier message"
    elif quoted.source.sender_name:
        who = f"{_flatten(quoted.source.sender_name)}'s message"
    else:
        who = "another member's message"
    return text, who


async def reply_context(
    event: MessageEvent, ledger: DeliveryLedger, inbox: Inbox | None = None
) -> str | None:
    """The context line for ``event``, or ``None`` when it replies to nothing we can quote.

    ``inbox``: look a quoted user message up in the journal (WhatsApp quotes only its id).
    """
    if event.reply_to_id is None:
        return None
    quoted = event.reply_to_text
    if quoted is None and not event.replies_to_bot and inbox is not None:
        found = await _from_journal(event, inbox)
        if found is not None and found[0].strip():
            return f'[Replying to {found[1]}: "{_flatten(found[0])}"]'
    if quoted is None and event.replies_to_bot:
        # By chat and thread: Telegram numbers messages per chat, so the id alone may
        # name another chat's reply (and quote it here).
        obligation_id = await ledger.find_by_sent_id(
            event.reply_to_id,
            platform=event.platform,
            chat=(event.source.chat_id, event.source.thread_id),
        )
        try:
            obligation = await ledger.get(obligation_id) if obligation_id is not None else None
        except ChatflowError:  # best effort, as find_by_sent_id: the turn runs without it
            obligation = None
        if obligation is not None:
            quoted = obligation.content.removeprefix(RECOVERED_MARKER)
    if not quoted or not quoted.strip():
        return None
    who = (
        "your earlier message"
        if event.replies_to_bot
        else f"{_flatten(event.reply_to_sender)}'s message"
        if event.reply_to_sender
        else "an earlier message"
    )
    return f'[Replying to {who}: "{_flatten(quoted)}"]'


def with_reply_context(text: str, context: str | None) -> str:
    """``text`` with the context line before it."""
    if context is None:
        return text
    return f"{context}\n{text}" if text else context
