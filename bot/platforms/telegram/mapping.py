"""Telegram updates as ``MessageEvent``: pure mapping, no I/O.

``map_update`` turns one Bot API update into the gateway's event (or ``None``
to ignore it); a group's migration to a supergroup becomes an event with
``migrate_from_chat_id`` set and no text, whether an update reports it or a
send learns it (``migration_notice``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from telegram import CallbackQuery, Message, MessageEntity, Update

from bot.gateway.contract import ChatType, MediaAttachment, MessageEvent, SessionSource
from bot.platforms.text import utf16_len

__all__ = [
    "GENERAL_TOPIC_ID",
    "PLATFORM",
    "attachments",
    "map_callback_query",
    "map_update",
    "migration_notice",
]

PLATFORM = "telegram"
"""Adapter name on events, ledger rows and errors."""
GENERAL_TOPIC_ID = "1"
"""Thread id of a forum's General topic: kept on events, omitted on send."""

# Media attributes in the order they are checked: an animation also carries a
# document and a venue a location, so the more specific ones come first.
_MEDIA_KINDS = (
    "photo",
    "animation",
    "video",
    "video_note",
    "voice",
    "audio",
    "sticker",
    "document",
    "contact",
    "venue",
    "location",
    "poll",
    "dice",
    "story",
    "paid_media",
    "game",
    "invoice",
)


def _utf16_slice(text: str, offset: int, length: int) -> str:
    data = text.encode("utf-16-le", "surrogatepass")
    return data[offset * 2 : (offset + length) * 2].decode("utf-16-le", "surrogatepass")


