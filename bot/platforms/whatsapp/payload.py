"""Parsing WhatsApp Cloud API webhook bodies into gateway events.

The dicts are read directly instead of through pywa's update types, because
pywa parses only ``entry[0].changes[0].messages[0]`` of a body, needs a client
object for every update and resolves user ids by its BSUID-first priority.
Our mapping needs a handful of fields of *every* message, so a small defensive
reader over Meta's documented shape is both simpler and complete; pywa's
``MessageType`` names the message types. A malformed item is skipped and
logged, never raised: an exception here would make Meta redeliver the body
for days.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pywa.types.others import MessageType

from bot.gateway.contract import ChatType, MediaAttachment, MessageEvent, SessionSource
from bot.logs import log_ref

__all__ = [
    "IGNORED_TYPES",
    "MEDIA_TYPES",
    "PLATFORM",
    "WEBHOOK_OBJECT",
    "FailedStatus",
    "WebhookBatch",
    "attachments",
    "digits",
    "is_group_chat_id",
    "parse_timestamp",
    "parse_webhook",
]

logger = logging.getLogger(__name__)

PLATFORM = "whatsapp"
"""Adapter name, used as ``MessageEvent.platform``."""

WEBHOOK_OBJECT = "whatsapp_business_account"
"""The only ``object`` value of WhatsApp Cloud API webhook bodies."""

MEDIA_TYPES: frozenset[str] = frozenset(
    {
        MessageType.IMAGE.value,
        MessageType.VIDEO.value,
        MessageType.AUDIO.value,
        MessageType.DOCUMENT.value,
        MessageType.STICKER.value,
        MessageType.LOCATION.value,
        MessageType.CONTACTS.value,
        MessageType.ORDER.value,
    }
)
"""Message types that reach the gateway with ``media_kind`` set; images, audio, documents,
locations and contacts also carry ``media`` (``attachments``), the others get the
text-only answer."""

IGNORED_TYPES: frozenset[str] = frozenset(
    {
        MessageType.EDIT.value,
        MessageType.REVOKE.value,
        "deleted",
        MessageType.REACTION.value,
        MessageType.SYSTEM.value,
        MessageType.REQUEST_WELCOME.value,
        "ephemeral",
    }
)
"""Message types that never start a turn: edits, deletions, reactions, notices."""

_CAPTIONED = frozenset(
    {MessageType.IMAGE.value, MessageType.VIDEO.value, MessageType.DOCUMENT.value}
)
_BSUID = re.compile(r"[A-Z]{2}\.(?:ENT\.)?\d+")
_PHONE = re.compile(r"\+?\d+")
_COMMAND = re.compile(r"/([A-Za-z0-9_]{1,32})(?=\s|$)")


def digits(value: object) -> str:
    """Only the digits of ``value`` (``"+1 555-0100"`` -> ``"15550100"``)."""
    return re.sub(r"\D", "", str(value)) if value is not None else ""


def is_group_chat_id(chat_id: str) -> bool:
    """Whether ``chat_id`` names a WhatsApp group rather than a person.

    People are addressed by ``wa_id`` (digits only, a leading ``+`` tolerated) or
    by a business-scoped user id (``US.123…`` / ``US.ENT.123…``); Cloud API group
    ids are opaque base64-like strings (``Y2FwaV9ncm91cDo…``), so anything else
    is a group. pywa's ``RecipientType.from_recipient`` draws the same line,
    which is why ``send`` can hand the id to ``WhatsApp.send_message`` as is.
    """
    value = chat_id.strip()
    return not (_PHONE.fullmatch(value) or _BSUID.fullmatch(value))


def parse_timestamp(value: object) -> datetime:
    """Meta's string of Unix seconds as an aware UTC datetime (now if unreadable)."""
    try:
        return datetime.fromtimestamp(int(str(value)), UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class FailedStatus:
    """A ``failed`` delivery status for one of our sent messages."""

    wamid: str
    """Id of the message that failed (ours, from ``SendResult.message_ids``)."""
    code: int | None
    """Meta's error code, if the status carried one."""
    error: str
    """Short human-readable description: code, title and details."""


@dataclass(slots=True)
class WebhookBatch:
    """Everything one webhook body carried for our phone number."""

    events: list[MessageEvent] = field(default_factory=list)
    """Inbound messages in body order; each one is handed to the gateway."""
    failed_statuses: list[FailedStatus] = field(default_factory=list)
    """``failed`` statuses of messages we sent."""
    statuses: int = 0
    """How many status updates the body held (never a turn)."""
    ignored: int = 0
    """Messages and changes skipped (other number, edits, reactions, malformed...)."""


def _dicts(value: object) -> list[dict[str, Any]]:
    """The dict items of ``value`` if it is a list, else nothing."""
    if not isinstance(value, list):
        return []
    return [item for item in value if isinstance(item, dict)]


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: object) -> str | None:
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def parse_webhook(
    payload: Mapping[str, Any],
    *,
    phone_id: str,
    sent_ids: Container[str] = (),
) -> WebhookBatch:
    """Read every message and status of a webhook body addressed to ``phone_id``.

    Changes for another ``metadata.phone_number_id`` and fields other than
    ``messages`` are skipped. ``sent_ids`` are wamids we sent recently: a reply
    quoting one of them is a reply to the bot.
    """
    batch = WebhookBatch()
    for entry in _dicts(payload.get("entry")):
        for change in _dicts(entry.get("changes")):
            field_name = change.get("field", "messages")
            value = _dict(change.get("value"))
            if field_name != "messages":
                logger.debug("WhatsApp webhook field %r ignored", field_name)
                batch.ignored += 1
                continue
            metadata = _dict(value.get("metadata"))
            if _str(metadata.get("phone_number_id")) != phone_id:
                logger.debug("WhatsApp change for another phone_number_id ignored")
                batch.ignored += 1
                continue
            _parse_value(value, metadata, phone_id, sent_ids, batch)
    return batch


