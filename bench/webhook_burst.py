"""A webhook burst from its own process: raw HTTP/1.1 over keep-alive connections.

Telegram and Meta post webhooks from servers that are never short of CPU, so
the time a webhook waits for its answer is the bot's doing alone. A load
generator sharing a core and an event loop with the fake model and platform
servers (an ``httpx`` client costs ~1.5 ms of CPU per request) would add its
own loop lag to every figure, so the requests are encoded beforehand and
posted from a child process by a client that does next to nothing per request.

``burst(url, requests, connections)`` returns, per request, its HTTP status
(``-1``: the connection failed) and when it was sent and answered
(``time.monotonic()``, which is the same clock in every process on Linux).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

__all__ = ["Answer", "burst", "encode_request"]

Answer = tuple[int, float, float]
"""(status, sent at, answered at)."""


def encode_request(url: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """One keep-alive ``POST`` of ``body`` to ``url`` as it goes on the wire."""
    parts = urlsplit(url)
    lines = [
        f"POST {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.netloc}",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _read_answer(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length:
        await reader.readexactly(length)
    return status


async def _post_all(
    host: str, port: int, requests: Sequence[bytes], connections: int
) -> list[Answer]:
    answers: list[Answer | None] = [None] * len(requests)
    order = iter(range(len(requests)))
    loop = asyncio.get_running_loop()

    async def connection() -> None:
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        for index in order:
            sent = loop.time()
            try:
                if writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                assert reader is not None
                writer.write(requests[index])
                status = await _read_answer(reader)
            except (OSError, asyncio.IncompleteReadError, ValueError):
                status = -1
                if writer is not None:
                    writer.close()
                reader = writer = None
            answers[index] = (status, sent, loop.time())
        if writer is not None:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(connections)))
    return [answer for answer in answers if answer is not None]


def _child(host: str, port: int, requests: Sequence[bytes], connections: int) -> list[Answer]:
    return asyncio.run(_post_all(host, port, requests, connections))


async def burst(url: str, requests: Sequence[bytes], connections: int) -> list[Answer]:
    """Post every encoded request through ``connections`` connections, from a child process."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    context = multiprocessing.get_context("spawn")  # no copy of this process's loop or threads
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        # Start the child before the clock matters: an interpreter's start-up is not load.
        await asyncio.get_running_loop().run_in_executor(pool, int, "0")
        return await asyncio.get_running_loop().run_in_executor(
            pool, _child, parts.hostname, parts.port, list(requests), connections
        )
