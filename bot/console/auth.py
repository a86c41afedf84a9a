"""Who may use the console: the token, signed session cookies, CSRF tokens, a rate limit.

- The token (``CONSOLE_TOKEN``) is compared in constant time (``hmac.compare_digest``
  of two SHA-256 digests, so its length does not leak either).
- Signing in sets a cookie ``<issued>.<nonce>.<mac>``: HMAC-SHA256 under a key
  derived from the installation secret *and* the token, so changing the token
  signs everyone out, and every process of one installation accepts it.
- Every state-changing request is a POST carrying ``csrf``, an HMAC of the
  cookie's nonce; a request authenticated by ``Authorization: Bearer`` needs none
  (a browser never adds that header by itself).
- Sessions are also recorded server-side (``bot.console.sessions``): signing out
  ends one for good, whoever still holds its cookie.
- Wrong tokens are throttled, the right one never is: a candidate is compared
  first, and only a wrong one counts. Past ``MAX_FAILURES`` wrong tokens from one
  client address (the real client's, behind a proxy ``FORWARDED_ALLOW_IPS``
  trusts), or ``GLOBAL_MAX_FAILURES`` from everyone, within
  ``FAILURE_WINDOW_SECONDS``, wrong tokens get 429 and a ``Retry-After``. Refusing
  the right token too would let anyone sharing the operator's address (every
  user of a proxy that is not trusted) lock the operator out; guessing is made
  hopeless by the token's length (``CONSOLE_TOKEN_MIN_LENGTH``), and the throttle
  tells clients to back off and makes a guessing run visible in the log.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "COOKIE_NAME",
    "FAILURE_WINDOW_SECONDS",
    "GLOBAL_MAX_FAILURES",
    "MAX_FAILURES",
    "SESSION_SECONDS",
    "ConsoleAuth",
    "Principal",
    "TokenCheck",
]

logger = logging.getLogger(__name__)

COOKIE_NAME: Final = "chatflow_console"
"""The session cookie (HttpOnly, SameSite=Strict, path ``/console``)."""
SESSION_SECONDS: Final = 12 * 3600
"""How long a sign-in lasts."""
MAX_FAILURES: Final = 10
"""Wrong tokens one client may send per window before its wrong tokens get 429."""
GLOBAL_MAX_FAILURES: Final = 100
"""Wrong tokens all clients together may send per window (a spray from many addresses)."""
FAILURE_WINDOW_SECONDS: Final = 300.0
"""The window of ``MAX_FAILURES`` and ``GLOBAL_MAX_FAILURES``."""
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


@dataclass(frozen=True, slots=True)
class TokenCheck:
    """The verdict on a presented token."""

    ok: bool
    """The right token (always accepted, throttled or not)."""
    retry_after: float = 0.0
    """A wrong token while throttled: seconds until the throttle lifts (answer 429)."""


class ConsoleAuth:
    """Checks the token, issues and verifies session cookies and CSRF tokens."""

    def __init__(
        self, token: str, secret: bytes, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._token_digest = hashlib.sha256(token.encode("utf-8")).digest()
        self._key = hmac.new(secret, b"chatflow-console|" + self._token_digest, "sha256").digest()
        self._clock = clock
        self._failures: OrderedDict[str, list[float]] = OrderedDict()
        self._all_failures: deque[float] = deque(maxlen=GLOBAL_MAX_FAILURES)
        self._throttle_logged_at = float("-inf")

    # -- the token -----------------------------------------------------------

    def token_ok(self, candidate: str) -> bool:
        """Constant-time comparison of ``candidate`` with the token."""
        digest = hashlib.sha256(candidate.encode("utf-8", "replace")).digest()
        return hmac.compare_digest(digest, self._token_digest)

    def check(self, candidate: str, client: str) -> TokenCheck:
        """Judge ``candidate`` sent by ``client`` (its address): the right token is
        always accepted; a wrong one is counted, and throttled past the limits."""
        if self.token_ok(candidate):
            return TokenCheck(ok=True)
        now = self._clock()
        wait = self._throttled_for(client, now)
        self._record_failure(client, now)
        if wait and now - self._throttle_logged_at >= FAILURE_WINDOW_SECONDS:
            # Once per window: a guessing run must not flood the log.
            self._throttle_logged_at = now
            logger.warning(
                "console: more than %d wrong tokens from one client or %d in all within %d s; "
                "answering wrong tokens 429 (the right one still signs in)",
                MAX_FAILURES,
                GLOBAL_MAX_FAILURES,
                int(FAILURE_WINDOW_SECONDS),
            )
        return TokenCheck(ok=False, retry_after=wait)

    def _throttled_for(self, client: str, now: float) -> float:
        """Seconds until wrong tokens from ``client`` stop being throttled (0: not now)."""

        def wait(times: Iterable[float], limit: int) -> float:
            recent = [t for t in times if now - t < FAILURE_WINDOW_SECONDS]
            if len(recent) < limit:
                return 0.0
            # Until the oldest of the last ``limit`` failures leaves the window.
            return max(1.0, FAILURE_WINDOW_SECONDS - (now - recent[-limit]))

        return max(
            wait(self._failures.get(client, ()), MAX_FAILURES),
            wait(self._all_failures, GLOBAL_MAX_FAILURES),
        )

    def _record_failure(self, client: str, now: float) -> None:
        times = [t for t in self._failures.pop(client, []) if now - t < FAILURE_WINDOW_SECONDS]
        times.append(now)
        self._failures[client] = times[-MAX_FAILURES:]
        while len(self._failures) > _MAX_CLIENTS:
            self._failures.popitem(last=False)
        self._all_failures.append(now)

    # -- sessions ------------------------------------------------------------

    def new_session(self) -> tuple[str, str]:
        """A fresh signed cookie value, and its session id (the nonce ``session_of`` gives)."""
        nonce = secrets.token_urlsafe(18)
        payload = f"{int(self._clock())}.{nonce}"
        return f"{payload}.{self._mac(b'session|' + payload.encode())}", nonce

    def session_of(self, cookie: str | None) -> str | None:
        """The nonce of a validly signed, unexpired cookie value, else ``None`` (whether
        it was signed out is the server-side record's to say: ``ConsoleSessions``)."""
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
