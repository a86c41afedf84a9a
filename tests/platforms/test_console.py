"""The console adapter, driven with in-memory streams."""

from __future__ import annotations

import asyncio
import io
import threading
from pathlib import Path

import pytest

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent, OutgoingFile
from bot.platforms.base import EventHandler, PlatformAdapter, SendResult
from bot.platforms.console import (
    CONSOLE_CHAT_ID,
    CONSOLE_SENDER_ID,
    NOT_ADMITTED_NOTICE,
    PROMPT,
    ConsoleAdapter,
)


class TTYStringIO(io.StringIO):
    """A StringIO that claims to be a terminal."""

    def isatty(self) -> bool:
        return True


class Recorder:
    """An ``on_event`` handler that keeps what it gets."""

    def __init__(self, *, fail_on: str | None = None) -> None:
        self.events: list[MessageEvent] = []
        self.fail_on = fail_on

    async def __call__(self, event: MessageEvent) -> bool:
        if event.text == self.fail_on:
            raise RuntimeError("inbox is down")
        self.events.append(event)
        return True


async def run_until_eof(adapter: ConsoleAdapter, handler: EventHandler) -> None:
    await adapter.start(handler)
    await asyncio.wait_for(adapter.closed.wait(), timeout=5)
    await adapter.stop()


def test_satisfies_the_platform_protocol() -> None:
    adapter: PlatformAdapter = ConsoleAdapter(
        input_stream=io.StringIO(), output_stream=io.StringIO()
    )
    assert isinstance(adapter, PlatformAdapter)
    assert adapter.name == "console"
    assert adapter.max_text_len >= 1_000_000
    assert list(adapter.routes()) == []
    assert adapter.format_reply("hello", "Billing") == "[Billing] hello"


async def test_lines_become_events_in_order_and_eof_closes() -> None:
    source = io.StringIO("hello\n\n   \nwhere is my order #1001?\r\nlast line without newline")
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=source, output_stream=io.StringIO(), user_name="Ana"
    )
    handler = Recorder()

    await adapter.start(handler)
    await asyncio.wait_for(adapter.closed.wait(), timeout=5)

    assert [e.text for e in handler.events] == [
        "hello",
        "where is my order #1001?",
        "last line without newline",
    ]
    assert adapter.eof
    # Input ended, but replies to those lines can still be sent until stop().
    connected_after_eof = adapter.is_connected
    await adapter.stop()
    assert connected_after_eof
    assert not adapter.is_connected
    first = handler.events[0]
    assert first.platform == "console"
    assert first.source.platform == "console"
    assert first.source.chat_id == CONSOLE_CHAT_ID == "local"
    assert first.source.chat_type == "dm"
    assert first.source.sender_id == CONSOLE_SENDER_ID == "local-user"
    assert first.source.sender_name == "Ana"
    assert first.command is None
    ids = [e.message_id for e in handler.events]
    assert all(i.startswith("console:") for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize(
    ("line", "command"),
    [
        pytest.param("/reset", "reset", id="reset"),
        pytest.param("/help", "help", id="help"),
        pytest.param("/start hello there", "start", id="start-with-args"),
        pytest.param("/RESET", "reset", id="upper-case"),
        pytest.param("/reset@chatflow_bot", "reset", id="addressed"),
        pytest.param("/usr/bin is a path", None, id="path-is-text"),
        pytest.param("/ hello", None, id="bare-slash"),
        pytest.param("hello /reset", None, id="slash-later"),
    ],
)
async def test_commands(line: str, command: str | None) -> None:
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=io.StringIO(line + "\n"), output_stream=io.StringIO()
    )
    handler = Recorder()

    await run_until_eof(adapter, handler)

    assert len(handler.events) == 1
    assert handler.events[0].command == command
    assert handler.events[0].text == line


