"""Inline keyboards for ``FakeTelegramServer`` (its ``buttons`` member).

``sendMessage``'s ``reply_markup`` is checked as the Bot API checks an inline
keyboard (an ``inline_keyboard`` array of arrays of buttons, each with a
non-empty ``text`` and ``callback_data`` of 1-64 bytes: 400
``BUTTON_DATA_INVALID`` otherwise) and kept per message. ``tap`` pushes the
``callback_query`` update a person's tap on a kept keyboard produces: the
recorded update ``tests/data/telegram/callback_query.json`` with its ``id``,
``from``, ``data`` and ``message`` (the bot's own message as ``sendMessage``
returned it) filled in. ``answerCallbackQuery`` is recorded (400 for an unknown id or a
second answer, as Telegram answers a query only once); ``editMessageReplyMarkup``
is recorded and replaces the kept keyboard (400 "message is not modified" when
nothing changes).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import itertools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["MAX_CALLBACK_DATA_BYTES", "TelegramButtonMethods"]

MAX_CALLBACK_DATA_BYTES = 64
_query_ids = itertools.count(4_350_000_000_000_000_001)
_TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "telegram" / "callback_query.json"


@functools.cache
def _template() -> dict[str, Any]:
    """The recorded ``callback_query`` update every tap is made from."""
    data: dict[str, Any] = json.loads(_TEMPLATE.read_text(encoding="utf-8"))
    return data


class TelegramButtonMethods:
    """The fake's inline keyboards: what was sent, taps, answers and edits."""

    def __init__(self, server: FakeTelegramServer) -> None:
        self._server = server
        self.keyboards: dict[tuple[str, int], list[list[dict[str, Any]]]] = {}
        """(chat id, message id) -> the inline keyboard the message carries now."""
        self.messages: dict[tuple[str, int], dict[str, Any]] = {}
        """(chat id, message id) -> the message as ``sendMessage`` returned it."""
        self.answers: list[dict[str, Any]] = []
        """Every ``answerCallbackQuery`` accepted, in order (its parameters)."""
        self.edits: list[dict[str, Any]] = []
        """Every ``editMessageReplyMarkup`` accepted, in order (its parameters)."""
        self.issued: set[str] = set()
        """Callback query ids pushed by ``tap``/``push_callback``."""
        self._cond = asyncio.Condition()

    # -- sendMessage -----------------------------------------------------------------

    def check_markup(self, params: dict[str, Any]) -> list[list[dict[str, Any]]] | None:
        """The inline keyboard of a send, validated (``_ApiError`` 400 as Telegram)."""
        from tests.fakes.telegram_server import _ApiError as ApiError

        markup = params.get("reply_markup")
        if markup is None:
            return None
        if isinstance(markup, str):
            try:
                markup = json.loads(markup)
            except ValueError as exc:
                raise ApiError(
                    400, "Bad Request: can't parse reply keyboard markup JSON object"
                ) from exc
        rows = markup.get("inline_keyboard") if isinstance(markup, dict) else None
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise ApiError(400, "Bad Request: can't parse inline keyboard button: object expected")
        for row in rows:
            for button in row:
                if not isinstance(button, dict) or not str(button.get("text") or "").strip():
                    raise ApiError(400, "Bad Request: BUTTON_TEXT_INVALID")
                data = button.get("callback_data")
                if not isinstance(data, str):
                    raise ApiError(
                        400, "Bad Request: text buttons are unallowed in the inline keyboard"
                    )
                if not 1 <= len(data.encode()) <= MAX_CALLBACK_DATA_BYTES:
                    raise ApiError(400, "Bad Request: BUTTON_DATA_INVALID")
        return rows

    def record(self, message: dict[str, Any], rows: list[list[dict[str, Any]]] | None) -> None:
        """Keep a sent message (and its keyboard, if any) for later taps."""
        key = (str(message["chat"]["id"]), int(message["message_id"]))
        self.messages[key] = message
        if rows:
            self.keyboards[key] = rows
            message["reply_markup"] = {"inline_keyboard": rows}

    def sent_keyboards(self) -> list[tuple[str, int, list[list[dict[str, Any]]]]]:
        """Every message that still carries a keyboard: (chat, message id, rows)."""
        return [(chat, mid, rows) for (chat, mid), rows in self.keyboards.items() if rows]

    # -- taps -----------------------------------------------------------------------------

    def tap(
        self,
        chat_id: int | str,
        message_id: int,
        label: str,
        *,
        from_id: int | None = None,
        first_name: str = "Ana",
        query_id: str | None = None,
    ) -> str:
        """Push the ``callback_query`` of a tap on the button ``label`` of a kept keyboard;
        returns the query id (pass it again to redeliver the same tap)."""
        key = (str(chat_id), message_id)
        data = next(
            b["callback_data"]
            for row in self.keyboards.get(key) or self._first_keyboard(key)
            for b in row
            if b["text"] == label
        )
        return self.push_callback(
            chat_id, message_id, data, from_id=from_id, first_name=first_name, query_id=query_id
        )

    def _first_keyboard(self, key: tuple[str, int]) -> list[list[dict[str, Any]]]:
        # A keyboard already removed: the person's app may still show it (a stale screen).
        for edit in self.edits:
            if (str(edit.get("chat_id")), int(edit.get("message_id", 0))) == key:
                return list(edit.get("_before") or [])
        raise KeyError(key)

    def push_callback(
        self,
        chat_id: int | str,
        message_id: int,
        data: str,
        *,
        from_id: int | None = None,
        first_name: str = "Ana",
        query_id: str | None = None,
    ) -> str:
        """Push a ``callback_query`` with any ``data`` (a forged or replayed tap)."""
        query = query_id or str(next(_query_ids))
        self.issued.add(query)
        chat = int(chat_id) if str(chat_id).lstrip("-").isdigit() else chat_id
        message = self.messages.get((str(chat_id), message_id)) or {
            "message_id": message_id,
            "from": self._server._bot_user(),
            "chat": self._server._chat(chat),
            "date": 1_700_000_000,
            "text": "…",
        }
        sender = (
            from_id
            if from_id is not None
            else (chat if isinstance(chat, int) and chat > 0 else 777)
        )
        update = copy.deepcopy(_template())
        update.pop("update_id", None)
        body = update["callback_query"]
        body.update(id=query, message=message, data=data)
        body["from"].update(id=sender, first_name=first_name)
        self._server.push_update(update)
        return query

    # -- methods ----------------------------------------------------------------------------

    async def answer_callback_query(self, params: dict[str, Any]) -> bool:
        """``answerCallbackQuery``: once per query id, as Telegram."""
        from tests.fakes.telegram_server import _ApiError as ApiError

        query = str(params.get("callback_query_id") or "")
        answered = {str(a.get("callback_query_id")) for a in self.answers}
        if query not in self.issued or query in answered:
            raise ApiError(
                400,
                "Bad Request: query is too old and response timeout expired or query ID is invalid",
            )
        async with self._cond:
            self.answers.append({**params, "callback_query_id": query})
            self._cond.notify_all()
        return True

    async def edit_message_reply_markup(self, params: dict[str, Any]) -> dict[str, Any]:
        """``editMessageReplyMarkup``: replaces (or removes) a kept keyboard."""
        from tests.fakes.telegram_server import _ApiError as ApiError

        key = (str(params.get("chat_id")), int(params.get("message_id") or 0))
        if key not in self.messages:
            raise ApiError(400, "Bad Request: message to edit not found")
        rows = self.check_markup(params) if params.get("reply_markup") is not None else []
        before = self.keyboards.get(key) or []
        if (rows or []) == before:
            raise ApiError(
                400,
                "Bad Request: message is not modified: specified new message content and reply "
                "markup are exactly the same as a current content and reply markup of the message",
            )
        async with self._cond:
            self.edits.append({**params, "_before": before})
            self.keyboards[key] = rows or []
            self._cond.notify_all()
        message = dict(self.messages[key])
        message.pop("reply_markup", None)
        return message

    async def wait_for_answers(self, count: int, within: float = 10.0) -> list[dict[str, Any]]:
        """Wait until ``count`` callback queries were answered."""
        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(lambda: len(self.answers) >= count), within)
        return list(self.answers)

    async def wait_for_edits(self, count: int, within: float = 10.0) -> list[dict[str, Any]]:
        """Wait until ``count`` keyboards were edited."""
        async with self._cond:
            await asyncio.wait_for(self._cond.wait_for(lambda: len(self.edits) >= count), within)
        return list(self.edits)
