"""Files in for ``FakeTelegramServer``: ``getFile`` and the file download endpoint.

``server.add_file(file_id, data)`` makes ``getFile`` know a file (400 "invalid
file_id" otherwise, 400 "file is too big" past 20 MB, as the Bot API does) and
``GET /file/bot<token>/<file_path>`` serve its bytes; ``server.downloads``
records them. ``server.file_size_known = False`` drops the optional
``file_size`` from ``getFile``, and ``server.download_stall_after`` holds a
download after that many bytes (a huge file) until ``release_hangs``.

The files live on the server; this class only holds the handlers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tests.fakes.telegram_types import ApiError

if TYPE_CHECKING:
    from tests.fakes.telegram_server import FakeTelegramServer

__all__ = ["MAX_DOWNLOAD_BYTES", "TelegramFileMethods"]

MAX_DOWNLOAD_BYTES = 20 * 1024 * 1024
"""The Bot API's limit on files a bot may download."""


class TelegramFileMethods:
    """The fake's file lookups and downloads, over the server's ``files``."""

    def __init__(self, server: FakeTelegramServer) -> None:
        self._server = server

    async def get_file(self, params: dict[str, Any]) -> dict[str, Any]:
        """The ``getFile`` method."""
        server = self._server
        if params.get("_hang"):
            await server._hang()
        file_id = str(params.get("file_id", ""))
        data = server.files.get(file_id)
        if data is None:
            raise ApiError(400, "Bad Request: invalid file_id")
        if len(data) > MAX_DOWNLOAD_BYTES:
            raise ApiError(400, "Bad Request: file is too big")
        answer: dict[str, Any] = {
            "file_id": file_id,
            "file_unique_id": f"u-{file_id}",
            "file_size": len(data),
            "file_path": f"files/{file_id}.bin",
        }
        if not server.file_size_known:
            del answer["file_size"]
        return answer

    async def download(self, request: Request) -> Response:
        """``GET /file/bot<token>/<file_path>``: the file's bytes."""
        server = self._server
        if not server._token_ok(request.path_params["token"]):
            return Response(status_code=401)
        path = request.path_params["path"]
        file_id = path.rsplit("/", 1)[-1].split(".", 1)[0]
        data = server.files.get(file_id)
        if data is None:
            return Response(status_code=404)
        async with server._cond:
            server.downloads.append(path)
            server._cond.notify_all()
        if server.download_stall_after is None:
            server.download_bytes_sent += len(data)
            return Response(data, media_type="application/octet-stream")
        return StreamingResponse(
            self._stalling(data, server.download_stall_after),
            media_type="application/octet-stream",
        )

    async def _stalling(self, data: bytes, stall_after: int) -> AsyncIterator[bytes]:
        server = self._server
        chunk = 64 * 1024
        for start in range(0, len(data), chunk):
            if start >= stall_after:
                await server._hang_release.wait()
            server.download_bytes_sent += len(data[start : start + chunk])
            yield data[start : start + chunk]
