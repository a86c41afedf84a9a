"""An in-process adapter with buttons, for gateway tests of taps and approvals."""

from __future__ import annotations

from collections.abc import Sequence

from bot.gateway.contract import MessageEvent, OutgoingButton, SendResult
from tests.fakes.adapter import FakeAdapter

__all__ = ["ButtonAdapter"]


class ButtonAdapter(FakeAdapter):
    """A fake channel that shows buttons and records tap answers and removed keyboards."""

    def __init__(self) -> None:
        super().__init__()
        self.keyboards: list[list[OutgoingButton]] = []
        self.answers: list[tuple[str, str | None]] = []
        self.removed: list[str] = []

    async def send_with_buttons(
        self,
        chat_id: str,
        text: str,
        buttons: Sequence[OutgoingButton],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        self.keyboards.append(list(buttons))
        return await self.send(chat_id, text, thread_id=thread_id, reply_to=reply_to)

    async def answer_tap(self, event: MessageEvent, notice: str | None) -> None:
        self.answers.append((event.message_id, notice))

    async def remove_keyboard(self, event: MessageEvent) -> None:
        self.removed.append(event.keyboard_message_id or "")
