"""Hashing of external ids, session keys and the installation secret.

External ids (phone numbers, user ids, chat ids) never reach the session
tables: they are hashed into ``user_<12hex>`` / ``chat_<12hex>``. The gateway
keys the hash with the installation secret (HMAC-SHA256), because a plain
SHA-256 of a phone number can be reversed by enumerating numbers.

A session key is a logical routing key and may contain ``/`` (Google-Chat
threads); the ``session_id`` derived from it is always safe as a file name.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from bot.core.ids import set_log_safe_session_ids
from bot.core.paths import is_path_unsafe, is_session_key_unsafe
from bot.core.sql import ensure_schema
from bot.core.stores.base import TransactionalStore
from bot.errors import ConfigurationError, StorageError
from bot.gateway.events import ChatType, SessionSource
from bot.logs import log_ref

__all__ = [
    "KEY_PREFIX",
    "SECRET_FILE_NAME",
    "PersonRef",
    "build_session_key",
    "chat_type_of",
    "hash_chat_id",
    "hash_id",
    "hash_sender_id",
    "is_gateway_session_id",
    "is_path_unsafe",
    "is_session_key_unsafe",
    "load_or_create_secret",
    "load_or_create_shared_secret",
    "log_ref",
    "parse_person",
    "session_id_for",
]

logger = logging.getLogger(__name__)

KEY_PREFIX = "agent:main"
"""First two segments of every session key."""

SECRET_FILE_NAME = "secret.key"
"""Name of the installation secret inside the data directory."""

_SECRET_BYTES = 32
_SECRET_NAME = "installation"
_SECRETS_MIGRATIONS = {
    1: (
        "CREATE TABLE IF NOT EXISTS chatflow_secrets ("
        "name TEXT PRIMARY KEY NOT NULL, "
        "value TEXT NOT NULL, "
        "created_at REAL NOT NULL)",
    ),
}
_PLATFORM_RE = re.compile(r"[a-z0-9_]+")
_ID_PLATFORM_RE = re.compile(r"[^a-z0-9_]")


def hash_id(value: str, secret: bytes | None = None) -> str:
    """First 12 hex chars of SHA-256 of ``value`` (HMAC-SHA256 keyed by ``secret`` if given)."""
    return _digest(value, secret)


# The same few chats and senders, message after message: an HMAC costs several µs and
# runs more than once per message (the session key, the memory scope).
@functools.lru_cache(maxsize=4096)
def _digest(value: str, secret: bytes | None) -> str:
    data = value.encode("utf-8")
    if secret is None:
        return hashlib.sha256(data).hexdigest()[:12]
    return hmac.new(secret, data, hashlib.sha256).hexdigest()[:12]


def hash_sender_id(value: str, secret: bytes | None = None) -> str:
    """Hash a sender id to ``user_<12hex>``."""
    return f"user_{hash_id(value, secret)}"


def hash_chat_id(value: str, secret: bytes | None = None) -> str:
    """Hash a chat id to ``chat_<12hex>``."""
    return f"chat_{hash_id(value, secret)}"


@dataclass(frozen=True, slots=True)
class PersonRef:
    """A person as the operator names them: platform and raw platform id."""

    platform: str
    user_id: str


def parse_person(text: str) -> PersonRef:
    """``telegram:123`` / ``whatsapp:15551234567`` -> ``PersonRef``; ``ValueError`` otherwise."""
    platform, sep, user_id = text.strip().partition(":")
    platform, user_id = platform.strip().lower(), user_id.strip().lstrip("+")
    if not sep or not user_id or not _PLATFORM_RE.fullmatch(platform):
        raise ValueError(f"{text!r} is not PLATFORM:USER_ID (e.g. telegram:123456789)")
    return PersonRef(platform, user_id)


def build_session_key(
    source: SessionSource,
    group_sessions_per_user: bool = True,
    *,
    secret: bytes | None = None,
) -> str:
    """The logical session key of a message's origin.

    - DM: ``agent:main:<platform>:dm:<chat>`` (a thread id is ignored in DMs);
    - group/channel: ``agent:main:<platform>:<group|channel>:<chat>[:topic:<thread>]``
      plus ``:user:<sender>`` when ``group_sessions_per_user`` and there is no
      thread: everyone in one topic/thread shares its session.

    ``<chat>``/``<sender>`` are the hashed forms. Thread ids are kept verbatim
    (slashes included) but must pass ``is_session_key_unsafe``; an unsafe thread
    id or a platform name outside ``[a-z0-9_]`` raises ``ValueError``.
    """
    platform = source.platform
    if not _PLATFORM_RE.fullmatch(platform):
        raise ValueError(f"platform name must match [a-z0-9_]+, not {platform!r}")
    chat = hash_chat_id(source.chat_id, secret)
    if source.chat_type == "dm":
        key = f"{KEY_PREFIX}:{platform}:dm:{chat}"
    else:
        key = f"{KEY_PREFIX}:{platform}:{source.chat_type}:{chat}"
        thread = source.thread_id or None
        if thread is not None:
            if is_session_key_unsafe(thread):
                raise ValueError("thread id is not safe inside a session key")
            key += f":topic:{thread}"
        elif group_sessions_per_user:
            key += f":user:{hash_sender_id(source.sender_id, secret)}"
    if is_session_key_unsafe(key):  # pragma: no cover - the parts above are all checked
        raise ValueError("session key is unsafe")
    return key


def chat_type_of(session_key: str) -> ChatType:
    """The chat type a session key was built for (``agent:main:<platform>:<type>:...``)."""
    parts = session_key.split(":")
    kind = parts[3] if len(parts) > 3 else ""
    return "group" if kind == "group" else "channel" if kind == "channel" else "dm"


def session_id_for(key: str) -> str:
    """``<platform>-<first 16 hex of sha256(key)>``: always safe as a file name.

    The platform is the key's third ``:`` segment, reduced to ``[a-z0-9_]``
    (``session`` when nothing is left), so even an arbitrary string yields a
    path-safe id.
    """
    parts = key.split(":")
    raw_platform = parts[2] if len(parts) > 2 else ""
    platform = _ID_PLATFORM_RE.sub("", raw_platform.lower())[:32] or "session"
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    session_id = f"{platform}-{digest}"
    assert not is_path_unsafe(session_id), session_id
    return session_id


_SESSION_ID_RE = re.compile(r"[a-z0-9_]+-[0-9a-f]{16}")


def is_gateway_session_id(session_id: str) -> bool:
    """True for ids of ``session_id_for``'s form: already hashes, so logs show them as they are."""
    return _SESSION_ID_RE.fullmatch(session_id) is not None


