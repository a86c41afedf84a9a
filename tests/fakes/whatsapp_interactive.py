"""Interactive messages for the fake Graph API, and the webhooks a tap on one produces.

``interactive_problem`` checks an ``"type": "interactive"`` send as the Cloud
API does: a ``button`` message has 1-3 reply buttons, each title 1-20
characters and unique, each id 1-256 characters and unique; a ``list``
message has a button text of 1-20 characters and at most 10 rows in all, row
titles 1-24 characters, row ids 1-200; the body text 1-1,024 characters. The
answer is Meta's error text (the server answers it as a 400 with code 100).

``tap_webhook`` builds the ``button_reply`` / ``list_reply`` webhook of a tap
from the recorded pywa payloads (``tests/data/whatsapp/button_reply.json`` and
``list_reply.json``) with the id, title and quoted message filled in.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Literal

from tests.fakes.whatsapp_webhook import USER_WA_ID, WebhookSender, real_wamid

__all__ = ["interactive_problem", "tap_webhook"]

DATA = Path(__file__).resolve().parents[1] / "data" / "whatsapp"
MAX_BODY = 1024
MAX_BUTTONS = 3
MAX_BUTTON_TITLE = 20
MAX_BUTTON_ID = 256
MAX_ROWS = 10
MAX_ROW_TITLE = 24
MAX_ROW_ID = 200
MAX_ROW_DESCRIPTION = 72


def _text_ok(value: object, limit: int) -> bool:
    return isinstance(value, str) and 1 <= len(value) <= limit and bool(value.strip())


def interactive_problem(body: dict[str, Any]) -> str | None:
    """Meta's error for an invalid interactive message, else ``None``."""
    interactive = body.get("interactive")
    if not isinstance(interactive, dict):
        return "(#100) The parameter interactive is required."
    text = (interactive.get("body") or {}).get("text")
    if not _text_ok(text, MAX_BODY):
        return f"(#100) Param interactive['body']['text'] must be 1-{MAX_BODY} characters long."
    action = interactive.get("action") or {}
    kind = interactive.get("type")
    if kind == "button":
        return _buttons_problem(action.get("buttons"))
    if kind == "list":
        return _list_problem(action)
    return "(#100) Invalid parameter interactive['type']"


def _buttons_problem(buttons: object) -> str | None:
    if not isinstance(buttons, list) or not 1 <= len(buttons) <= MAX_BUTTONS:
        return f"(#131009) Parameter value is not valid: buttons count must be 1-{MAX_BUTTONS}"
    titles: set[str] = set()
    ids: set[str] = set()
    for button in buttons:
        reply = button.get("reply") if isinstance(button, dict) else None
        if not isinstance(reply, dict) or button.get("type") != "reply":
            return "(#100) Invalid parameter interactive['action']['buttons']"
        title, ident = reply.get("title"), reply.get("id")
        if not _text_ok(title, MAX_BUTTON_TITLE):
            return f"(#131009) Button title length invalid. Max length is {MAX_BUTTON_TITLE}"
        if not _text_ok(ident, MAX_BUTTON_ID):
            return f"(#131009) Button id length invalid. Max length is {MAX_BUTTON_ID}"
        if title in titles or ident in ids:
            return "(#131009) Button title or id must be unique"
        titles.add(str(title))
        ids.add(str(ident))
    return None


def _list_problem(action: dict[str, Any]) -> str | None:
    if not _text_ok(action.get("button"), MAX_BUTTON_TITLE):
        return f"(#131009) List button text must be 1-{MAX_BUTTON_TITLE} characters long"
    sections = action.get("sections")
    if not isinstance(sections, list) or not sections:
        return "(#131009) The list needs at least one section"
    rows = [row for section in sections for row in (section.get("rows") or [])]
    if not 1 <= len(rows) <= MAX_ROWS:
        return f"(#131009) Total row count exceed max allowed count: {MAX_ROWS}"
    ids: set[str] = set()
    for row in rows:
        if not _text_ok(row.get("title"), MAX_ROW_TITLE):
            return f"(#131009) Row title length invalid. Max length is {MAX_ROW_TITLE}"
        ident = row.get("id")
        if not _text_ok(ident, MAX_ROW_ID) or ident in ids:
            return f"(#131009) Row id must be unique and 1-{MAX_ROW_ID} characters long"
        description = row.get("description")
        if description is not None and not _text_ok(description, MAX_ROW_DESCRIPTION):
            return f"(#131009) Row description must be at most {MAX_ROW_DESCRIPTION} characters"
        ids.add(str(ident))
    return None


def tap_webhook(
    sender: WebhookSender,
    kind: Literal["button_reply", "list_reply"],
    reply_id: str,
    title: str,
    *,
    context_id: str | None,
    wa_id: str = USER_WA_ID,
    wamid: str | None = None,
) -> dict[str, Any]:
    """The webhook of a tap on the reply button or list row ``reply_id`` of message
    ``context_id`` (``None``: no ``context``), made from the recorded payload of that kind."""
    name = "button_reply.json" if kind == "button_reply" else "list_reply.json"
    recorded = json.loads((DATA / name).read_text(encoding="utf-8"))
    message = copy.deepcopy(recorded["entry"][0]["changes"][0]["value"]["messages"][0])
    message.update(
        {
            "from": wa_id,
            "id": wamid or real_wamid(wa_id),
            "timestamp": str(int(time.time())),
            "context": {"from": sender.display_phone_number, "id": context_id},
        }
    )
    if context_id is None:  # a malformed tap: no quoted message
        del message["context"]
    message["interactive"][kind].update(id=reply_id, title=title)
    return sender.single(message)
