"""Builds Meta-shaped WhatsApp webhook bodies and POSTs them signed, like Meta does.

``WebhookSender(url, app_secret)`` signs the exact bytes it posts with
``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>``; ``post`` can
send the same body several times, concurrently, or with a missing or wrong
signature. Pass ``transport=httpx.ASGITransport(app)`` to post into an app
without a socket.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import httpx

__all__ = [
    "BUSINESS_NUMBER",
    "GROUP_ID",
    "PHONE_NUMBER_ID",
    "USER_NAME",
    "USER_WA_ID",
    "WABA_ID",
    "WebhookSender",
    "real_wamid",
    "sign",
]

PHONE_NUMBER_ID = "106540352242922"
BUSINESS_NUMBER = "15550783881"
WABA_ID = "102290129340398"
USER_WA_ID = "16505551234"
USER_NAME = "Kerry Fisher"
USER_BSUID = "US.13491208655302741918"
GROUP_ID = "Y2FwaV9ncm91cDoxNTU1MDc4Mzg4MToxMjAzNjMwMjU0NzQxNTk4MTkZD"

Signature = Literal["valid", "missing", "bad"]


def sign(body: bytes, app_secret: str) -> str:
    """The ``X-Hub-Signature-256`` value Meta sends for ``body``."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def real_wamid(wa_id: str) -> str:
    """A fresh message id in WhatsApp's own format, which embeds ``wa_id``.

    A real wamid is standard base64 of a small protobuf-like record holding the
    other party's number and a random hex id (Meta's documented sample decodes
    to ``16505076520``). Random ids could never reveal that a log line leaks a
    phone number; these do.
    """
    number = wa_id.encode()
    if len(number) > 0xFF:
        raise ValueError("a wamid holds at most 255 bytes of wa_id")
    suffix = secrets.token_hex(9).upper().encode("ascii")
    record = (
        b"\x1c\x18"
        + bytes([len(number)])
        + number
        + b"\x15\x02\x00\x11\x18"
        + bytes([len(suffix)])
        + suffix
        + b"\x00"
    )
    return "wamid." + base64.b64encode(record).decode("ascii")


