"""A fake WhatsApp Cloud (Graph) API on 127.0.0.1, served by uvicorn in-process.

It answers ``POST /v<version>/<phone_id>/messages`` like Meta does: a send gets
``{"messaging_product":"whatsapp","contacts":[...],"messages":[{"id":"wamid.…"}]}``,
a text body over 4096 characters gets HTTP 400 with error code 100, and a
wrong bearer token gets 401 with code 190. Tests can inject Meta errors by
code and hangs (for client read timeouts). Every request is recorded; sends
and read/typing receipts (``{"status":"read",...}``) are kept apart, and
``await server.wait_for_sent(n)`` waits on a condition, never on a sleep.

Media: ``add_media(media_id, data, mime_type)`` makes ``GET /v<version>/<media id>``
answer Meta's ``{"url", "mime_type", "sha256", "file_size", "id"}`` (an unknown id
gets Meta's 400 with code 100), and the URL, which changes on every lookup like
Meta's short-lived ones, serve the bytes to the bearer token only. An URL that
``expire_media_urls`` expired answers 404. ``media_lookups`` and
``media_downloads`` record both steps. ``media_lookup_url``,
``media_lookup_omits`` and ``media_redirects`` make the lookup point elsewhere,
drop fields, or the download redirect.

Media out: ``POST /v<version>/<phone_id>/media`` (multipart, as pywa's
``upload_media`` sends it) stores the file and answers ``{"id": ...}``; each
upload is recorded in ``uploads`` with the bytes received. An ``image`` or
``document`` message must name an uploaded id (else Meta's 400, code 100);
``media_sent`` pairs each accepted media message with its upload; an ``audio``
message (a voice note: ``"voice": true``) is checked by ``tests.fakes.whatsapp_voice``.

The 24-hour window: ``close_window(recipient)`` makes free-form messages to that
recipient get Meta's 400 with code 131047, as Meta does once the person has been
silent for 24 hours; templates (``"type": "template"``, name, language code and
components checked) are accepted for everyone and recorded in ``templates`` too.
``template_texts(record)`` reads the body parameters of one.

Throughput, opt-in (``enforce_limits``): a message past ``per_second`` accepted
in the last second gets Meta's 130429 "(#130429) Rate limit hit" (no
Retry-After, as Meta); ``limits`` counts what was admitted and refused. Read
and typing receipts are not counted.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import re
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from tests.fakes.send_limits import SendWindows, Window
from tests.fakes.serving import LocalServer
from tests.fakes.whatsapp_interactive import interactive_problem
from tests.fakes.whatsapp_voice import audio_problem
from tests.fakes.whatsapp_webhook import real_wamid

__all__ = [
    "DEFAULT_ERROR_MESSAGES",
    "FakeWhatsAppServer",
    "InjectedError",
    "RecordedRequest",
    "Upload",
]

TEXT_LIMIT = 4096

DEFAULT_ERROR_MESSAGES: dict[int, tuple[int, str]] = {
    100: (400, "(#100) Invalid parameter"),
    4: (400, "(#4) Application request limit reached"),
    80007: (400, "(#80007) Rate limit issues"),
    130429: (400, "(#130429) Rate limit hit"),
    131048: (400, "(#131048) Spam rate limit hit"),
    131056: (400, "(#131056) (Business Account, Consumer Account) pair rate limit hit"),
    131047: (400, "(#131047) Re-engagement message"),
    131026: (400, "(#131026) Message Undeliverable."),
    131000: (500, "(#131000) Something went wrong"),
    190: (401, "Error validating access token: Session has expired"),
}
"""Default ``(HTTP status, message)`` per Meta error code."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the fake received."""

    path: str
    """URL path, e.g. ``/v26.0/123/messages``."""
    json: dict[str, Any]
    """The decoded JSON body (``{}`` if it was not JSON)."""
    authorization: str | None
    """The ``Authorization`` header as sent."""
    headers: dict[str, str] = field(default_factory=dict)
    """All request headers (lower-case names)."""
    message_id: str | None = None
    """The wamid the server answered an accepted message with (``sent``)."""