def _parse_value(
    value: dict[str, Any],
    metadata: dict[str, Any],
    phone_id: str,
    sent_ids: Container[str],
    batch: WebhookBatch,
) -> None:
    contacts = _dicts(value.get("contacts"))
    business_number = digits(metadata.get("display_phone_number"))
    for message in _dicts(value.get("messages")):
        event = _parse_message(message, contacts, metadata, business_number, sent_ids)
        if event is None:
            batch.ignored += 1
        else:
            batch.events.append(event)
    for status in _dicts(value.get("statuses")):
        batch.statuses += 1
        if status.get("status") == "failed":
            failed = _failed_status(status)
            if failed is not None:
                batch.failed_statuses.append(failed)


def _failed_status(status: dict[str, Any]) -> FailedStatus | None:
    wamid = _str(status.get("id"))
    if wamid is None:
        logger.warning("WhatsApp failed status without a message id ignored")
        return None
    errors = _dicts(status.get("errors"))
    first = errors[0] if errors else {}
    code_value = first.get("code")
    code = code_value if isinstance(code_value, int) and not isinstance(code_value, bool) else None
    title = _str(first.get("title")) or _str(first.get("message")) or "delivery failed"
    details = _str(_dict(first.get("error_data")).get("details"))
    text = f"{code}: {title}" if code is not None else title
    if details and details != title:
        text = f"{text} ({details})"
    return FailedStatus(wamid=wamid, code=code, error=text)


def _find_contact(contacts: list[dict[str, Any]], sender: str | None) -> dict[str, Any]:
    for contact in contacts:
        if sender is not None and sender in (contact.get("wa_id"), contact.get("user_id")):
            return contact
    # A single-message change lists its one sender; use it even if ids differ in form.
    return contacts[0] if len(contacts) == 1 else {}


def _content(message: dict[str, Any], typ: str) -> tuple[str, str | None] | None:
    """``(text, media_kind)`` of a message that reaches the gateway, else ``None``."""
    body = _dict(message.get(typ))
    if typ == MessageType.TEXT.value:
        text = _str(body.get("body"))
        return (text, None) if text is not None else None
    if typ == MessageType.BUTTON.value:
        # A tap on a template quick-reply button: the button text is what the user "said".
        text = _str(body.get("text")) or _str(body.get("payload"))
        return (text, None) if text is not None else ("", "unsupported")
    if typ == MessageType.INTERACTIVE.value:
        reply = _dict(body.get("button_reply")) or _dict(body.get("list_reply"))
        text = _str(reply.get("title"))
        return (text, None) if text is not None else ("", "unsupported")
    if typ in MEDIA_TYPES:
        kind = typ
        if typ == MessageType.AUDIO.value and body.get("voice") is True:
            kind = "voice"
        caption = _str(body.get("caption")) if typ in _CAPTIONED else None
        return (caption or "", kind)
    # "unsupported" and types this code does not know: the user sent *something*,
    # so the gateway gets a chance to answer that only text is understood.
    return ("", "unsupported")