def _remove_spans(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """Remove UTF-16 ``(offset, length)`` spans, closing up the space around each."""
    data = text.encode("utf-16-le", "surrogatepass")
    for offset, length in sorted(spans, reverse=True):
        before = data[: offset * 2].decode("utf-16-le", "surrogatepass")
        after = data[(offset + length) * 2 :].decode("utf-16-le", "surrogatepass")
        if not before.strip():
            # A leading mention is usually followed by "," or ":" ("@bot, hi").
            after = after.lstrip(" \t,:;")
        elif before.endswith((" ", "\t")) and after.startswith((" ", "\t")):
            after = after[1:]
        data = (before + after).encode("utf-16-le", "surrogatepass")
    return data.decode("utf-16-le", "surrogatepass").strip()


def _media_kind(message: Message) -> str | None:
    for kind in _MEDIA_KINDS:
        if getattr(message, kind, None):
            return kind
    return None


def attachments(message: Message) -> tuple[MediaAttachment, ...]:
    """What the gateway can use of a message's media: references to fetch, or the content.

    A photo comes in several sizes; the largest is taken (Telegram keeps photos
    under 10 MB). Videos, stickers, polls and the like give nothing: the gateway
    answers those with its text-only reply.
    """
    if message.photo:
        size = message.photo[-1]
        return (
            MediaAttachment(
                "image",
                file_id=size.file_id,
                unique_id=size.file_unique_id,
                mime_type="image/jpeg",  # Telegram re-encodes every photo as JPEG
                size=size.file_size,
            ),
        )
    for kind, item in (("voice", message.voice), ("audio", message.audio)):
        if item is not None:
            return (
                MediaAttachment(
                    kind,
                    file_id=item.file_id,
                    unique_id=item.file_unique_id,
                    mime_type=item.mime_type or ("audio/ogg" if kind == "voice" else None),
                    size=item.file_size,
                    file_name=getattr(item, "file_name", None),
                ),
            )
    if message.document is not None and message.animation is None:
        document = message.document
        return (
            MediaAttachment(
                "document",
                file_id=document.file_id,
                unique_id=document.file_unique_id,
                mime_type=document.mime_type,
                size=document.file_size,
                file_name=document.file_name,
            ),
        )
    if message.venue is not None:
        venue = message.venue
        return (
            MediaAttachment(
                "location",
                latitude=venue.location.latitude,
                longitude=venue.location.longitude,
                title=venue.title,
                address=venue.address,
            ),
        )
    if message.location is not None:
        return (
            MediaAttachment(
                "location",
                latitude=message.location.latitude,
                longitude=message.location.longitude,
            ),
        )
    if message.contact is not None:
        contact = message.contact
        name = " ".join(x for x in (contact.first_name, contact.last_name) if x)
        return (MediaAttachment("contact", title=name, phones=(contact.phone_number,)),)
    return ()


def _quoted(message: Message, reply: Message) -> str | None:
    """What a reply quotes: the highlighted part (Bot API 7.0 ``quote``), else the
    replied message's text or caption, with its medium named (never downloaded again)."""
    if message.quote is not None and message.quote.text:
        return message.quote.text
    words = reply.text or reply.caption or ""
    kind = _media_kind(reply)
    if kind is not None:
        label = {"photo": "photo", "voice": "voice note", "document": "file"}.get(kind, kind)
        words = f"[{label}] {words}".strip()
    return words or None


def _chat_type(raw_type: str) -> ChatType | None:
    if raw_type == "private":
        return "dm"
    if raw_type in ("group", "supergroup"):
        return "group"
    if raw_type == "channel":
        return "channel"
    return None


def _thread_id(message: Message) -> str | None:
    if message.is_topic_message and message.message_thread_id is not None:
        return str(message.message_thread_id)
    if message.chat.is_forum:
        # A forum message outside any topic is in General (id 1). Without
        # is_topic_message a message_thread_id is only a reply chain.
        return GENERAL_TOPIC_ID
    return None


def _migration_event(
    message: Message, *, new_chat_id: int, old_chat_id: int, raw: dict[str, Any]
) -> MessageEvent:
    sender = message.from_user.id if message.from_user else new_chat_id
    return MessageEvent(
        platform=PLATFORM,
        message_id=f"{PLATFORM}:{message.chat.id}:{message.message_id}",
        source=SessionSource(
            platform=PLATFORM,
            chat_id=str(new_chat_id),
            chat_type="group",
            sender_id=str(sender),
            chat_name=message.chat.title,
        ),
        text="",
        platform_message_id=str(message.message_id),
        timestamp=message.date,
        migrate_from_chat_id=str(old_chat_id),
        raw=raw,
    )


def map_update(
    update: Update | Mapping[str, Any],
    *,
    bot_id: int,
    bot_username: str,
    allow_channels: bool = False,
) -> MessageEvent | None:
    """Turn one Telegram update into a ``MessageEvent``, or ``None`` to ignore it.

    A ``callback_query`` (a button tap) maps through ``map_callback_query``.
    Ignored: edits and other update types, channel posts
    (unless ``allow_channels``), messages from bots (the anonymous-admin
    placeholder counts as its group), automatic forwards from a linked
    channel, service messages, and commands addressed to another bot
    (``/cmd@other_bot``). A group's migration to a supergroup gives an event
    with ``migrate_from_chat_id`` set and no text, whichever side reports it.

    Gating facts are set, not applied: ``mentions_bot`` (a ``mention`` entity
    equal to ``@<bot_username>`` in any case, or a ``text_mention`` of the
    bot), ``replies_to_bot`` and ``command`` (``/cmd`` or ``/cmd@<bot>`` at
    the start; a bare ``/cmd`` in a group is set too, the gateway's group
    gate decides). The bot's own @mention is removed from ``text``.
    """
    if isinstance(update, Update):
        raw = update.to_dict()
        parsed = update
    else:
        raw = dict(update)
        parsed = Update.de_json(raw, None)

    if parsed.callback_query is not None:
        return map_callback_query(parsed.callback_query, raw=raw)
    message = parsed.message
    if message is None and allow_channels:
        message = parsed.channel_post
    if message is None:
        return None

    chat = message.chat
    chat_type = _chat_type(chat.type)
    if chat_type is None or (chat_type == "channel" and not allow_channels):
        return None

    if message.migrate_from_chat_id is not None:
        return _migration_event(
            message, new_chat_id=chat.id, old_chat_id=message.migrate_from_chat_id, raw=raw
        )
    if message.migrate_to_chat_id is not None:
        return _migration_event(
            message, new_chat_id=message.migrate_to_chat_id, old_chat_id=chat.id, raw=raw
        )

    sender_user = message.from_user
    if message.sender_chat is not None and (sender_user is None or sender_user.is_bot):
        # Anonymous admins and channels write "as" a chat; the user is a placeholder.
        sender_id = str(message.sender_chat.id)
        sender_name = message.sender_chat.title
    elif sender_user is not None:
        if sender_user.is_bot:
            return None
        sender_id = str(sender_user.id)
        sender_name = sender_user.full_name
    else:
        sender_id = str(chat.id)
        sender_name = chat.title
    if message.is_automatic_forward:
        return None

    text = message.text if message.text is not None else (message.caption or "")
    entities = message.entities if message.text is not None else message.caption_entities
    media_kind = _media_kind(message)
    if not text and media_kind is None:
        return None  # service message: members joined, title changed, pinned...
    if not text and media_kind == "sticker" and chat_type != "dm":
        return None  # a bare sticker in a group is chatter: ignored, not apologised for

    username = "@" + bot_username.lower()
    mentions_bot = False
    command: str | None = None
    strip_spans: list[tuple[int, int]] = []
    for entity in entities:
        if entity.type == MessageEntity.MENTION:
            if _utf16_slice(text, entity.offset, entity.length).lower() == username:
                mentions_bot = True
                strip_spans.append((entity.offset, entity.length))
        elif entity.type == MessageEntity.TEXT_MENTION:
            if entity.user is not None and entity.user.id == bot_id:
                mentions_bot = True
        elif entity.type == MessageEntity.BOT_COMMAND and entity.offset == 0:
            token = _utf16_slice(text, entity.offset, entity.length)
            name, at, target = token[1:].partition("@")
            if at and target.lower() != bot_username.lower():
                return None  # /cmd@other_bot: meant for someone else
            command = name.lower()
            if at:
                # "/cmd@thisbot args" reads as "/cmd args"
                suffix_at = utf16_len("/" + name)
                strip_spans.append((suffix_at, entity.length - utf16_len("/" + name)))
    if strip_spans:
        text = _remove_spans(text, strip_spans)

    reply = message.reply_to_message
    if reply is not None and reply.forum_topic_created is not None:
        # In a forum every topic message "replies" to the topic's creation notice.
        reply = None
    replies_to_bot = bool(reply and reply.from_user and reply.from_user.id == bot_id)
    reply_sender = None
    if reply is not None and not replies_to_bot:
        author = reply.from_user
        reply_sender = author.full_name if author is not None else None

    chat_name = chat.full_name if chat_type == "dm" else chat.title
    return MessageEvent(
        platform=PLATFORM,
        message_id=f"{PLATFORM}:{chat.id}:{message.message_id}",
        source=SessionSource(
            platform=PLATFORM,
            chat_id=str(chat.id),
            chat_type=chat_type,
            sender_id=sender_id,
            thread_id=_thread_id(message),
            chat_name=chat_name,
            sender_name=sender_name,
        ),
        text=text,
        platform_message_id=str(message.message_id),
        reply_to_id=str(reply.message_id) if reply is not None else None,
        replies_to_bot=replies_to_bot,
        reply_to_text=_quoted(message, reply) if reply is not None else None,
        reply_to_sender=reply_sender,
        mentions_bot=mentions_bot,
        command=command,
        media_kind=media_kind,
        timestamp=message.date,
        media=attachments(message),
        raw=raw,
    )


def map_callback_query(query: CallbackQuery, *, raw: dict[str, Any]) -> MessageEvent | None:
    """A button tap (``callback_query``) as an event with ``tap_token`` set and no text yet:
    the gateway resolves the token to its button. ``None`` for a tap it cannot place
    (an inline-mode message without a chat, a game button without data)."""
    message = query.message
    if message is None or not query.data:
        return None
    chat = message.chat
    chat_type = _chat_type(chat.type)
    if chat_type is None:
        return None
    user = query.from_user
    return MessageEvent(
        platform=PLATFORM,
        # The callback query's id: a redelivered update is a duplicate, not a second tap.
        message_id=f"{PLATFORM}:callback:{query.id}",
        source=SessionSource(
            platform=PLATFORM,
            chat_id=str(chat.id),
            chat_type=chat_type,
            sender_id=str(user.id),
            # An inaccessible (old) message tells no topic: the stored keyboard does.
            thread_id=_thread_id(message) if isinstance(message, Message) else None,
            chat_name=chat.full_name if chat_type == "dm" else chat.title,
            sender_name=user.full_name,
        ),
        text="",
        tap_token=query.data,
        callback_id=query.id,
        keyboard_message_id=str(message.message_id),
        raw=raw,
    )


def migration_notice(old_chat_id: str, new_chat_id: int, *, sender_id: str) -> MessageEvent:
    """The migration event for a move learned from a send (``ChatMigrated``), not an update."""
    return MessageEvent(
        platform=PLATFORM,
        message_id=f"{PLATFORM}:{new_chat_id}:migrated-from:{old_chat_id}",
        source=SessionSource(
            platform=PLATFORM,
            chat_id=str(new_chat_id),
            chat_type="group",
            sender_id=sender_id,
        ),
        text="",
        migrate_from_chat_id=old_chat_id,
    )
