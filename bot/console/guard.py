"""The door of every console route: authentication, CSRF, the form body, headers.

A signed-out browser asking for a page is redirected to the sign-in form; any
other signed-out request (a stream, a fragment, a POST, a wrong bearer token)
gets 401 and no data; a wrong token from a client that sent too many gets 429
(the right one is always let in). A cookie counts only while its session is in
the server-side record (``ConsoleSessions``): signed out means refused. A POST
of a cookie session without its CSRF token gets 403.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Final
from urllib.parse import parse_qsl, quote

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from bot.console.auth import COOKIE_NAME, SESSION_SECONDS, ConsoleAuth, Principal
from bot.console.sessions import ConsoleSessions

__all__ = ["MAX_FORM_BYTES", "SECURITY_HEADERS", "Endpoint", "Guard", "Handler", "client_of"]

MAX_FORM_BYTES: Final = 64 * 1024
"""Largest POST body read (a reply is at most 16,000 characters)."""
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
"""Headers on every console response."""

Handler = Callable[[Request, Principal, Mapping[str, str]], Awaitable[Response]]
"""A console handler: the request, who sent it, and its form fields (POST)."""
Endpoint = Callable[[Request], Awaitable[Response]]
"""What Starlette calls."""


def client_of(request: Request) -> str:
    """The client address the throttle counts against (behind a proxy that
    ``FORWARDED_ALLOW_IPS`` trusts, uvicorn has put the real client's here)."""
    return request.client.host if request.client is not None else "?"


def secure(response: Response) -> Response:
    """``response`` with ``SECURITY_HEADERS``."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


async def read_form(request: Request) -> dict[str, str] | None:
    """The urlencoded form of a POST (``None`` when too big or not a form)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/x-www-form-urlencoded", ""):
        return None
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return dict(parse_qsl(text, keep_blank_values=True))


class Guard:
    """Wraps handlers with the console's authentication rules."""

    def __init__(self, auth: ConsoleAuth, prefix: str, sessions: ConsoleSessions) -> None:
        self.auth = auth
        self.prefix = prefix
        self.sessions = sessions

    async def principal(self, request: Request) -> Principal | Response | None:
        """Who sent ``request``; a refusal for a wrong bearer token; ``None`` if signed out."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":  # other schemes (a proxy's Basic) are not ours
            check = self.auth.check(token.strip(), client_of(request))
            if check.ok:
                return Principal(session=None)
            return _too_many(check.retry_after) if check.retry_after else _unauthorized()
        session = self.auth.session_of(request.cookies.get(COOKIE_NAME))
        if session is None or not await self.sessions.active(session):
            return None
        return Principal(session=session)

    async def sign_in(self) -> str:
        """A new session, recorded server-side; returns its cookie value."""
        cookie, session = self.auth.new_session()
        await self.sessions.add(session, SESSION_SECONDS)
        return cookie

    async def sign_out(self, who: Principal) -> None:
        """End ``who``'s session server-side (a bearer request has none)."""
        if who.session is not None:
            await self.sessions.revoke(who.session)

    def wrap(self, handler: Handler, *, page: bool = False) -> Endpoint:
        """The endpoint for ``handler``; ``page``: a GET a browser navigates to."""

        async def endpoint(request: Request) -> Response:
            who = await self.principal(request)
            if isinstance(who, Response):
                return secure(who)
            if who is None:
                if page and request.method == "GET":
                    target = quote(request.url.path, safe="/")
                    return secure(
                        RedirectResponse(f"{self.prefix}/login?next={target}", status_code=303)
                    )
                return secure(_unauthorized())
            form: Mapping[str, str] = {}
            if request.method == "POST":
                parsed = await read_form(request)
                if parsed is None:
                    return secure(PlainTextResponse("a small urlencoded form", status_code=400))
                if not self.auth.csrf_ok(who, parsed.get("csrf")):
                    return secure(PlainTextResponse("missing or wrong CSRF token", status_code=403))
                form = parsed
            return secure(await handler(request, who, form))

        return endpoint


def _unauthorized() -> Response:
    return PlainTextResponse(
        "sign in to the console", status_code=401, headers={"WWW-Authenticate": "Bearer"}
    )


def _too_many(wait: float) -> Response:
    return PlainTextResponse(
        "too many wrong tokens; try again later",
        status_code=429,
        headers={"Retry-After": str(int(wait) + 1)},
    )
