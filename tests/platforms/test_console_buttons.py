"""Buttons in the terminal console: printed numbered; typing a number or a label taps."""

from __future__ import annotations

import asyncio
import contextlib
import io

from bot.gateway.contract import MessageEvent, OutgoingButton
from bot.platforms.console import ConsoleAdapter

CHOICES = [OutgoingButton("tok-s", "Small"), OutgoingButton("tok-l", "Large 2")]


def adapter() -> tuple[ConsoleAdapter, io.StringIO]:
    out = io.StringIO()
    return ConsoleAdapter(input_stream=io.StringIO(), output_stream=out), out


async def test_buttons_print_numbered_and_a_number_taps_once() -> None:
    console, out = adapter()
    await console.send_with_buttons("local", "[Shop] Which size?", CHOICES)
    assert out.getvalue().endswith("[Shop] Which size?\n\n1. Small\n2. Large 2\n")
    tap = console._make_event("2")
    assert (tap.tap_token, tap.text, tap.command) == ("tok-l", "", None)
    again = console._make_event("2")  # single use: now it is just text
    assert (again.tap_token, again.text) == (None, "2")


async def test_the_exact_label_taps_and_other_text_stays_text() -> None:
    console, _ = adapter()
    await console.send_with_buttons("local", "Which size?", CHOICES)
    assert console._make_event("large 2").tap_token is None  # not the exact label
    assert console._make_event("3").tap_token is None  # no such number
    assert console._make_event("Large 2").tap_token == "tok-l"


async def test_a_newer_message_retires_the_choices() -> None:
    console, out = adapter()
    await console.send_with_buttons("local", "Which size?", CHOICES)
    await console.send("local", "[Shop] Something else.")
    assert console._make_event("1").tap_token is None
    await console.answer_tap(console._make_event("x"), "This choice has expired.")
    assert out.getvalue().endswith("(This choice has expired.)\n")


async def test_piped_input_reads_the_next_line_once_the_last_one_is_answered() -> None:
    # "1" piped right after a question must choose: it is read only after the
    # question and its choices are printed, not as text before them.
    out = io.StringIO()
    console = ConsoleAdapter(input_stream=io.StringIO("refund please\n1\n"), output_stream=out)
    events: list[MessageEvent] = []
    asked = asyncio.Event()
    second = asyncio.Event()

    async def on_event(event: MessageEvent) -> bool:
        events.append(event)
        first = len(events) == 1
        if not first:
            second.set()

        async def answer_later() -> None:
            if first:
                # A slow model: the answer comes late; the next line must not be read
                # before it (were it read, ``second`` would be set here, as text).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(second.wait(), 0.5)
                await console.send_with_buttons("local", "Refund?", CHOICES)
                asked.set()
            else:
                await console.send("local", "Done.")

        asyncio.get_running_loop().create_task(answer_later())
        return True

    await console.start(on_event)
    await asyncio.wait_for(console.closed.wait(), 10)
    await console.stop()
    assert asked.is_set()
    assert [(e.text, e.tap_token) for e in events] == [("refund please", None), ("", "tok-s")]


async def test_piped_input_goes_on_when_a_line_gets_no_answer() -> None:
    console = ConsoleAdapter(
        input_stream=io.StringIO("one\ntwo\n"), output_stream=io.StringIO(), piped_idle_seconds=0.05
    )
    events: list[MessageEvent] = []

    async def on_event(event: MessageEvent) -> bool:
        events.append(event)
        return True

    await console.start(on_event)
    await asyncio.wait_for(console.closed.wait(), 10)
    await console.stop()
    assert [e.text for e in events] == ["one", "two"]