class WebhookSender:
    """Meta's side of the webhook: payload builders plus a signing poster."""

    def __init__(
        self,
        url: str,
        app_secret: str | None,
        *,
        phone_number_id: str = PHONE_NUMBER_ID,
        display_phone_number: str = BUSINESS_NUMBER,
        waba_id: str = WABA_ID,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self.app_secret = app_secret
        self.phone_number_id = phone_number_id
        self.display_phone_number = display_phone_number
        self.waba_id = waba_id
        self.transport = transport

    # -- payload builders ------------------------------------------------------------------

    def metadata(self, phone_number_id: str | None = None) -> dict[str, str]:
        """``value.metadata`` for our (or another) business number."""
        return {
            "display_phone_number": self.display_phone_number,
            "phone_number_id": phone_number_id or self.phone_number_id,
        }

    @staticmethod
    def contact(wa_id: str = USER_WA_ID, name: str = USER_NAME) -> dict[str, Any]:
        """A ``contacts[]`` item with profile name and business-scoped ids."""
        return {
            "profile": {"name": name},
            "wa_id": wa_id,
            "user_id": USER_BSUID,
        }

    @staticmethod
    def message(
        typ: str,
        content: Any = None,
        *,
        wa_id: str = USER_WA_ID,
        wamid: str | None = None,
        timestamp: int | None = None,
        group_id: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One ``messages[]`` item of type ``typ`` carrying ``content`` under that key."""
        message: dict[str, Any] = {
            "from": wa_id,
            "id": wamid or real_wamid(wa_id),
            "timestamp": str(timestamp if timestamp is not None else int(time.time())),
            "type": typ,
        }
        if group_id is not None:
            message["group_id"] = group_id
        if context is not None:
            message["context"] = dict(context)
        if content is not None:
            message[typ] = content
        return message

    def value(
        self,
        messages: Sequence[Mapping[str, Any]] = (),
        *,
        statuses: Sequence[Mapping[str, Any]] = (),
        contacts: Sequence[Mapping[str, Any]] | None = None,
        phone_number_id: str | None = None,
    ) -> dict[str, Any]:
        """A ``changes[].value``; contacts default to one per distinct sender."""
        value: dict[str, Any] = {
            "messaging_product": "whatsapp",
            "metadata": self.metadata(phone_number_id),
        }
        if messages:
            if contacts is None:
                senders = dict.fromkeys(str(m["from"]) for m in messages)
                contacts = [self.contact(wa_id=s, name=f"User {s[-4:]}") for s in senders]
            value["contacts"] = [dict(c) for c in contacts]
            value["messages"] = [dict(m) for m in messages]
        if statuses:
            value["statuses"] = [dict(s) for s in statuses]
        return value

    def envelope(self, entries: Iterable[Iterable[Mapping[str, Any]]]) -> dict[str, Any]:
        """A full body: one ``entry`` per item, each holding ``changes`` with these values."""
        return {
            "object": "whatsapp_business_account",
            "entry": [
                {
                    "id": self.waba_id,
                    "changes": [{"value": dict(v), "field": "messages"} for v in values],
                }
                for values in entries
            ],
        }

    def single(self, message: Mapping[str, Any], *, name: str = USER_NAME) -> dict[str, Any]:
        """A body with exactly one message (the common case)."""
        contacts = [self.contact(wa_id=str(message["from"]), name=name)]
        return self.envelope([[self.value([message], contacts=contacts)]])

    def text(
        self,
        body: str,
        *,
        wa_id: str = USER_WA_ID,
        name: str = USER_NAME,
        wamid: str | None = None,
        group_id: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A text message body."""
        message = self.message(
            "text",
            {"body": body},
            wa_id=wa_id,
            wamid=wamid,
            group_id=group_id,
            context=context,
        )
        return self.single(message, name=name)

    def reply(self, body: str, *, to_wamid: str, **kwargs: Any) -> dict[str, Any]:
        """A text replying to one of the business's messages (``context``)."""
        return self.text(
            body, context={"from": self.display_phone_number, "id": to_wamid}, **kwargs
        )

    def group_text(self, body: str, *, group_id: str = GROUP_ID, **kwargs: Any) -> dict[str, Any]:
        """A text written in a group."""
        return self.text(body, group_id=group_id, **kwargs)

    def batched(self, texts: Sequence[Sequence[Sequence[str]]]) -> dict[str, Any]:
        """Several messages across entries and changes.

        ``texts[e][c]`` lists the texts of change ``c`` of entry ``e``; each text is
        sent by a different user.
        """
        entries = []
        counter = 0
        for entry in texts:
            values = []
            for change in entry:
                messages = []
                for body in change:
                    counter += 1
                    wa_id = f"1650555{counter:04d}"
                    messages.append(self.message("text", {"body": body}, wa_id=wa_id))
                values.append(self.value(messages))
            entries.append(values)
        return self.envelope(entries)

    def status(
        self,
        wamid: str,
        status: Literal["sent", "delivered", "read", "failed"],
        *,
        recipient_id: str = USER_WA_ID,
        error_code: int = 131026,
        error_title: str = "Message undeliverable",
    ) -> dict[str, Any]:
        """A status update for one of our messages."""
        item: dict[str, Any] = {
            "id": wamid,
            "status": status,
            "timestamp": str(int(time.time())),
            "recipient_id": recipient_id,
        }
        if status == "failed":
            item["errors"] = [
                {
                    "code": error_code,
                    "title": error_title,
                    "message": error_title,
                    "error_data": {"details": "Message failed to send."},
                }
            ]
        else:
            item["conversation"] = {
                "id": secrets.token_hex(16),
                "origin": {"type": "service"},
            }
            item["pricing"] = {"billable": True, "pricing_model": "PMP", "category": "service"}
        return self.envelope([[self.value(statuses=[item])]])

    def edit(self, original_wamid: str, new_text: str) -> dict[str, Any]:
        """An edit of an earlier user message."""
        return self.single(
            self.message(
                "edit",
                {
                    "original_message_id": original_wamid,
                    "message": {"type": "text", "text": {"body": new_text}},
                },
            )
        )

    def reaction(self, target_wamid: str, emoji: str = "\N{THUMBS UP SIGN}") -> dict[str, Any]:
        """A reaction to a message."""
        return self.single(self.message("reaction", {"message_id": target_wamid, "emoji": emoji}))

    def revoke(self, original_wamid: str) -> dict[str, Any]:
        """A deletion ("delete for everyone") of an earlier user message."""
        return self.single(self.message("revoke", {"original_message_id": original_wamid}))

    def button_reply(self, reply_id: str, title: str, *, context_id: str | None) -> dict[str, Any]:
        """A tap on reply button ``reply_id`` of our message ``context_id`` (the recorded
        pywa payload, ``tests.fakes.whatsapp_interactive.tap_webhook``)."""
        from tests.fakes.whatsapp_interactive import tap_webhook  # it imports this module

        return tap_webhook(self, "button_reply", reply_id, title, context_id=context_id)

    def list_reply(self, reply_id: str, title: str, *, context_id: str | None) -> dict[str, Any]:
        """A tap on list row ``reply_id`` of our message ``context_id``."""
        from tests.fakes.whatsapp_interactive import tap_webhook

        return tap_webhook(self, "list_reply", reply_id, title, context_id=context_id)

    def unsupported(self) -> dict[str, Any]:
        """A message type the Cloud API cannot deliver to businesses."""
        message = self.message("unsupported")
        message["errors"] = [
            {
                "code": 131051,
                "title": "Message type unknown",
                "message": "Message type unknown",
                "error_data": {"details": "Message type is currently not supported."},
            }
        ]
        return self.single(message)

    def image(self, caption: str | None = None) -> dict[str, Any]:
        """An image, optionally with a caption."""
        content: dict[str, Any] = {
            "mime_type": "image/jpeg",
            "sha256": "WNMh0BIhDCiAA3J1AYnYwQ4tFmF/8MLgpsUh0hPtJrY=",
            "id": "1003383421387256",
        }
        if caption is not None:
            content["caption"] = caption
        return self.single(self.message("image", content))

    # -- posting ---------------------------------------------------------------------------

    def encode(self, payload: Mapping[str, Any] | bytes) -> bytes:
        """The exact bytes that will be posted."""
        if isinstance(payload, bytes):
            return payload
        return json.dumps(payload, separators=(",", ":")).encode()

    def headers(self, body: bytes, signature: Signature | str = "valid") -> dict[str, str]:
        """Request headers; ``signature`` is valid, missing, bad or a literal header value."""
        headers = {"Content-Type": "application/json"}
        if signature == "valid":
            if self.app_secret is None:
                raise ValueError("a valid signature needs app_secret")
            headers["X-Hub-Signature-256"] = sign(body, self.app_secret)
        elif signature == "bad":
            headers["X-Hub-Signature-256"] = sign(body, "not-the-app-secret")
        elif signature != "missing":
            headers["X-Hub-Signature-256"] = signature
        return headers

    async def post(
        self,
        payload: Mapping[str, Any] | bytes,
        *,
        signature: Signature | str = "valid",
        times: int = 1,
        concurrent: bool = False,
    ) -> list[httpx.Response]:
        """POST ``payload`` ``times`` times (all at once if ``concurrent``); return responses."""
        body = self.encode(payload)
        headers = self.headers(body, signature)
        async with httpx.AsyncClient(transport=self.transport, timeout=10.0) as client:
            if concurrent:
                return list(
                    await asyncio.gather(
                        *(
                            client.post(self.url, content=body, headers=headers)
                            for _ in range(times)
                        )
                    )
                )
            return [
                await client.post(self.url, content=body, headers=headers) for _ in range(times)
            ]

    async def post_one(
        self, payload: Mapping[str, Any] | bytes, *, signature: Signature | str = "valid"
    ) -> httpx.Response:
        """POST ``payload`` once."""
        (response,) = await self.post(payload, signature=signature)
        return response
