"""Inbound events: the contract's types (re-exported here under DESIGN.md's path),
their JSON form for the inbox journal, and the UTF-8 safety every write needs."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from datetime import datetime
from typing import Any

from bot.gateway.contract import ChatType, MediaAttachment, MessageEvent, SessionSource

__all__ = [
    "ChatType",
    "MediaAttachment",
    "MessageEvent",
    "SessionSource",
    "encodable",
    "event_from_dict",
    "event_to_dict",
]


_EVENT_FIELDS = tuple(f.name for f in dataclasses.fields(MessageEvent) if f.name != "raw")
_SOURCE_FIELDS = tuple(f.name for f in dataclasses.fields(SessionSource))
_MEDIA_FIELDS = tuple(f.name for f in dataclasses.fields(MediaAttachment))


def _media_to_dict(media: MediaAttachment) -> dict[str, Any]:
    # Only the fields set: a journal row of a photo stays a few dozen bytes.
    data = {name: getattr(media, name) for name in _MEDIA_FIELDS}
    data["phones"] = list(media.phones)
    return {k: v for k, v in data.items() if v not in (None, [])}


def _media_from_dict(data: dict[str, Any]) -> MediaAttachment:
    kwargs = {k: v for k, v in data.items() if k in _MEDIA_FIELDS}
    kwargs["phones"] = tuple(kwargs.get("phones") or ())
    return MediaAttachment(**kwargs)


def event_to_dict(event: MessageEvent) -> dict[str, Any]:
    """A JSON-ready dict of ``event`` without its ``raw`` platform payload."""
    # Every field but ``source`` and ``timestamp`` holds a str, bool or None.
    data = {name: getattr(event, name) for name in _EVENT_FIELDS}
    source = event.source
    data["source"] = {name: getattr(source, name) for name in _SOURCE_FIELDS}
    data["timestamp"] = event.timestamp.isoformat()
    if event.media:
        data["media"] = [_media_to_dict(m) for m in event.media]
    else:
        del data["media"]  # rows of text messages stay as they were
    return data


def event_from_dict(data: dict[str, Any]) -> MessageEvent:
    """Rebuild a ``MessageEvent`` from ``event_to_dict``'s output (``raw`` comes back empty).

    Unknown keys are ignored so rows written by a newer version still load.
    """
    kwargs = {k: v for k, v in data.items() if k in _EVENT_FIELDS}
    kwargs["source"] = SessionSource(
        **{k: v for k, v in dict(data["source"]).items() if k in _SOURCE_FIELDS}
    )
    if isinstance(kwargs.get("timestamp"), str):
        kwargs["timestamp"] = datetime.fromisoformat(kwargs["timestamp"])
    kwargs["media"] = tuple(_media_from_dict(dict(m)) for m in data.get("media") or ())
    return MessageEvent(**kwargs)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(value: str) -> str:
    return _LONE_SURROGATE.sub("\ufffd", value)


def _clean_opt(value: str | None) -> str | None:
    return None if value is None else _clean(value)


def encodable(event: MessageEvent) -> MessageEvent:
    """``event`` with lone surrogates replaced by U+FFFD.

    JSON may carry an unpaired ``\\ud800`` escape; such a string cannot be
    encoded as UTF-8, so it would fail every write (SQLite, logs, the model's
    HTTP body) and, refused again at each redelivery, block its chat for good.
    """
    source = event.source
    values = (
        event.message_id,
        event.text,
        event.platform_message_id,
        event.reply_to_id,
        event.reply_to_text,
        event.reply_to_sender,
        event.command,
        event.media_kind,
        event.migrate_from_chat_id,
        source.chat_id,
        source.sender_id,
        source.thread_id,
        source.chat_name,
        source.sender_name,
    )
    media_strings = [
        v
        for m in event.media
        for v in (m.file_id, m.unique_id, m.mime_type, m.file_name, m.title, m.address, *m.phones)
    ]
    if not any(v is not None and _LONE_SURROGATE.search(v) for v in (*values, *media_strings)):
        return event
    return replace(
        event,
        message_id=_clean(event.message_id),
        text=_clean(event.text),
        platform_message_id=_clean_opt(event.platform_message_id),
        reply_to_id=_clean_opt(event.reply_to_id),
        reply_to_text=_clean_opt(event.reply_to_text),
        reply_to_sender=_clean_opt(event.reply_to_sender),
        command=_clean_opt(event.command),
        media_kind=_clean_opt(event.media_kind),
        migrate_from_chat_id=_clean_opt(event.migrate_from_chat_id),
        media=tuple(_clean_media(m) for m in event.media),
        source=replace(
            source,
            chat_id=_clean(source.chat_id),
            sender_id=_clean(source.sender_id),
            thread_id=_clean_opt(source.thread_id),
            chat_name=_clean_opt(source.chat_name),
            sender_name=_clean_opt(source.sender_name),
        ),
    )


def _clean_media(media: MediaAttachment) -> MediaAttachment:
    return replace(
        media,
        file_id=_clean_opt(media.file_id),
        unique_id=_clean_opt(media.unique_id),
        mime_type=_clean_opt(media.mime_type),
        file_name=_clean_opt(media.file_name),
        title=_clean_opt(media.title),
        address=_clean_opt(media.address),
        phones=tuple(_clean(p) for p in media.phones),
    )
