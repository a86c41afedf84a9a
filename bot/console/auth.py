"""Who may use the console: the token, signed session cookies, CSRF tokens, a rate limit.

- The token (``CONSOLE_TOKEN``) is compared in constant time (``hmac.compare_digest``
  of two SHA-256 digests, so its length does not leak either).
- Signing in sets a cookie ``<issued>.<nonce>.<mac>``: HMAC-SHA256 under a key
  derived from the installation secret *and* the token, so changing the token
  signs everyone out, and every process of one installation accepts it.
- Every state-changing request is a POST carrying ``csrf``, an HMAC of the
  cookie's nonce; a request authenticated by ``Authorization: Bearer`` needs none
  (a browser never adds that header by itself).
- Wrong tokens are counted per client address: past ``MAX_FAILURES`` within
  ``FAILURE_WINDOW_SECONDS`` the client is refused (429) until the window passes.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "COOKIE_NAME",
    "FAILURE_WINDOW_SECONDS",
    "MAX_FAILURES",
    "SESSION_SECONDS",
    "ConsoleAuth",
    "Principal",
]

COOKIE_NAME: Final = "chatflow_console"
"""The session cookie (HttpOnly, SameSite=Strict, path ``/console``)."""
SESSION_SECONDS: Final = 12 * 3600
"""How long a sign-in lasts."""
MAX_FAILURES: Final = 10
"""Wrong tokens one client may send per window before it is refused."""
FAILURE_WINDOW_SECONDS: Final = 300.0
"""The window of ``MAX_FAILURES``."""
_MAX_CLIENTS: Final = 10_000  # bounded memory under a spray of addresses


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated request: by session cookie (``session`` set) or by bearer token."""

    session: str | None
    """The cookie's nonce (CSRF tokens derive from it); ``None`` for a bearer request."""

    @property
    def needs_csrf(self) -> bool:
        """Whether a POST must carry the CSRF token (cookie sessions only)."""
        return self.session is not None


class ConsoleAuth:
    """Checks the token, issues and verifies session cookies and CSRF tokens."""

    def __init__(
        self, token: str, secret: bytes, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._token_digest = hashlib.sha256(token.encode("utf-8")).digest()
        self._key = hmac.new(secret, b"chatflow-console|" + self._token_digest, "sha256").digest()
        self._clock = clock
        self._failures: OrderedDict[str, list[float]] = OrderedDict()

    # -- the token -----------------------------------------------------------

    def token_ok(self, candidate: str) -> bool:
        """Constant-time comparison of ``candidate`` with the token."""
        digest = hashlib.sha256(candidate.encode("utf-8", "replace")).digest()
        return hmac.compare_digest(digest, self._token_digest)

    def blocked_for(self, client: str) -> float:
        """Seconds ``client`` must wait before trying a token again (0: it may)."""
        now = self._clock()
        times = [t for t in self._failures.get(client, ()) if now - t < FAILURE_WINDOW_SECONDS]
        if len(times) < MAX_FAILURES:
            return 0.0
        return max(1.0, FAILURE_WINDOW_SECONDS - (now - times[0]))

    def record_failure(self, client: str) -> None:
        """Count a wrong token from ``client``."""
        now = self._clock()
        times = [t for t in self._failures.pop(client, []) if now - t < FAILURE_WINDOW_SECONDS]
        times.append(now)
        self._failures[client] = times[-MAX_FAILURES:]
        while len(self._failures) > _MAX_CLIENTS:
            self._failures.popitem(last=False)

    # -- sessions ------------------------------------------------------------

    def new_session(self) -> str:
        """A fresh signed cookie value."""
        payload = f"{int(self._clock())}.{secrets.token_urlsafe(18)}"
        return f"{payload}.{self._mac(b'session|' + payload.encode())}"

    def session_of(self, cookie: str | None) -> str | None:
        """The nonce of a valid, unexpired cookie value, else ``None``."""
        if not cookie or cookie.count(".") != 2:
            return None
        issued, nonce, mac = cookie.split(".")
        payload = f"{issued}.{nonce}"
        if not hmac.compare_digest(mac, self._mac(b"session|" + payload.encode())):
            return None
        try:
            age = self._clock() - int(issued)
        except ValueError:
            return None
        return nonce if 0 <= age < SESSION_SECONDS else None

    def csrf_for(self, session: str) -> str:
        """The CSRF token of a session (same for the whole sign-in)."""
        return self._mac(b"csrf|" + session.encode())

    def csrf_ok(self, principal: Principal, candidate: str | None) -> bool:
        """Whether a POST from ``principal`` carries its CSRF token (bearer: always)."""
        if principal.session is None:
            return True
        return candidate is not None and hmac.compare_digest(
            candidate, self.csrf_for(principal.session)
        )

    def _mac(self, data: bytes) -> str:
        return hmac.new(self._key, data, "sha256").hexdigest()