async def test_next_line_is_read_only_after_the_previous_event_was_accepted() -> None:
    source = CountingInput("one\ntwo\n")
    adapter = ConsoleAdapter(piped_idle_seconds=0, input_stream=source, output_stream=io.StringIO())
    reads_during_handler: list[int] = []

    async def handler(event: MessageEvent) -> bool:
        reads_during_handler.append(source.reads)
        return True

    await run_until_eof(adapter, handler)

    # "one" was handled before the second read began, "two" before the third (EOF).
    assert reads_during_handler == [1, 2]
    assert source.reads == 3


async def test_a_failing_handler_is_reported_and_reading_goes_on() -> None:
    output = io.StringIO()
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=io.StringIO("boom\nfine\n"), output_stream=output
    )
    handler = Recorder(fail_on="boom")

    await run_until_eof(adapter, handler)

    assert [e.text for e in handler.events] == ["fine"]
    assert "could not be accepted" in output.getvalue()


async def test_a_line_the_gateway_ignores_gets_one_line_saying_why() -> None:
    # The gateway answers False for a message the access settings do not admit.
    output = io.StringIO()
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=io.StringIO("hello\nagain\n"), output_stream=output
    )
    seen: list[str] = []

    async def not_admitted(event: MessageEvent) -> bool:
        seen.append(event.text)
        return False

    await run_until_eof(adapter, not_admitted)

    assert seen == ["hello", "again"]
    assert output.getvalue() == f"{NOT_ADMITTED_NOTICE}\n" * 2
    assert "local-user is not in ALLOWED_USERS" in NOT_ADMITTED_NOTICE


async def test_send_writes_lines_and_counts_ids() -> None:
    output = io.StringIO()
    adapter = ConsoleAdapter(piped_idle_seconds=0, input_stream=io.StringIO(), output_stream=output)

    first = await adapter.send("local", adapter.format_reply("Hi!", "Triage"))
    second = await adapter.send("local", "second\nwith two lines")

    assert first == SendResult(message_ids=["1"])
    assert second == SendResult(message_ids=["2"])
    assert output.getvalue() == "[Triage] Hi!\nsecond\nwith two lines\n"


async def test_concurrent_sends_keep_their_order() -> None:
    output = io.StringIO()
    adapter = ConsoleAdapter(piped_idle_seconds=0, input_stream=io.StringIO(), output_stream=output)

    results = await asyncio.gather(*(adapter.send("local", f"reply {i}") for i in range(20)))

    assert output.getvalue() == "".join(f"reply {i}\n" for i in range(20))
    assert [r.message_ids for r in results] == [[str(i + 1)] for i in range(20)]


async def test_send_to_a_closed_output_raises_platform_error() -> None:
    output = io.StringIO()
    output.close()
    adapter = ConsoleAdapter(piped_idle_seconds=0, input_stream=io.StringIO(), output_stream=output)

    with pytest.raises(PlatformError) as caught:
        await adapter.send("local", "hello")

    assert caught.value.platform == "console"
    assert not caught.value.retryable


async def test_indicate_typing_writes_nothing() -> None:
    output = io.StringIO()
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=io.StringIO("hi\n"), output_stream=output
    )
    handler = Recorder()
    await run_until_eof(adapter, handler)

    await adapter.indicate_typing(handler.events[0])

    assert output.getvalue() == ""


async def test_interactive_terminal_shows_prompt_and_redraws_it_after_a_reply() -> None:
    output = TTYStringIO()
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=TTYStringIO("hi\n"), output_stream=output
    )
    handler = Recorder()
    await run_until_eof(adapter, handler)
    # Prompt for "hi", prompt for the read that hit EOF, then a newline for Ctrl-D.
    assert output.getvalue() == PROMPT + PROMPT + "\n"


async def test_reply_while_prompt_is_pending_clears_and_redraws_it() -> None:
    writer = TTYStringIO()
    adapter = ConsoleAdapter(piped_idle_seconds=0, input_stream=TTYStringIO(), output_stream=writer)
    # As if the reader thread had printed the prompt and were waiting for a line.
    adapter._prompt_pending = True

    await adapter.send("local", "[Triage] Hello")

    assert writer.getvalue() == "\r\x1b[K[Triage] Hello\n" + PROMPT


