"""The Bot API's wire format for ``FakeTelegramServer``: calls in, answers out.

PTB sends urlencoded fields with JSON-encoded values (a few plain strings),
JSON bodies, or multipart uploads (``InputFile``, ``attach://`` references);
``read_params`` decodes all three. Answers are ``{"ok": true, "result": ...}``
or Telegram's error body (``error_response``), JSON with non-ASCII escaped.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import Request
from starlette.responses import JSONResponse

from tests.fakes.telegram_types import ApiError, UploadedFile

__all__ = ["BotApiResponse", "error_response", "read_params"]

# Values PTB sends as plain strings; everything else is JSON-encoded.
_STRING_FIELDS = frozenset(
    {"text", "parse_mode", "action", "url", "secret_token", "caption", "ip_address"}
)


class BotApiResponse(JSONResponse):
    """JSON with non-ASCII escaped: the same JSON, and a lone surrogate can travel ("\\ud800")."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_response(exc: ApiError) -> JSONResponse:
    """Telegram's error body (``ok: false``, ``error_code``, ``parameters``) for ``exc``."""
    body: dict[str, Any] = {
        "ok": False,
        "error_code": exc.status,
        "description": exc.description,
    }
    if exc.parameters:
        body["parameters"] = exc.parameters
    return BotApiResponse(body, status_code=exc.status)


async def read_params(request: Request) -> dict[str, Any]:
    """The decoded parameters of a Bot API call, whatever its encoding."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        return await _multipart_params(request)
    body = await request.body()
    if request.headers.get("content-type", "").startswith("application/json"):
        data = json.loads(body or b"{}")
        return dict(data) if isinstance(data, dict) else {}
    params: dict[str, Any] = {}
    for key, value in parse_qsl(body.decode("utf-8"), keep_blank_values=True):
        if key in _STRING_FIELDS:
            params[key] = value
            continue
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


async def _multipart_params(request: Request) -> dict[str, Any]:
    """The fields of a file upload; file parts become ``UploadedFile`` (``attach://`` too)."""
    params: dict[str, Any] = {}
    uploads: dict[str, UploadedFile] = {}
    async with request.form() as form:
        for key, value in form.multi_items():
            if isinstance(value, str):
                if key in _STRING_FIELDS:
                    params[key] = value
                    continue
                try:
                    params[key] = json.loads(value)
                except ValueError:
                    params[key] = value
            else:
                data = await value.read()
                uploads[key] = UploadedFile(
                    value.filename or "", data, value.headers.get("content-type")
                )
    for key, value in list(params.items()):
        if isinstance(value, str) and value.startswith("attach://"):
            params[key] = uploads.get(value.removeprefix("attach://"))
    return {**uploads, **params}