def _tap(message: dict[str, Any], typ: str) -> str | None:
    """The reply id of an ``interactive`` ``button_reply`` / ``list_reply``, else ``None``."""
    if typ != MessageType.INTERACTIVE.value:
        return None
    body = _dict(message.get(typ))
    reply = _dict(body.get("button_reply")) or _dict(body.get("list_reply"))
    return _str(reply.get("id"))


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def attachments(message: dict[str, Any], typ: str) -> tuple[MediaAttachment, ...]:
    """The media of one WhatsApp message: a media id to fetch (it outlives the URL
    Meta gives for it), or a location's or contact card's content."""
    body = _dict(message.get(typ))
    if typ in (MessageType.IMAGE.value, MessageType.AUDIO.value, MessageType.DOCUMENT.value):
        media_id = _str(body.get("id"))
        if media_id is None:
            return ()
        kind = {"image": "image", "audio": "audio", "document": "document"}[typ]
        if typ == MessageType.AUDIO.value and body.get("voice") is True:
            kind = "voice"
        size = body.get("file_size")
        return (
            MediaAttachment(
                kind,
                file_id=media_id,
                mime_type=_str(body.get("mime_type")),
                size=size if isinstance(size, int) and not isinstance(size, bool) else None,
                file_name=_str(body.get("filename")),
            ),
        )
    if typ == MessageType.LOCATION.value:
        latitude, longitude = _number(body.get("latitude")), _number(body.get("longitude"))
        if latitude is None or longitude is None:
            return ()
        return (
            MediaAttachment(
                "location",
                latitude=latitude,
                longitude=longitude,
                title=_str(body.get("name")),
                address=_str(body.get("address")),
            ),
        )
    if typ == MessageType.CONTACTS.value:
        cards = []
        for contact in _dicts(message.get(typ)):
            name = _dict(contact.get("name"))
            title = _str(name.get("formatted_name")) or _str(name.get("first_name")) or ""
            phones = tuple(
                phone for p in _dicts(contact.get("phones")) if (phone := _str(p.get("phone")))
            )
            cards.append(MediaAttachment("contact", title=title, phones=phones))
        return tuple(cards)
    return ()


def _parse_message(
    message: dict[str, Any],
    contacts: list[dict[str, Any]],
    metadata: dict[str, Any],
    business_number: str,
    sent_ids: Container[str],
) -> MessageEvent | None:
    wamid = _str(message.get("id"))
    typ = _str(message.get("type")) or "unknown"
    if wamid is None:
        logger.warning("WhatsApp message without an id skipped (type %s)", typ)
        return None
    if typ in IGNORED_TYPES:
        logger.debug("WhatsApp %s message %s starts no turn", typ, log_ref(wamid))
        return None
    content = _content(message, typ)
    if content is None:
        logger.warning(
            "WhatsApp %s message %s has no readable content; skipped", typ, log_ref(wamid)
        )
        return None
    text, media_kind = content
    if media_kind == MessageType.STICKER.value and message.get("group_id") is not None:
        return None  # a bare sticker in a group is chatter: ignored, not apologised for

    sender_hint = _str(message.get("from")) or _str(message.get("from_user_id"))
    contact = _find_contact(contacts, sender_hint)
    sender = sender_hint or _str(contact.get("wa_id")) or _str(contact.get("user_id"))
    if sender is None:
        logger.warning("WhatsApp message %s without a sender skipped", log_ref(wamid))
        return None
    sender_name = _str(_dict(contact.get("profile")).get("name"))

    group_id = _str(message.get("group_id"))
    chat_type: ChatType = "group" if group_id is not None else "dm"
    chat_id = group_id if group_id is not None else sender

    context = _dict(message.get("context"))
    quoted_id = _str(context.get("id"))
    quoted_from = digits(context.get("from"))
    replies_to_bot = bool(
        (business_number and quoted_from == business_number)
        or (quoted_id is not None and quoted_id in sent_ids)
    )

    mentions_bot = False
    if business_number:
        mention = re.compile(rf"(?<![\w@])@\+?{re.escape(business_number)}(?!\d)")
        if mention.search(text):
            mentions_bot = True
            text = re.sub(r"[ \t]{2,}", " ", mention.sub("", text)).strip()

    # A tap on one of our interactive messages: its id is the gateway's button token.
    tap = _tap(message, typ)

    command = None
    found = _COMMAND.match(text)
    # In a group a bare "/word" may be meant for people; it counts only next to a mention.
    if found and (chat_type == "dm" or mentions_bot):
        command = found.group(1).lower()

    return MessageEvent(
        platform=PLATFORM,
        message_id=wamid,
        source=SessionSource(
            platform=PLATFORM,
            chat_id=chat_id,
            chat_type=chat_type,
            sender_id=sender,
            sender_name=sender_name,
        ),
        text=text,
        platform_message_id=wamid,
        reply_to_id=quoted_id,
        replies_to_bot=replies_to_bot,
        mentions_bot=mentions_bot,
        command=command,
        media_kind=media_kind,
        timestamp=parse_timestamp(message.get("timestamp")),
        media=attachments(message, typ),
        tap_token=tap,
        keyboard_message_id=quoted_id if tap is not None else None,
        raw={
            "message": message,
            "contact": contact,
            "metadata": metadata,
            "user_id": _str(contact.get("user_id")),
            "parent_user_id": _str(contact.get("parent_user_id")),
        },
    )