# Core hashes every session id in logs unless told which are safe: ours are.
set_log_safe_session_ids(is_gateway_session_id)


def load_or_create_secret(data_dir: Path) -> bytes:
    """Return the installation secret, creating ``<data_dir>/secret.key`` on first start.

    The file holds 32 random bytes, hex-encoded, mode 0600; it is created
    atomically (written to a private temp file, then hard-linked into place,
    which fails if another process won the race) so no reader ever sees a
    half-written secret. A file with looser permissions is tightened, with a
    warning. The value is never logged. Blocking file I/O: call it once at
    start-up, before the event loop serves traffic (or in a worker thread,
    ``asyncio.to_thread``).

    Raises ``ConfigurationError`` if the file exists but does not hold a secret:
    replacing it would silently move every user to a new session.
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / SECRET_FILE_NAME
    if not path.exists():
        _create_secret_file(path)
    return _read_secret_file(path)


def _create_secret_file(path: Path) -> None:
    payload = (secrets.token_bytes(_SECRET_BYTES).hex() + "\n").encode("ascii")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return  # another process created it first: use theirs
        except OSError:
            # No hard links on this file system: fall back to an exclusive create.
            _create_secret_exclusive(path, payload)
        else:
            logger.info("created a new installation secret in %s", path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def _create_secret_exclusive(path: Path, payload: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    logger.info("created a new installation secret in %s", path.parent)


def _read_secret_file(path: Path) -> bytes:
    if os.name == "posix":
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            logger.warning("%s was readable by others (mode %o); tightening it to 0600", path, mode)
            os.chmod(path, 0o600)
    text = path.read_text(encoding="ascii", errors="replace").strip()
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        secret = b""
    if len(secret) != _SECRET_BYTES:
        raise ConfigurationError(
            f"{path} does not hold a {_SECRET_BYTES}-byte hex secret; restore it from a backup "
            "or delete it to start over (every session key will change)",
            setting="DATA_DIR",
        )
    return secret


async def load_or_create_shared_secret(store: TransactionalStore) -> bytes:
    """The installation secret kept in the database, created by whichever process asks first.

    Used on PostgreSQL, where several processes (with their own data
    directories, on several hosts) must key their hashes alike or the same
    user would get a different session in each. The first caller inserts 32
    random bytes (``INSERT ... ON CONFLICT DO NOTHING``); every caller reads
    back the one stored. Whoever can read the database can read the secret:
    they can read the raw ids in the inbox and ledger rows anyway.
    """
    candidate = secrets.token_bytes(_SECRET_BYTES).hex()
    async with store.transaction() as tx:
        await ensure_schema(tx, "secrets", _SECRETS_MIGRATIONS)
        created = await tx.execute(
            "INSERT INTO chatflow_secrets (name, value, created_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO NOTHING",
            (_SECRET_NAME, candidate, time.time()),
        )
        row = await tx.fetchone(
            "SELECT value FROM chatflow_secrets WHERE name = ?", (_SECRET_NAME,)
        )
    try:
        secret = bytes.fromhex(str(row[0])) if row is not None else b""
    except ValueError:
        secret = b""
    if len(secret) != _SECRET_BYTES:
        raise StorageError(
            f"chatflow_secrets holds no valid {_SECRET_BYTES}-byte installation secret; restore "
            "it from a backup (replacing it moves every user to a new session)"
        )
    if created == 1:
        logger.info("created a new installation secret in the database")
    return secret
