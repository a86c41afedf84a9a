"""``bench/webhook_burst.py``: the raw keep-alive client the realistic benchmark posts with."""

from __future__ import annotations

import asyncio

from bench.webhook_burst import burst, encode_request


async def test_every_request_is_answered_over_kept_alive_connections() -> None:
    connections = 0
    bodies: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                bodies.append(await reader.readexactly(length))
                status = b"403 Forbidden" if bodies[-1] == b"refuse" else b"200 OK"
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/webhooks/telegram"
    sent = [b'{"update_id": %d}' % i for i in range(30)] + [b"refuse"]
    requests = [encode_request(url, body, {"Content-Type": "application/json"}) for body in sent]
    async with server:
        answers = await burst(url, requests, 3)
    assert sorted(bodies) == sorted(sent)
    assert [status for status, _, _ in answers] == [200] * 30 + [403]
    assert all(answered >= started for _, started, answered in answers)
    assert connections == 3  # kept alive: one connection per worker, not per request


async def test_a_refused_connection_is_status_minus_one() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    url = f"http://127.0.0.1:{port}/hook"
    answers = await burst(url, [encode_request(url, b"{}", {})], 1)
    assert [status for status, _, _ in answers] == [-1]