async def test_non_tty_input_gets_no_prompt() -> None:
    output = TTYStringIO()
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=io.StringIO("hi\n"), output_stream=output
    )
    await run_until_eof(adapter, Recorder())
    assert output.getvalue() == ""


async def test_stop_before_eof_ends_reading_and_is_idempotent() -> None:
    read_fd_stream = BlockingInput()
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=read_fd_stream, output_stream=io.StringIO()
    )
    handler = Recorder()
    await adapter.start(handler)
    connected_while_running = adapter.is_connected
    await asyncio.wait_for(asyncio.to_thread(read_fd_stream.reading.wait, 5), timeout=6)

    await adapter.stop()
    await adapter.stop()

    assert connected_while_running
    assert adapter.closed.is_set()
    assert not adapter.is_connected
    assert not adapter.eof
    # Let the blocked read finish; the reader thread then sees the stop and exits.
    read_fd_stream.feed("late line\n")
    assert adapter._reader is not None
    await asyncio.to_thread(adapter._reader.join, 5)
    assert not adapter._reader.is_alive()
    await asyncio.sleep(0)  # run any callback the thread scheduled before exiting
    assert handler.events == []


async def test_start_twice_is_refused() -> None:
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=io.StringIO(), output_stream=io.StringIO()
    )
    await adapter.start(Recorder())
    try:
        with pytest.raises(RuntimeError):
            await adapter.start(Recorder())
    finally:
        await adapter.stop()


async def test_undecodable_line_is_skipped_and_reading_goes_on() -> None:
    adapter = ConsoleAdapter(
        piped_idle_seconds=0, input_stream=FlakyInput(), output_stream=io.StringIO()
    )
    handler = Recorder()

    await run_until_eof(adapter, handler)

    assert [e.text for e in handler.events] == ["before", "after"]
    assert adapter.eof


async def test_broken_input_ends_like_eof_but_is_not_eof() -> None:
    source = io.StringIO("one\n")
    adapter = ConsoleAdapter(piped_idle_seconds=0, input_stream=source, output_stream=io.StringIO())
    source.close()
    handler = Recorder()

    await run_until_eof(adapter, handler)

    assert handler.events == []
    assert adapter.closed.is_set()
    assert not adapter.eof


class FlakyInput:
    """Lines, one of which cannot be decoded."""

    def __init__(self) -> None:
        self._steps: list[str | Exception] = [
            "before\n",
            UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
            "after\n",
            "",
        ]

    def readline(self) -> str:
        step = self._steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


class CountingInput:
    """Lines from a string; counts ``readline`` calls."""

    def __init__(self, text: str) -> None:
        self._lines = io.StringIO(text)
        self.reads = 0

    def readline(self) -> str:
        self.reads += 1
        return self._lines.readline()


class BlockingInput:
    """An input whose readline blocks until a line is fed (like a quiet terminal)."""

    def __init__(self) -> None:
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self.reading = threading.Event()

    def feed(self, line: str) -> None:
        with self._cond:
            self._lines.append(line)
            self._cond.notify_all()

    def readline(self) -> str:
        with self._cond:
            self.reading.set()
            self._cond.wait_for(lambda: bool(self._lines))
            return self._lines.pop(0)


async def test_attachments_print_where_the_file_is_saved(tmp_path: Path) -> None:
    output = io.StringIO()
    adapter = ConsoleAdapter(piped_idle_seconds=0, input_stream=io.StringIO(), output_stream=output)
    saved = tmp_path / "media" / "ab" / "abcd"
    photo = OutgoingFile("image", b"\xff\xd8\xff", "image/jpeg", "chart.jpg", path=saved)
    result = await adapter.send_attachments("local", [photo])
    assert output.getvalue() == f'[attached photo "chart.jpg": {saved}]\n'
    assert len(result.message_ids) == 1