@dataclass(frozen=True, slots=True)
class Upload:
    """One file uploaded to ``/<phone_id>/media``."""

    media_id: str
    """The id answered."""
    data: bytes = field(repr=False)
    """The bytes received."""
    mime_type: str
    """The ``type`` field (pywa sends the MIME type)."""
    filename: str
    """The file part's name."""


@dataclass(frozen=True, slots=True)
class InjectedError:
    """An error the next send(s) will get instead of success."""

    code: int
    """Meta error code."""
    status: int
    """HTTP status."""
    message: str
    """``error.message``."""
    subcode: int | None = None
    """``error.error_subcode``."""
    retry_after: float | None = None
    """Value of a ``Retry-After`` header, if any."""


class FakeWhatsAppServer:
    """Fake Graph API. Use ``async with FakeWhatsAppServer(...) as server``."""

    def __init__(
        self,
        *,
        phone_id: str = "106540352242922",
        token: str | None = "test-token",
        api_version: str | None = None,
    ) -> None:
        self.phone_id = phone_id
        """Only ``/<this>/messages`` is served."""
        self.token = token
        """Expected bearer token (``None``: any)."""
        self.api_version = api_version
        """Expected ``v<version>`` path part (``None``: any)."""
        self.requests: list[RecordedRequest] = []
        """Every request, in arrival order."""
        self.sent: list[RecordedRequest] = []
        """Accepted message sends."""
        self.reads: list[RecordedRequest] = []
        """Mark-as-read / typing requests (``{"status":"read",...}``)."""
        self.rejected: list[RecordedRequest] = []
        """Requests answered with an error."""
        self.hung: list[RecordedRequest] = []
        """Requests held open by ``inject_hang``."""
        self.templates: list[RecordedRequest] = []
        """Accepted template messages (also in ``sent``)."""
        self.closed_windows: set[str] = set()
        """Recipients whose 24-hour window is closed: free-form text gets 131047."""
        self.sent_wamids: list[str] = []
        """The wamid answered to each entry of ``sent``, in the same order."""
        self.on_send: Callable[[RecordedRequest], None] | None = None
        """Called with each accepted (or held) send once it is recorded, before the answer."""
        self.limits: SendWindows | None = None
        """The number's throughput once ``enforce_limits`` was called, with its counters."""
        self.port = 0
        self._errors: deque[InjectedError] = deque()
        self._hangs = 0
        self._release = asyncio.Event()
        self._changed = asyncio.Condition()
        self._local: LocalServer | None = None
        self.media: dict[str, tuple[bytes, str]] = {}
        """``media id -> (bytes, MIME type)`` served by the media routes (``add_media``)."""
        self.media_lookups: list[str] = []
        """Media ids looked up, in order."""
        self.media_downloads: list[str] = []
        """Media ids whose bytes were downloaded, in order."""
        self._media_urls: dict[str, str] = {}
        self.media_lookup_url: dict[str, str] = {}
        """``media id -> URL`` the lookup names instead of this server's own download URL
        (a proxy in the middle, or a changed answer from Meta)."""
        self.media_lookup_omits: set[str] = set()
        """Fields left out of every lookup answer (``sha256``...)."""
        self.media_redirects: dict[str, str] = {}
        """``media id -> URL`` the download answers with a 302 to, instead of the bytes."""
        self.uploads: list[Upload] = []
        """Files uploaded to ``/<phone_id>/media``, in order."""
        self.media_sent: list[tuple[RecordedRequest, Upload]] = []
        """Accepted image/document messages with the upload each names."""
        self._media_serial = itertools.count(1)
        self.app = Starlette(
            routes=[
                Route("/{version}/{phone_id}/messages", self._messages, methods=["POST"]),
                Route("/{version}/{phone_id}/media", self._upload, methods=["POST"]),
                Route("/media-download/{token}", self._media_bytes, methods=["GET"]),
                Route("/{version}/{media_id}", self._media_url, methods=["GET"]),
            ]
        )

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``, the adapter's ``api_base_url``."""
        return f"http://127.0.0.1:{self.port}"

    # -- control ---------------------------------------------------------------------------

    def inject_error(
        self,
        code: int,
        *,
        times: int = 1,
        status: int | None = None,
        message: str | None = None,
        subcode: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        """Make the next ``times`` sends fail with Meta error ``code``."""
        default_status, default_message = DEFAULT_ERROR_MESSAGES.get(
            code, (400, f"(#{code}) Error")
        )
        error = InjectedError(
            code=code,
            status=status if status is not None else default_status,
            message=message if message is not None else default_message,
            subcode=subcode,
            retry_after=retry_after,
        )
        self._errors.extend([error] * times)

    def close_window(self, recipient: str) -> None:
        """Answer free-form messages to ``recipient`` with 131047 from now on."""
        self.closed_windows.add(recipient)

    @staticmethod
    def template_texts(record: RecordedRequest) -> list[str]:
        """The body parameters' texts of a template message, in order."""
        components = record.json["template"].get("components", [])
        return [
            parameter["text"]
            for component in components
            if str(component.get("type", "")).lower() == "body"
            for parameter in component.get("parameters", [])
        ]

    def enforce_limits(self, per_second: int = 80) -> SendWindows:
        """Refuse messages past ``per_second`` in any second with 130429 from now on."""
        self.limits = SendWindows(Window(per_second, 1.0))
        return self.limits

    def inject_hang(self, times: int = 1) -> None:
        """Hold the next ``times`` sends open until ``release_hangs`` or ``stop``."""
        self._hangs += times

    def release_hangs(self) -> None:
        """Let held requests finish (they then answer 200)."""
        self._release.set()

    async def wait_for_sent(self, n: int, within: float = 5.0) -> list[RecordedRequest]:
        """Wait until at least ``n`` sends were accepted; return them all."""
        await self._wait(lambda: len(self.sent) >= n, within)
        return list(self.sent)

    async def wait_for_reads(self, n: int, within: float = 5.0) -> list[RecordedRequest]:
        """Wait until at least ``n`` read/typing requests arrived; return them all."""
        await self._wait(lambda: len(self.reads) >= n, within)
        return list(self.reads)

    async def wait_for_hung(self, n: int, within: float = 5.0) -> list[RecordedRequest]:
        """Wait until at least ``n`` sends are being held open by ``inject_hang``."""
        await self._wait(lambda: len(self.hung) >= n, within)
        return list(self.hung)

    async def wait_for_requests(self, n: int, within: float = 5.0) -> list[RecordedRequest]:
        """Wait until at least ``n`` requests of any kind arrived."""
        await self._wait(lambda: len(self.requests) >= n, within)
        return list(self.requests)

    async def _wait(self, predicate: Callable[[], bool], within: float) -> None:
        async with asyncio.timeout(within), self._changed:
            await self._changed.wait_for(predicate)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen on a free 127.0.0.1 port; return once it accepts connections."""
        self._local = LocalServer(self.app)
        self.port = await self._local.start()

    async def stop(self) -> None:
        """Release held requests and shut the server down."""
        self._release.set()
        local, self._local = self._local, None
        if local is not None:
            await local.stop()

    async def __aenter__(self) -> FakeWhatsAppServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- the endpoint ----------------------------------------------------------------------

    def add_media(self, media_id: str, data: bytes, mime_type: str) -> None:
        """Serve ``data`` as the media ``media_id``."""
        self.media[media_id] = (data, mime_type)

    def expire_media_urls(self) -> None:
        """Make every download URL handed out so far answer 404 (they last minutes)."""
        self._media_urls.clear()

    def _authorised(self, request: Request) -> bool:
        return self.token is None or request.headers.get("authorization") == f"Bearer {self.token}"

    async def _media_url(self, request: Request) -> Response:
        if not self._authorised(request):
            return _error(401, 190, DEFAULT_ERROR_MESSAGES[190][1])
        media_id = request.path_params["media_id"]
        async with self._changed:
            self.media_lookups.append(media_id)
            self._changed.notify_all()
        found = self.media.get(media_id)
        if found is None:
            return _error(400, 100, "(#100) Invalid parameter", subcode=33)
        data, mime_type = found
        url_token = f"{next(self._media_serial)}-{secrets.token_hex(4)}"
        self._media_urls[url_token] = media_id
        answer = {
            "messaging_product": "whatsapp",
            "url": self.media_lookup_url.get(
                media_id, f"{self.base_url}/media-download/{url_token}"
            ),
            "mime_type": mime_type,
            "sha256": base64.b64encode(hashlib.sha256(data).digest()).decode(),
            "file_size": len(data),
            "id": media_id,
        }
        for name in self.media_lookup_omits:
            answer.pop(name, None)
        return JSONResponse(answer)

    async def _media_bytes(self, request: Request) -> Response:
        if not self._authorised(request):
            return Response(status_code=401)
        media_id = self._media_urls.get(request.path_params["token"])
        if media_id is None or media_id not in self.media:
            return Response(status_code=404)
        data, mime_type = self.media[media_id]
        if media_id in self.media_redirects:
            return RedirectResponse(self.media_redirects[media_id], status_code=302)
        async with self._changed:
            self.media_downloads.append(media_id)
            self._changed.notify_all()
        return Response(data, media_type=mime_type)

    async def _upload(self, request: Request) -> Response:
        if not self._authorised(request):
            return _error(401, 190, DEFAULT_ERROR_MESSAGES[190][1])
        if request.path_params["phone_id"] != self.phone_id:
            return _error(400, 100, "Unsupported post request. Object does not exist", subcode=33)
        async with request.form() as form:
            file = form.get("file")
            mime_type = form.get("type")
            if form.get("messaging_product") != "whatsapp" or isinstance(file, str) or not file:
                return _error(400, 100, "(#100) The parameter file is required.")
            data = await file.read()
        if not data or not isinstance(mime_type, str):
            return _error(400, 100, "(#100) Param file must be a file with one of the types")
        upload = Upload(f"up-{next(self._media_serial)}", data, mime_type, file.filename or "")
        async with self._changed:
            self.uploads.append(upload)
            self._changed.notify_all()
        return JSONResponse({"id": upload.media_id})

    def _uploaded(self, body: dict[str, Any]) -> Upload | None:
        kind = body.get("type")
        media = body.get(kind) if kind in ("image", "document", "audio") else None
        media_id = media.get("id") if isinstance(media, dict) else None
        return next((u for u in self.uploads if u.media_id == media_id), None)

    async def wait_for_media_sent(
        self, n: int, within: float = 5.0
    ) -> list[tuple[RecordedRequest, Upload]]:
        """Wait until at least ``n`` image/document messages were accepted."""
        await self._wait(lambda: len(self.media_sent) >= n, within)
        return list(self.media_sent)

    async def _record(self, bucket: list[RecordedRequest], record: RecordedRequest) -> None:
        async with self._changed:
            self.requests.append(record)
            bucket.append(record)
            self._changed.notify_all()

    async def _messages(self, request: Request) -> Response:
        raw = await request.body()
        try:
            body = await request.json() if raw else {}
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        record = RecordedRequest(
            path=request.url.path,
            json=body,
            authorization=request.headers.get("authorization"),
            headers=dict(request.headers),
        )
        version = request.path_params["version"]
        if not re.fullmatch(r"v\d+\.\d+", version) or (
            self.api_version is not None and version != f"v{self.api_version}"
        ):
            await self._record(self.rejected, record)
            return _error(400, 2500, "Unknown path components", type_="OAuthException")
        if self.token is not None and record.authorization != f"Bearer {self.token}":
            await self._record(self.rejected, record)
            return _error(401, 190, "Invalid OAuth access token - Cannot parse access token")
        if request.path_params["phone_id"] != self.phone_id:
            await self._record(self.rejected, record)
            return _error(400, 100, "Unsupported post request. Object does not exist", subcode=33)

        if body.get("status") == "read":
            await self._record(self.reads, record)
            if not body.get("message_id"):
                return _error(400, 100, "(#100) The parameter message_id is required.")
            return JSONResponse({"success": True})

        invalid = _validate_send(body)
        upload = self._uploaded(body)
        if body.get("type") in ("image", "document") and upload is None:
            invalid = "(#100) Invalid parameter: the media id is not an uploaded media"
        if body.get("type") == "audio":
            invalid = invalid or audio_problem(body, upload)  # tests.fakes.whatsapp_voice
        if body.get("type") == "interactive":
            invalid = invalid or interactive_problem(body)  # tests.fakes.whatsapp_interactive
        if invalid is not None:
            await self._record(self.rejected, record)
            return _error(400, 100, invalid, subcode=2494010)
        if self.limits is not None and self.limits.check(str(body.get("to")), group=False):
            await self._record(self.rejected, record)
            return _error(400, 130429, DEFAULT_ERROR_MESSAGES[130429][1])
        if body.get("type") != "template" and str(body.get("to")) in self.closed_windows:
            await self._record(self.rejected, record)
            return _error(400, 131047, DEFAULT_ERROR_MESSAGES[131047][1])
        if self._errors:
            error = self._errors.popleft()
            await self._record(self.rejected, record)
            headers = (
                {"Retry-After": f"{error.retry_after:g}"} if error.retry_after is not None else None
            )
            return _error(
                error.status, error.code, error.message, subcode=error.subcode, headers=headers
            )
        if self._hangs > 0:
            self._hangs -= 1
            await self._record(self.hung, record)
            self._notify_send(record)
            await self._release.wait()
            return _sent_response(body)
        response = _sent_response(body)
        wamid = json.loads(bytes(response.body))["messages"][0]["id"]
        self.sent_wamids.append(wamid)
        record = replace(record, message_id=wamid)
        if upload is not None:
            self.media_sent.append((record, upload))
        if body.get("type") == "template":
            self.templates.append(record)
        await self._record(self.sent, record)
        self._notify_send(record)
        return response

    def _notify_send(self, record: RecordedRequest) -> None:
        if self.on_send is not None:
            self.on_send(record)


def _validate_send(body: dict[str, Any]) -> str | None:
    if body.get("messaging_product") != "whatsapp":
        return "(#100) The parameter messaging_product is required."
    if not body.get("to") and not body.get("recipient"):
        return "(#100) The parameter to is required."
    if body.get("recipient_type", "individual") not in ("individual", "group"):
        return "(#100) Invalid parameter recipient_type"
    if body.get("type", "text") == "text":
        text = body.get("text")
        if not isinstance(text, dict) or not isinstance(text.get("body"), str):
            return "(#100) The parameter text['body'] is required."
        if not text["body"].strip():
            return "(#100) Param text['body'] must be non-empty."
        if len(text["body"]) > TEXT_LIMIT:
            return f"(#100) Param text['body'] must be at most {TEXT_LIMIT} characters long."
    if body.get("type") == "template":
        problem = _validate_template(body.get("template"))
        if problem is not None:
            return problem
    context = body.get("context")
    if context is not None and not (isinstance(context, dict) and context.get("message_id")):
        return "(#100) Invalid parameter context"
    return None


def _validate_template(template: object) -> str | None:
    if not isinstance(template, dict) or not template.get("name"):
        return "(#100) The parameter template['name'] is required."
    language = template.get("language")
    if not isinstance(language, dict) or not language.get("code"):
        return "(#100) The parameter template['language']['code'] is required."
    for component in template.get("components", []):
        if not isinstance(component, dict) or not component.get("type"):
            return "(#100) Invalid parameter template['components']"
        for parameter in component.get("parameters", []):
            if not isinstance(parameter, dict):
                return "(#100) Invalid parameter template['components']"
            text = parameter.get("text")
            if parameter.get("type") == "text" and not (isinstance(text, str) and text.strip()):
                return "(#100) Invalid parameter: a text parameter must be non-empty."
            if isinstance(text, str) and ("\n" in text or "\t" in text or "     " in text):
                # Meta refuses newlines, tabs and more than four spaces in a row in parameters.
                return "(#100) Param text cannot have new-line/tab characters or more than 4 spaces"
    return None


def _sent_response(body: dict[str, Any]) -> JSONResponse:
    recipient = str(body.get("to") or body.get("recipient"))
    wamid = real_wamid(recipient)
    return JSONResponse(
        {
            "messaging_product": "whatsapp",
            "contacts": [{"input": recipient, "wa_id": recipient}],
            "messages": [{"id": wamid}],
        }
    )


def _error(
    status: int,
    code: int,
    message: str,
    *,
    subcode: int | None = None,
    type_: str = "OAuthException",
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    error: dict[str, Any] = {
        "message": message,
        "type": type_,
        "code": code,
        "fbtrace_id": "A" + secrets.token_hex(10),
    }
    if subcode is not None:
        error["error_subcode"] = subcode
    return JSONResponse({"error": error}, status_code=status, headers=headers)
