"""The local terminal channel behind ``python -m bot chat``: no token, no network.

Each non-empty input line becomes a ``MessageEvent`` from one fixed local user
in one fixed DM chat; each reply is printed as ``[Agent] text`` so handoffs
show. A line starting with ``/`` is a command (``/reset`` -> ``command="reset"``).
A reply's buttons print as numbered lines; the next line that is one of those
numbers, or exactly one of the labels, is a tap on that button.

Input is read by a daemon thread, one line per request from the adapter's task:
the standard input cannot be made non-blocking portably (on a terminal, making
it non-blocking also affects stdout, which shares the file description), and a
read parked in ``asyncio.to_thread`` would keep ``asyncio.run`` from returning
until the user pressed Enter, because the default executor is joined at
shutdown. A daemon thread never holds up the exit. The next line is read only
after the gateway accepted the previous one, so events arrive in input order.

Writes go through ``asyncio.to_thread`` so a slow reader at the far end of a
pipe never stalls the event loop; they are serialised, so replies keep their
order.

Streaming (``STREAM_REPLIES``): the answer's drafts print its text as it
arrives, and the final reply, sent through the ledger as always, completes
that line instead of printing it again (a final that differs, e.g. the
apology after a failure, starts a new line). A piped reader sees the same
bytes as without streaming.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import re
import sys
import threading
from collections.abc import Sequence
from typing import Protocol
from uuid import uuid4

from starlette.routing import BaseRoute

from bot.errors import PlatformError
from bot.gateway.contract import (
    EventHandler,
    MessageEvent,
    OutgoingButton,
    OutgoingFile,
    PlatformAdapter,
    SendResult,
    SessionSource,
)
from bot.platforms.text import split_text

__all__ = [
    "CONSOLE_CHAT_ID",
    "CONSOLE_DRAFT_INTERVAL",
    "CONSOLE_SENDER_ID",
    "NOT_ADMITTED_NOTICE",
    "PROMPT",
    "ConsoleAdapter",
    "LineInput",
    "TextOutput",
]

logger = logging.getLogger(__name__)

CONSOLE_CHAT_ID = "local"
"""The one chat the console has."""
CONSOLE_DRAFT_INTERVAL = 0.05
"""Seconds between two draft writes: tokens show as they come, in few writes."""
CONSOLE_SENDER_ID = "local-user"
"""The one person who types into the console."""
PROMPT = "> "
"""Shown before each line read from an interactive terminal."""
NOT_ADMITTED_NOTICE = (
    f"(not answered: {CONSOLE_SENDER_ID} is not in ALLOWED_USERS; "
    "add it there to talk from this terminal)"
)
"""Written for a line the access settings ignore, in place of the reply it will not get."""

PIPED_IDLE_SECONDS = 5.0
"""Piped input: the next line is read once the last one is answered, or once its turn
showed no sign of life (the gateway's typing, every 4 s, or a draft) for this long."""
_COMMAND = re.compile(r"/([A-Za-z0-9_]{1,32})(?:@\S*)?(?:\s|$)")
"""A Telegram-style command word: ``/reset``, ``/start hello``; ``/usr/bin`` is text."""
_CLEAR_LINE = "\r\x1b[K"
"""Carriage return + ANSI erase-line: removes a pending prompt before a reply."""

_ReadResult = str | BaseException


class LineInput(Protocol):
    """What the console reads from: ``sys.stdin``, a text file, ``io.StringIO``.

    An ``isatty()`` method, if present, tells whether to show a prompt.
    """

    def readline(self) -> str:
        """The next line with its newline, or ``""`` at the end of input."""
        ...


class TextOutput(Protocol):
    """What the console writes to: ``sys.stdout``, a text file, ``io.StringIO``."""

    def write(self, text: str, /) -> int:
        """Write ``text``."""
        ...

    def flush(self) -> None:
        """Push buffered text out."""
        ...


class ConsoleAdapter(PlatformAdapter):
    """A ``PlatformAdapter`` for a local terminal (or any pair of text streams).

    Args:
        input_stream: Where lines are read; ``sys.stdin`` by default.
        output_stream: Where replies are written; ``sys.stdout`` by default.
        user_name: Display name of the local user (``sender_name`` of events).
    """

    name: str = "console"
    """Platform name used in session keys and ledger rows."""
    max_text_len: int = 1_000_000
    """A terminal has no message size limit; this only bounds one write."""
    closed: asyncio.Event
    """Set at the end of input (Ctrl-D, or the end of piped text): the bot stops."""

    def __init__(
        self,
        *,
        input_stream: LineInput | None = None,
        output_stream: TextOutput | None = None,
        user_name: str = "you",
        piped_idle_seconds: float = PIPED_IDLE_SECONDS,
    ) -> None:
        self._input: LineInput = input_stream if input_stream is not None else sys.stdin
        self._output: TextOutput = output_stream if output_stream is not None else sys.stdout
        self._user_name = user_name
        self._interactive = _isatty(self._input)
        self._ansi = self._interactive and _isatty(self._output)
        self.closed = asyncio.Event()
        """Set when the input ended (EOF) or the adapter stopped: the CLI awaits it,
        then drains the gateway so the last replies are written before it exits."""
        self._eof = False
        self._connected = False
        self._started = False
        self._task: asyncio.Task[None] | None = None
        self._requests: queue.SimpleQueue[asyncio.Future[_ReadResult] | None] = queue.SimpleQueue()
        self._reader: threading.Thread | None = None
        self._send_lock = asyncio.Lock()
        # Guards the output stream between the reader thread (prompt) and sends.
        self._write_lock = threading.Lock()
        self._prompt_pending = False
        self._sent = 0
        self._live = ""  # the draft printed so far on the current line
        # The buttons of the last reply, printed numbered: typing a number or a label taps.
        self._choices: list[OutgoingButton] = []
        self._epoch = 0  # bumped by each send: a draft write from before it is stale
        # Piped input is read like a person reads: the next line once this one is
        # answered, so a "1" after a question with choices chooses (it would otherwise
        # be read, as text, before the choices were printed).
        self._answered = asyncio.Event()
        self._busy = asyncio.Event()  # the turn of the last line is alive (typing, drafts)
        self._piped_idle_seconds = piped_idle_seconds

    @property
    def is_connected(self) -> bool:
        """True once ``start`` succeeded and until ``stop``.

        The end of input does not disconnect: replies to the last lines still
        have to be written while the gateway drains."""
        return self._connected

    @property
    def eof(self) -> bool:
        """True once the input stream reached its end."""
        return self._eof

    async def start(self, on_event: EventHandler) -> None:
        """Begin reading lines in the background and hand each to ``on_event``.

        Raises ``RuntimeError`` if the adapter was started before: its input
        belongs to one reader for the adapter's life.
        """
        if self._started:
            raise RuntimeError("ConsoleAdapter.start() called twice")
        self._started = True
        self._reader = threading.Thread(target=self._read_lines, name="console-input", daemon=True)
        self._reader.start()
        self._task = asyncio.create_task(self._pump(on_event), name="console-input")
        self._connected = True
        logger.info("console channel started (interactive=%s)", self._interactive)

    async def stop(self) -> None:
        """Stop reading input; idempotent. The streams are left open (not ours)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        self._finish()
        self._connected = False

    async def send(
        self,
        chat_id: str,
        text: str,
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Write ``text`` and a newline to the output stream and flush it.

        ``chat_id``, ``thread_id`` and ``reply_to`` are accepted for the
        protocol; the console has one chat and no quoting. Returns one
        sequential id per written part. A closed or broken output stream raises
        a non-retryable ``PlatformError``.
        """
        parts = [text] if len(text) <= self.max_text_len else split_text(text, self.max_text_len)
        ids: list[str] = []
        self._epoch += 1
        self._choices = []  # a newer message: the old choices are no longer on screen
        async with self._send_lock:
            for part in parts:
                try:
                    await asyncio.to_thread(self._write_reply, part)
                except (OSError, ValueError) as exc:
                    raise PlatformError(
                        f"cannot write to the console: {type(exc).__name__}",
                        platform=self.name,
                    ) from exc
                self._sent += 1
                ids.append(str(self._sent))
        self._answered.set()
        return SendResult(message_ids=ids)

    async def send_with_buttons(
        self,
        chat_id: str,
        text: str,
        buttons: Sequence[OutgoingButton],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Print the reply with its buttons numbered; typing a number or a label chooses."""
        result = await super().send_with_buttons(
            chat_id, text, buttons, thread_id=thread_id, reply_to=reply_to
        )
        self._choices = list(buttons)
        return result

    async def answer_tap(self, event: MessageEvent, notice: str | None) -> None:
        """Print the notice of a refused choice."""
        if notice:
            await asyncio.to_thread(self._write, f"({notice})\n")

    async def send_attachments(
        self,
        chat_id: str,
        files: Sequence[OutgoingFile],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        """Print where each file is saved (``DATA_DIR/media/...``): a terminal shows no files."""
        lines = [f"[attached {f.describe()}: {f.path or 'not saved'}]" for f in files]
        return await self.send(chat_id, "\n".join(lines))

    async def indicate_typing(self, event: MessageEvent) -> None:
        """Do nothing, on purpose: the user of a terminal sees the prompt come back
        only with the reply, and a printed "typing..." line would interleave with
        the conversation. It returns at once so the gateway's typing loop costs
        nothing here (piped input learns from it that the turn is still running)."""
        self._busy.set()

    def draft_interval(self, event: MessageEvent) -> float | None:
        """The console prints every answer as it is written."""
        return CONSOLE_DRAFT_INTERVAL

    async def send_draft(self, event: MessageEvent, draft_id: int, text: str) -> None:
        """Print what ``text`` adds to the draft already printed (a void draft: a new line)."""
        self._busy.set()
        try:
            await asyncio.to_thread(self._write_draft, text, self._epoch)
        except (OSError, ValueError) as exc:
            raise PlatformError(
                f"cannot write to the console: {type(exc).__name__}", platform=self.name
            ) from exc

    def format_reply(self, text: str, agent_name: str) -> str:
        """Prefix the reply with the answering agent, so handoffs are visible."""
        return f"[{agent_name}] {text}"

    def routes(self) -> Sequence[BaseRoute]:
        """No HTTP routes: the console is not reached over the network."""
        return []

    # -- input ---------------------------------------------------------------

    async def _pump(self, on_event: EventHandler) -> None:
        """Read lines one by one and deliver them, until EOF or cancellation."""
        try:
            while True:
                result = await self._read_line()
                if isinstance(result, UnicodeDecodeError):
                    logger.warning("console input line is not valid text; skipped")
                    continue
                if isinstance(result, BaseException):
                    logger.error("console input failed: %s", type(result).__name__)
                    break
                if result == "":
                    self._eof = True
                    if self._interactive:
                        # The user pressed Ctrl-D at the prompt: end that line.
                        await asyncio.to_thread(self._write, "\n")
                    break
                text = result.rstrip("\r\n")
                if not text.strip():
                    continue
                event = self._make_event(text)
                self._answered.clear()
                try:
                    accepted = await on_event(event)
                except Exception:
                    # There is no redelivery on a terminal: say so and go on.
                    logger.exception("console message %s was not accepted", event.message_id)
                    await asyncio.to_thread(
                        self._write, "(that message could not be accepted; please retry)\n"
                    )
                    continue
                if not accepted and event.tap_token is None:
                    # (A refused choice was told by answer_tap.) The gateway ignores a
                    # message only as a duplicate (never: each line has a fresh id) or
                    # as one the access settings do not admit. Silence
                    # would look like a dead bot to the operator trying the allow list.
                    logger.debug("console message %s not admitted", event.message_id)
                    await asyncio.to_thread(self._write, NOT_ADMITTED_NOTICE + "\n")
                elif accepted and not self._interactive:
                    await self._await_answer()
        finally:
            self._finish()

    async def _await_answer(self) -> None:
        """Piped input: wait for the answer to the line just accepted while its turn
        shows signs of life; a line that gets no answer (rate-limited, taken over)
        holds the rest up for ``piped_idle_seconds`` only."""
        while not self._answered.is_set():
            self._busy.clear()
            waiters = {asyncio.ensure_future(e.wait()) for e in (self._answered, self._busy)}
            try:
                await asyncio.wait(
                    waiters,
                    timeout=self._piped_idle_seconds,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if not self._busy.is_set():
                return

    def _make_event(self, text: str) -> MessageEvent:
        """Build the event for one input line (a tap when it names one of the choices
        printed last: its number or its exact label)."""
        match = _COMMAND.match(text)
        chosen = self._choice(text.strip())
        return MessageEvent(
            platform=self.name,
            message_id=f"console:{uuid4().hex}",
            source=SessionSource(
                self.name,
                chat_id=CONSOLE_CHAT_ID,
                chat_type="dm",
                sender_id=CONSOLE_SENDER_ID,
                sender_name=self._user_name,
            ),
            text="" if chosen else text,
            command=match.group(1).lower() if match and not chosen else None,
            tap_token=chosen,
        )

    def _choice(self, typed: str) -> str | None:
        """The token of the printed choice ``typed`` names (its number or label), if any."""
        choices = self._choices
        button: OutgoingButton | None
        if typed.isdigit() and 1 <= int(typed) <= len(choices):
            button = choices[int(typed) - 1]
        else:
            button = next((b for b in choices if b.label == typed), None)
        if button is None:
            return None
        self._choices = []  # single use: the next line is text again
        return button.token

    async def _read_line(self) -> _ReadResult:
        """Ask the reader thread for the next line ('' at EOF, or the error raised)."""
        future: asyncio.Future[_ReadResult] = asyncio.get_running_loop().create_future()
        self._requests.put(future)
        return await future

    def _read_lines(self) -> None:
        """Reader thread: serve one read request at a time until told to stop."""
        while True:
            future = self._requests.get()
            if future is None:
                return
            if self._interactive:
                with self._write_lock:
                    self._output.write(PROMPT)
                    self._output.flush()
                    self._prompt_pending = True
            result: _ReadResult
            try:
                result = self._input.readline()
            except Exception as exc:
                result = exc
            with self._write_lock:
                self._prompt_pending = False
            try:
                future.get_loop().call_soon_threadsafe(_resolve, future, result)
            except RuntimeError:
                return  # the loop is closed: nobody is waiting any more
            if result == "":
                return

    def _finish(self) -> None:
        """Mark the input closed and let the reader thread end."""
        if self._started and not self.closed.is_set():
            self._requests.put(None)
        self.closed.set()

    # -- output --------------------------------------------------------------

    def _write_reply(self, text: str) -> None:
        """Write one reply; on a terminal, redraw the prompt the reply displaced."""
        with self._write_lock:
            live, self._live = self._live, ""
            if live:  # the draft is on screen: finish its line, or leave it and start anew
                rest = text[len(live) :] if text.startswith(live) else "\n" + text
                self._output.write(rest + "\n" + (PROMPT if self._prompt_pending else ""))
            elif self._prompt_pending:
                self._output.write((_CLEAR_LINE if self._ansi else "\n") + text + "\n" + PROMPT)
            else:
                self._output.write(text + "\n")
            self._output.flush()

    def _write_draft(self, text: str, epoch: int) -> None:
        with self._write_lock:
            if epoch != self._epoch:
                return  # the final reply was written meanwhile
            live = self._live
            out = text[len(live) :] if text.startswith(live) else "\n" + text
            if not live and out and self._prompt_pending:
                out = (_CLEAR_LINE if self._ansi else "\n") + out
            self._live = text
            if out:
                self._output.write(out)
                self._output.flush()

    def _write(self, text: str) -> None:
        with self._write_lock:
            self._output.write(text)
            self._output.flush()


def _resolve(future: asyncio.Future[_ReadResult], result: _ReadResult) -> None:
    if not future.done():
        future.set_result(result)


def _isatty(stream: object) -> bool:
    isatty = getattr(stream, "isatty", None)
    if not callable(isatty):
        return False
    try:
        return bool(isatty())
    except (OSError, ValueError):  # a closed stream
        return False
