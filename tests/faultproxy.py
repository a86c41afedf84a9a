"""A TCP proxy on 127.0.0.1 that can go silent, cut every connection, and move.

Put between the bot and PostgreSQL, it plays the network's faults:

- ``silence()``: bytes stop flowing both ways (or only back to the clients, with
  ``replies_only``), connections stay open, new ones are accepted and hang: a
  partition or a frozen server. ``heal()`` lets the held bytes through, as TCP's
  retransmissions would.
- ``cut()``: every connection is reset and new ones are refused (the listening
  socket closes): a restarted server or a dead host that answers with RST.
  ``heal()`` listens again on the same port.
- ``retarget(port)``: new connections go to another server (a moved address
  after a failover); existing ones are cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

__all__ = ["FaultProxy"]


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``127.0.0.1:target_port`` until told otherwise."""

    def __init__(self, target_port: int, *, port: int = 0) -> None:
        self.target_port = target_port
        self._port = port
        self._server: asyncio.Server | None = None
        self._to_server = asyncio.Event()
        self._to_client = asyncio.Event()
        self._to_server.set()
        self._to_client.set()
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.accepted = 0
        """Connections accepted so far (refused ones are not counted)."""

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self._port, reuse_address=True
        )
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aenter__(self) -> FaultProxy:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- faults ---------------------------------------------------------------------

    def silence(self, *, replies_only: bool = False) -> None:
        """Stop forwarding (only the server's replies, with ``replies_only``)."""
        self._to_client.clear()
        if not replies_only:
            self._to_server.clear()

    async def cut(self) -> None:
        """Reset every connection and refuse new ones until ``heal``."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self._reset_all()

    async def heal(self) -> None:
        """Forward again (and listen again after a cut)."""
        self._to_server.set()
        self._to_client.set()
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, "127.0.0.1", self._port, reuse_address=True
            )

    def retarget(self, target_port: int) -> None:
        """Send new connections to ``target_port``; reset the current ones."""
        self.target_port = target_port
        self._reset_all()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self._reset_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- forwarding -------------------------------------------------------------------

    def _reset_all(self) -> None:
        for client, upstream in list(self._pairs):
            for writer in (client, upstream):
                _reset(writer)
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        await self._to_server.wait()  # a silent network: the handshake goes nowhere
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            _reset(writer)
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        for source, sink, gate in (
            (reader, up_writer, self._to_server),
            (up_reader, writer, self._to_client),
        ):
            task = asyncio.create_task(self._pump(source, sink, gate, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        gate: asyncio.Event,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while data := await source.read(65536):
                await gate.wait()
                sink.write(data)
                await sink.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if pair in self._pairs:
                self._pairs.discard(pair)
                for writer in pair:
                    with contextlib.suppress(Exception):
                        writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dead peer's kernel answers."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
