"""The console prints an answer as it is written; the final reply completes that line."""

from __future__ import annotations

import io

from bot.gateway.contract import MessageEvent, SessionSource
from bot.platforms.console import CONSOLE_CHAT_ID, CONSOLE_DRAFT_INTERVAL, PROMPT, ConsoleAdapter

EVENT = MessageEvent(
    platform="console",
    message_id="console:1",
    source=SessionSource("console", CONSOLE_CHAT_ID, "dm", "local-user"),
    text="hi",
)


class Writes(io.StringIO):
    """Keeps each write apart, to see what appeared when."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str, /) -> int:
        self.writes.append(text)
        return super().write(text)


async def test_drafts_print_only_what_is_new_and_the_final_finishes_the_line() -> None:
    out = Writes()
    console = ConsoleAdapter(input_stream=io.StringIO(""), output_stream=out)
    assert console.draft_interval(EVENT) == CONSOLE_DRAFT_INTERVAL
    await console.send_draft(EVENT, 1, "[Helper] Hello")
    await console.send_draft(EVENT, 1, "[Helper] Hello there")
    await console.send(CONSOLE_CHAT_ID, "[Helper] Hello there, friend.")
    await console.send(CONSOLE_CHAT_ID, "[Helper] next")
    # The same bytes as without streaming, for a pipe reading the console.
    assert out.getvalue() == "[Helper] Hello there, friend.\n[Helper] next\n"
    assert out.writes[:3] == ["[Helper] Hello", " there", ", friend.\n"]


async def test_a_final_that_differs_from_the_draft_starts_a_new_line() -> None:
    out = Writes()
    console = ConsoleAdapter(input_stream=io.StringIO(""), output_stream=out)
    await console.send_draft(EVENT, 1, "[Helper] Half an ans")
    await console.send(CONSOLE_CHAT_ID, "[Helper] Sorry, something went wrong.")
    assert out.getvalue() == "[Helper] Half an ans\n[Helper] Sorry, something went wrong.\n"


async def test_a_void_draft_ends_the_line_and_the_next_round_starts_fresh() -> None:
    out = Writes()
    console = ConsoleAdapter(input_stream=io.StringIO(""), output_stream=out)
    await console.send_draft(EVENT, 1, "[Helper] Let me check.")
    await console.send_draft(EVENT, 1, "")  # the tool round's text was not the answer
    await console.send_draft(EVENT, 1, "[Helper] It ")
    await console.send(CONSOLE_CHAT_ID, "[Helper] It shipped.")
    assert out.getvalue() == "[Helper] Let me check.\n[Helper] It shipped.\n"


async def test_a_draft_write_that_arrives_after_the_final_is_dropped() -> None:
    out = Writes()
    console = ConsoleAdapter(input_stream=io.StringIO(""), output_stream=out)
    stale = console._epoch  # a draft write that started before the final was sent
    await console.send(CONSOLE_CHAT_ID, "[Helper] Done.")
    console._write_draft("[Helper] Do", stale)
    assert out.getvalue() == "[Helper] Done.\n"


class TTYWrites(Writes):
    def isatty(self) -> bool:
        return True


async def test_on_a_terminal_the_draft_replaces_the_prompt_and_the_final_redraws_it() -> None:
    out = TTYWrites()
    console = ConsoleAdapter(input_stream=TTYWrites(), output_stream=out)
    console._prompt_pending = True  # the reader thread shows "> " while it waits for a line
    await console.send_draft(EVENT, 1, "[Helper] Hel")
    await console.send(CONSOLE_CHAT_ID, "[Helper] Hello.")
    assert out.getvalue() == f"\r\x1b[K[Helper] Hello.\n{PROMPT}"
