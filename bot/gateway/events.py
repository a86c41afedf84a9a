"""Inbound events: the contract's types (re-exported here under DESIGN.md's path),
their JSON form for the inbox journal, and the UTF-8 safety every write needs."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import replace
from datetime import datetime
from operator import attrgetter
from typing import Any

from bot.core.buttons import Button
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
    if event.button is not None:
        data["button"] = {"label": event.button.label, "value": event.button.value}
    else:
        del data["button"]  # rows of other messages stay as they were
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
    button = data.get("button")
    kwargs["button"] = None if not button else Button(button["label"], button.get("value"))
    return MessageEvent(**kwargs)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(value: str) -> str:
    return _LONE_SURROGATE.sub("\ufffd", value)


def _clean_opt(value: str | None) -> str | None:
    return None if value is None else _clean(value)


# The text fields ``encodable`` checks and cleans, of an event, its source, its media.
_EVENT_TEXTS = (
    "message_id",
    "text",
    "platform_message_id",
    "reply_to_id",
    "reply_to_text",
    "reply_to_sender",
    "command",
    "media_kind",
    "migrate_from_chat_id",
    "tap_token",
    "callback_id",
    "keyboard_message_id",
)
_SOURCE_TEXTS = ("chat_id", "sender_id", "thread_id", "chat_name", "sender_name")
_MEDIA_TEXTS = ("file_id", "unique_id", "mime_type", "file_name", "title", "address")


_event_texts = attrgetter(*_EVENT_TEXTS)
_source_texts = attrgetter(*_SOURCE_TEXTS)


def _dirty(item: object, fields: tuple[str, ...]) -> bool:
    return any(
        (v := getattr(item, name)) is not None and _LONE_SURROGATE.search(v) for name in fields
    )


def _texts_clean(event: MessageEvent) -> bool:
    """Whether no text of the event or its source holds a lone surrogate."""
    # Runs for every inbound message: one joined string, and ASCII (most ids, many
    # texts) settles it in C without the regex.
    joined = "".join([v for v in (*_event_texts(event), *_source_texts(event.source)) if v])
    return joined.isascii() or _LONE_SURROGATE.search(joined) is None


def _cleaned(item: object, fields: tuple[str, ...]) -> dict[str, Any]:
    return {name: _clean_opt(getattr(item, name)) for name in fields}


def encodable(event: MessageEvent) -> MessageEvent:
    """``event`` with lone surrogates replaced by U+FFFD.

    JSON may carry an unpaired ``\\ud800`` escape; such a string cannot be
    encoded as UTF-8, so it would fail every write (SQLite, logs, the model's
    HTTP body) and, refused again at each redelivery, block its chat for good.
    """
    source = event.source
    if _texts_clean(event) and not any(
        _dirty(m, _MEDIA_TEXTS) or any(_LONE_SURROGATE.search(p) for p in m.phones)
        for m in event.media
    ):
        return event
    return replace(
        event,
        **_cleaned(event, _EVENT_TEXTS),
        media=tuple(_clean_media(m) for m in event.media),
        source=replace(source, **_cleaned(source, _SOURCE_TEXTS)),
    )


def _clean_media(media: MediaAttachment) -> MediaAttachment:
    return replace(
        media, **_cleaned(media, _MEDIA_TEXTS), phones=tuple(_clean(p) for p in media.phones)
    )
