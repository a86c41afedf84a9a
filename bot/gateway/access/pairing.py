"""Pairing codes: a stranger asks, the operator approves, the sender is served from then on.

In ``ACCESS_MODE=pairing`` a DM from an unknown sender is answered with a
one-time code (``secrets``, an alphabet without look-alikes such as 0/O and
1/I/L). The operator runs ``python -m bot pairing approve CODE``; the sender is
then approved in the database, which every process reads: an approval counts
from the sender's next message, and a revocation within ``CACHE_SECONDS`` (the
time ``is_approved`` trusts an approval it read), without a restart.

A sender is told a code once: writing again while it is pending gets no answer
(the stranger, or many of them, cannot spend the bot's send budget); a code
is used once (approving deletes the request) and expires after its TTL.
Senders are stored as ``sender_digest`` (HMAC with the installation secret),
approvals keep an HMAC of the code they used, and no code is ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore, require_transactional
from bot.gateway.access.rate_limits import sender_digest
from bot.gateway.instances import from_epoch, to_epoch
from bot.gateway.keys import parse_person

__all__ = [
    "CACHE_SECONDS",
    "CODE_ALPHABET",
    "CODE_LENGTH",
    "Approval",
    "ApproveOutcome",
    "Pairing",
    "PendingCode",
    "normalize_code",
    "sender_ref",
]

logger = logging.getLogger(__name__)

CODE_ALPHABET: Final = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
"""Upper-case letters and digits without 0/O, 1/I/L: read aloud or retyped without doubt."""
CODE_LENGTH: Final = 8
"""31**8 (about 2**40) codes: unguessable while one is pending."""
CACHE_SECONDS: Final = 2.0
"""How long ``is_approved`` trusts an approval it read (so a revocation takes this long)."""
_CACHE_SIZE = 4096
_SHOWN_SENDER = re.compile(r"user_[0-9a-f]{12}")

_COMPONENT = "pairing"
_REQUESTS = "chatflow_pairing_requests"
_APPROVALS = "chatflow_pairing_approvals"
_MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {_REQUESTS} ("
        "platform TEXT NOT NULL, "
        "sender TEXT NOT NULL, "
        "code TEXT NOT NULL UNIQUE, "
        "created_at REAL NOT NULL, "
        "expires_at REAL NOT NULL, "
        "PRIMARY KEY (platform, sender))",
        f"CREATE TABLE IF NOT EXISTS {_APPROVALS} ("
        "platform TEXT NOT NULL, "
        "sender TEXT NOT NULL, "
        "code_hash TEXT NOT NULL, "
        "approved_at REAL NOT NULL, "
        "PRIMARY KEY (platform, sender))",
        f"CREATE INDEX IF NOT EXISTS {_APPROVALS}_code ON {_APPROVALS} (code_hash)",
    ),
}

ApproveOutcome = Literal["approved", "unknown", "expired"]


def normalize_code(text: str) -> str:
    """A code as typed (spaces, dashes, lower case) in its stored form."""
    return "".join(ch for ch in text.upper() if ch.isalnum())


def sender_ref(platform: str, sender: str) -> str:
    """How the CLI shows a stored sender: ``<platform>:user_<12 hex>`` (no raw id)."""
    return f"{platform}:user_{sender[:12]}"


@dataclass(frozen=True, slots=True)
class PendingCode:
    """A code waiting for the operator."""

    platform: str
    sender: str
    """``sender_digest`` of the requester."""
    code: str
    created_at: datetime
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Approval:
    """A sender the operator let in."""

    platform: str
    sender: str
    """``sender_digest`` of the approved sender."""
    approved_at: datetime


class Pairing:
    """Pairing requests and approvals in the store's database."""

    def __init__(
        self,
        store: TransactionalStore,
        *,
        secret: bytes,
        ttl_seconds: float = 86400.0,
        clock: Callable[[], datetime] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store = require_transactional(store, "pairing")
        self._secret = secret
        self.ttl_seconds = ttl_seconds
        self._clock = clock or store.now
        self._monotonic = monotonic
        self._opened = False
        self._next_prune = 0.0
        # (platform, sender id) -> when an approval was last read. Only approvals are
        # cached, for CACHE_SECONDS: a new approval counts at once, a revocation soon.
        self._cache: dict[tuple[str, str], float] = {}

    async def open(self) -> None:
        """Create or migrate the tables; idempotent."""
        async with self._store.transaction() as tx:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)
        self._opened = True

    async def _ensure_in(self, tx: Transaction) -> None:
        if not self._opened:
            await ensure_schema(tx, _COMPONENT, _MIGRATIONS)

    def _code_hash(self, code: str) -> str:
        return hmac.new(self._secret, f"code:{code}".encode(), hashlib.sha256).hexdigest()

    # -- the bot's side -----------------------------------------------------------------

    async def is_approved(self, platform: str, sender_id: str) -> bool:
        """Whether the operator approved this sender (at most ``CACHE_SECONDS`` stale)."""
        key = (platform, sender_id)
        now = self._monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached < CACHE_SECONDS:
            return True
        digest = sender_digest(platform, sender_id, self._secret)

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(
                f"SELECT 1 FROM {_APPROVALS} WHERE platform = ? AND sender = ?",
                (platform, digest),
            )

        if not self._opened:
            await self.open()
        if await self._store.run(body, write=False) is None:
            return False  # not cached: an approval counts from the next message on
        if len(self._cache) >= _CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = now
        return True

    async def is_approved_digest(self, platform: str, sender: str) -> bool:
        """Whether the operator approved the sender stored as ``sender`` (a digest), read
        now (the scheduler asks once per job falling due, so no cache)."""

        async def body(tx: Transaction) -> tuple[Any, ...] | None:
            return await tx.fetchone(
                f"SELECT 1 FROM {_APPROVALS} WHERE platform = ? AND sender = ?",
                (platform, sender),
            )

        if not self._opened:
            await self.open()
        return await self._store.run(body, write=False) is not None

    async def request_in(self, tx: Transaction, platform: str, sender_id: str) -> tuple[str, bool]:
        """The sender's pending code inside ``tx`` (the one still valid, else a new one)
        and whether it was issued now: a sender is told a code once per its lifetime."""
        await self._ensure_in(tx)
        now = to_epoch(self._clock())
        if self._monotonic() >= self._next_prune:
            # Strangers who never came back: their expired codes go now and then.
            self._next_prune = self._monotonic() + 3600.0
            await tx.execute(f"DELETE FROM {_REQUESTS} WHERE expires_at <= ?", (now,))
        sender = sender_digest(platform, sender_id, self._secret)
        code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
        # A valid pending code is kept (the WHERE), so a sender asking again, even in
        # another process at the same moment, is given the one code stored.
        await tx.execute(
            f"INSERT INTO {_REQUESTS} (platform, sender, code, created_at, expires_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT(platform, sender) DO UPDATE SET "
            "code = excluded.code, created_at = excluded.created_at, "
            f"expires_at = excluded.expires_at WHERE {_REQUESTS}.expires_at <= ?",
            (platform, sender, code, now, now + self.ttl_seconds, now),
        )
        row = await tx.fetchone(
            f"SELECT code FROM {_REQUESTS} WHERE platform = ? AND sender = ?", (platform, sender)
        )
        assert row is not None  # written or kept just above, in this transaction
        issued = str(row[0]) == code
        if issued:
            logger.info("pairing code issued to %s", sender_ref(platform, sender))
        return str(row[0]), issued

    # -- the operator's side ------------------------------------------------------------

    async def approve(self, code: str) -> tuple[ApproveOutcome, str | None]:
        """Approve the sender holding ``code``; ``(outcome, sender_ref or None)``.

        The code is used up by the approval; an expired one is deleted.
        """
        code = normalize_code(code)
        now = to_epoch(self._clock())
        async with self._store.transaction() as tx:
            await self._ensure_in(tx)
            row = await tx.fetchone(
                f"SELECT platform, sender, expires_at FROM {_REQUESTS} WHERE code = ?", (code,)
            )
            if row is None:
                return "unknown", None
            platform, sender, expires_at = str(row[0]), str(row[1]), float(row[2])
            await tx.execute(f"DELETE FROM {_REQUESTS} WHERE code = ?", (code,))
            if expires_at <= now:
                return "expired", None
            await tx.execute(
                f"INSERT INTO {_APPROVALS} (platform, sender, code_hash, approved_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT(platform, sender) DO UPDATE SET "
                "code_hash = excluded.code_hash, approved_at = excluded.approved_at",
                (platform, sender, self._code_hash(code), now),
            )
        self._cache.clear()  # this process sees its own approval at once
        ref = sender_ref(platform, sender)
        logger.info("pairing approved for %s", ref)
        return "approved", ref

    async def revoke(self, target: str) -> int:
        """Withdraw an approval (and any pending code) by code, ``<platform>:<user id>``
        or ``<platform>:user_<12 hex>`` as ``pairing list`` shows it; returns rows removed.

        The revoked senders' scheduled jobs are cancelled in the same transaction: a
        person the operator removed gets no more reminders and costs no more turns.
        """
        from bot.gateway.proactive.jobs import cancel_jobs_in  # only the operator's command

        platform, sep, user = target.partition(":")
        statements: list[tuple[str, tuple[str, ...]]]
        revoked: tuple[str, tuple[str, ...]]
        if not sep:
            code = normalize_code(target)
            revoked = (
                f"SELECT platform, sender FROM {_APPROVALS} WHERE code_hash = ?",
                (self._code_hash(code),),
            )
            statements = [
                (f"DELETE FROM {_APPROVALS} WHERE code_hash = ?", (self._code_hash(code),)),
                (f"DELETE FROM {_REQUESTS} WHERE code = ?", (code,)),
            ]
        else:
            platform, shown = platform.strip().lower(), user.strip()
            if _SHOWN_SENDER.fullmatch(shown):
                match, params = "sender LIKE ?", (platform, shown.removeprefix("user_") + "%")
            else:
                try:  # written as for forget-user: any case, spaces, WhatsApp's "+"
                    person = parse_person(target)
                except ValueError:
                    return 0  # names no one, so no one is revoked
                digest = sender_digest(person.platform, person.user_id, self._secret)
                match, params = "sender = ?", (person.platform, digest)
            revoked = (
                f"SELECT platform, sender FROM {_APPROVALS} WHERE platform = ? AND {match}",
                params,
            )
            statements = [
                (f"DELETE FROM {table} WHERE platform = ? AND {match}", params)
                for table in (_APPROVALS, _REQUESTS)
            ]
        removed = cancelled = 0
        async with self._store.transaction() as tx:
            await self._ensure_in(tx)
            for who_platform, who in await tx.fetchall(*revoked):
                cancelled += await cancel_jobs_in(tx, platform=str(who_platform), sender=str(who))
            for sql, args in statements:
                removed += max(await tx.execute(sql, args), 0)
        self._cache.clear()
        if cancelled:
            logger.info("pairing revoked: %d scheduled job(s) of the sender cancelled", cancelled)
        return removed

    async def prune(self) -> int:
        """Delete expired codes; returns how many went."""
        async with self._store.transaction() as tx:
            await self._ensure_in(tx)
            removed = await tx.execute(
                f"DELETE FROM {_REQUESTS} WHERE expires_at <= ?", (to_epoch(self._clock()),)
            )
        return max(removed, 0)

    async def pending(self) -> list[PendingCode]:
        """Codes still waiting for approval, oldest first (expired ones are deleted)."""
        await self.prune()
        async with self._store.transaction() as tx:
            rows = await tx.fetchall(
                f"SELECT platform, sender, code, created_at, expires_at FROM {_REQUESTS} "
                "ORDER BY created_at"
            )
        return [
            PendingCode(str(p), str(s), str(c), from_epoch(created), from_epoch(expires))
            for p, s, c, created, expires in rows
        ]

    async def approvals(self) -> list[Approval]:
        """Approved senders, oldest approval first."""
        async with self._store.transaction() as tx:
            await self._ensure_in(tx)
            rows = await tx.fetchall(
                f"SELECT platform, sender, approved_at FROM {_APPROVALS} ORDER BY approved_at"
            )
        return [Approval(str(p), str(s), from_epoch(at)) for p, s, at in rows]
