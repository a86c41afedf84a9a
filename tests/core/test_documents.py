"""Reading documents users send: hostile PDFs cost their own read and nothing else.

Review 2026-12-01b, F1: pypdf on a crafted 35 KB PDF runs for many minutes in a
default-executor thread the media step's timeout cannot stop; six of them block
every ``to_thread`` and DNS lookup of the bot. F2: pypdf raises errors outside the
set the reader caught (an unknown ``/Filter``), which escaped the media step.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.core import documents
from bot.core.documents import extract_text
from bot.errors import MediaError
from tests.fakes.child_processes import Children
from tests.fakes.media_files import hostile_pdf, unknown_filter_pdf


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> Iterator[Children]:
    seen = Children.record(monkeypatch)
    yield seen
    assert seen.running() == []  # no test leaves a reader behind


async def test_a_pdf_that_would_take_minutes_is_given_up_at_the_timeout(
    children: Children,
) -> None:
    reader = documents.DocumentReader(timeout=1.0)
    started = time.monotonic()
    with pytest.raises(MediaError, match="took too long"):
        await extract_text(hostile_pdf(), "application/pdf", "a.pdf", reader=reader)
    assert time.monotonic() - started < 4.0
    (child,) = children.processes
    assert child.returncode == -signal.SIGKILL  # killed, not left running


async def test_hostile_pdfs_never_hold_the_default_executor_or_dns(children: Children) -> None:
    # As many as the default executor has threads: the review's six on two cores.
    count = min(32, (os.cpu_count() or 1) + 4)
    reader = documents.DocumentReader(timeout=5.0)
    reads = [
        asyncio.create_task(extract_text(hostile_pdf(), "application/pdf", "a.pdf", reader=reader))
        for _ in range(count)
    ]
    await children.wait_for(2)  # two parse at once, the others wait for a slot
    assert len(children.running()) == 2
    loop = asyncio.get_running_loop()
    started = time.monotonic()
    assert await asyncio.wait_for(asyncio.to_thread(lambda: 1), 2.0) == 1
    assert await asyncio.wait_for(loop.getaddrinfo("localhost", 443), 2.0)
    assert time.monotonic() - started < 2.0
    for read in reads:
        read.cancel()
    results = await asyncio.gather(*reads, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert children.running() == []


async def test_a_cancelled_read_kills_its_reader(children: Children) -> None:
    # The media step's own timeout and a shutdown both arrive as a cancellation.
    read = asyncio.create_task(extract_text(hostile_pdf(), "application/pdf", "a.pdf"))
    await children.wait_for(1)
    (child,) = children.processes
    read.cancel()
    with pytest.raises(asyncio.CancelledError):
        await read
    assert child.returncode == -signal.SIGKILL


async def test_pages_heavier_than_the_cap_are_skipped_without_parsing_them(
    children: Children,
) -> None:
    # The review's own file: 200 pages of a 4 MB stream, about 5 s of pypdf a page.
    started = time.monotonic()
    with pytest.raises(MediaError, match="too complex"):
        await asyncio.wait_for(
            extract_text(
                hostile_pdf(page_content=4 * 1024 * 1024, pages=200), "application/pdf", "a.pdf"
            ),
            10.0,
        )
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("filter_name", ["/Foo", "/Fl"], ids=["unknown", "removed"])
async def test_an_unknown_filter_is_a_damaged_pdf_not_a_crash(
    children: Children, filter_name: str
) -> None:
    with pytest.raises(MediaError, match="damaged"):
        await extract_text(unknown_filter_pdf(filter_name), "application/pdf", "a.pdf")


async def test_the_reader_gets_none_of_the_bots_environment(
    children: Children, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process that parses hostile bytes must not hold the bot's keys.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-in-the-child")
    read = asyncio.create_task(extract_text(hostile_pdf(), "application/pdf", "a.pdf"))
    await children.wait_for(1)
    (child,) = children.processes
    try:
        environ = await asyncio.to_thread(Path(f"/proc/{child.pid}/environ").read_bytes)
    finally:
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
    assert b"sk-never-in-the-child" not in environ and b"OPENAI_API_KEY" not in environ


async def test_a_long_text_file_is_decoded_only_as_far_as_the_budget(
    children: Children,
) -> None:
    body = b"word " * (4 * 1024 * 1024)  # 20 MB, the default MAX_MEDIA_BYTES
    result = await extract_text(body, "text/plain", "notes.txt", max_chars=100)
    assert result.truncated and len(result.text) <= 100
    assert children.processes == []  # plain text needs no reader process
