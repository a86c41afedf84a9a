"""SQL that runs on both SQLite and PostgreSQL: the ``Transaction``, placeholders, DDL, schemas.

Chatflow's SQL is written once, for SQLite's ``?`` placeholders, in the subset
both databases accept (``INSERT ... ON CONFLICT ... DO NOTHING``, no ``rowid``).
The PostgreSQL store translates ``?`` to ``$1, $2, ...`` and reads row counts
from the server's command tags; migrations translate the column types whose
meaning differs (PostgreSQL's ``REAL`` is a 4-byte float, too coarse for Unix
times, its ``INTEGER`` is 32-bit, and SQLite's ``INTEGER PRIMARY KEY`` numbers
rows by itself).

Schema versions
    Every component (the session tables, the gateway's inbox, ledger, ...)
    records its version in ``chatflow_schema_versions(component, version)`` and
    ``ensure_schema`` migrates it forward inside one transaction. On PostgreSQL
    every migration (and every read of a version) first takes a
    transaction-scoped advisory lock, so several processes starting at once
    migrate one after the other and never collide on ``CREATE TABLE``; the
    later ones find the work done.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol
from urllib.parse import urlsplit

from bot.errors import SchemaVersionError

__all__ = [
    "MIGRATION_LOCK_KEY",
    "VERSIONS_TABLE",
    "Dialect",
    "Transaction",
    "advisory_key",
    "dsn_hosts",
    "ensure_schema",
    "is_postgres_url",
    "lock_migrations_in",
    "portable_ddl",
    "qmark_to_dollar",
    "redact_dsn",
    "rowcount_from_status",
    "schema_version_in",
]

logger = logging.getLogger(__name__)

Dialect = Literal["sqlite", "postgres"]
"""The SQL dialects a store's ``Transaction`` may speak."""


class Transaction(Protocol):
    """One open database transaction of a store (see ``TransactionalStore.transaction``).

    Statements run on the store's connection inside the transaction; it commits
    when the ``async with`` block (or the ``save`` hook) ends without an error
    and rolls back otherwise. Database errors surface as ``StorageError``.
    """

    @property
    def dialect(self) -> Dialect:
        """The SQL dialect statements must be written in (``?`` placeholders on both)."""
        ...

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; return the number of rows it changed (-1 if none apply)."""
        ...

    async def executemany(self, sql: str, seq_of_params: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per parameter set."""
        ...

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a query and return every row."""
        ...

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        """Run a query and return its first row, or ``None``."""
        ...


def advisory_key(text: str) -> int:
    """A signed 64-bit PostgreSQL advisory-lock key derived from ``text`` (SHA-256)."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


MIGRATION_LOCK_KEY: Final = advisory_key("chatflow:schema-migrations")
"""Transaction-scoped advisory lock every PostgreSQL migration runs under."""


@functools.lru_cache(maxsize=512)
def qmark_to_dollar(sql: str) -> str:
    """Rewrite ``?`` placeholders as ``$1, $2, ...``.

    A ``?`` inside a quoted string (``'...'``, with ``''`` escapes), a quoted
    identifier (``"..."``) or a comment (``-- ...``, ``/* ... */``) is left
    alone.
    """
    out: list[str] = []
    n = 0
    i = 0
    length = len(sql)
    while i < length:
        ch = sql[i]
        if ch in ("'", '"'):
            end = i + 1
            while end < length:
                if sql[end] == ch:
                    if end + 1 < length and sql[end + 1] == ch:
                        end += 2  # doubled quote: an escaped quote character
                        continue
                    break
                end += 1
            out.append(sql[i : end + 1])
            i = end + 1
        elif sql.startswith("--", i):
            end = sql.find("\n", i)
            end = length if end < 0 else end
            out.append(sql[i:end])
            i = end
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            end = length if end < 0 else end + 2
            out.append(sql[i:end])
            i = end
        elif ch == "?":
            n += 1
            out.append(f"${n}")
            i += 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


_COUNT_TAGS: Final = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "SELECT", "COPY", "MOVE"})


def rowcount_from_status(status: str) -> int:
    """Rows changed according to a PostgreSQL command tag (``"UPDATE 3"`` -> 3, ``"INSERT 0 1"``
    -> 1); -1 for commands that report none (``"CREATE TABLE"``)."""
    parts = status.split()
    if len(parts) >= 2 and parts[0] in _COUNT_TAGS and parts[-1].isdigit():
        return int(parts[-1])
    return -1


_DDL_TYPES: Final = {"REAL": "DOUBLE PRECISION", "INTEGER": "BIGINT"}
_IDENTITY: Final = "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
_DDL_TYPE_RE: Final = re.compile(r"\b(?:(INTEGER\s+PRIMARY\s+KEY)|(REAL|INTEGER))\b")
_QUOTED_RE: Final = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")")


def _postgres_type(match: re.Match[str]) -> str:
    return _IDENTITY if match.group(1) else _DDL_TYPES[match.group(2)]


def portable_ddl(sql: str, dialect: Dialect) -> str:
    """``sql`` (written for SQLite) with column types fit for ``dialect``.

    On PostgreSQL ``REAL`` becomes ``DOUBLE PRECISION``, ``INTEGER`` becomes
    ``BIGINT`` and ``INTEGER PRIMARY KEY`` (SQLite's self-numbering row id) an
    identity column (outside quotes); SQLite gets ``sql`` unchanged.
    """
    if dialect != "postgres":
        return sql
    pieces = _QUOTED_RE.split(sql)
    # Odd positions are the quoted parts captured by the split.
    for index in range(0, len(pieces), 2):
        pieces[index] = _DDL_TYPE_RE.sub(_postgres_type, pieces[index])
    return "".join(pieces)


def is_postgres_url(url: str) -> bool:
    """True for ``postgresql://`` and ``postgres://`` URLs."""
    return url.startswith(("postgresql://", "postgres://"))


def dsn_hosts(dsn: str) -> list[tuple[str, int | None]]:
    """The ``(host, port)`` pairs of a PostgreSQL URL, in order (libpq's multi-host form
    ``postgresql://u@h1:5432,h2:5433/db`` gives two); ``[]`` when the URL names none
    (a Unix socket, or hosts given only in the query). ``ValueError`` when unparsable."""
    rest = dsn.split("://", 1)[1] if "://" in dsn else dsn
    netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
    hostspec = netloc.rpartition("@")[2]
    hosts: list[tuple[str, int | None]] = []
    for item in hostspec.split(","):
        if not item:
            continue
        if item.startswith("["):  # [::1]:5432
            host, _, tail = item[1:].partition("]")
            port_text = tail.removeprefix(":")
        else:
            host, _, port_text = item.partition(":")
        if not host or (port_text and not port_text.isdigit()):
            raise ValueError("unparsable host in the database URL")
        hosts.append((host, int(port_text) if port_text else None))
    return hosts


def redact_dsn(dsn: str) -> str:
    """``dsn`` without its password (and query), fit for logs and banners.

    Multi-host URLs (``h1:5432,h2:5432``, libpq's failover form) keep every host.
    """
    try:
        parts = urlsplit(dsn)
        hosts = dsn_hosts(dsn)
    except ValueError:
        return "postgresql://(unparsable URL)"
    auth_text = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else ""
    user, has_password, _ = auth_text.partition(":")
    auth = f"{user}:***@" if has_password else (f"{user}@" if user else "")
    shown = ",".join(
        (f"[{h}]" if ":" in h else h) + ("" if p is None else f":{p}") for h, p in hosts
    )
    path = parts.path if "://" in dsn else ""
    return f"{parts.scheme}://{auth}{shown}{path}"


# -- schema versions ------------------------------------------------------------------

VERSIONS_TABLE: Final = "chatflow_schema_versions"
"""Table holding one row per component (session store, inbox, ledger...): its schema version."""

_CREATE_VERSIONS: Final = (
    f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} ("
    "component TEXT PRIMARY KEY NOT NULL, "
    "version INTEGER NOT NULL)"
)


async def lock_migrations_in(tx: Transaction) -> None:
    """On PostgreSQL, wait for the migration lock (held until ``tx`` ends); no-op on SQLite.

    SQLite needs none: its write transactions already exclude each other.
    """
    if tx.dialect == "postgres":
        await tx.fetchall("SELECT pg_advisory_xact_lock(?)", (MIGRATION_LOCK_KEY,))


async def schema_version_in(tx: Transaction, component: str) -> int:
    """The recorded schema version of ``component`` (0 when it has none yet)."""
    await lock_migrations_in(tx)
    await tx.execute(_CREATE_VERSIONS, ())
    rows = await tx.fetchall(
        f"SELECT version FROM {VERSIONS_TABLE} WHERE component = ?", (component,)
    )
    return int(rows[0][0]) if rows else 0


async def ensure_schema(
    tx: Transaction, component: str, migrations: Mapping[int, Sequence[str]]
) -> int:
    """Bring ``component``'s tables to the newest version in ``migrations``.

    ``migrations[v]`` holds the statements (SQLite DDL, see ``portable_ddl``)
    that move version ``v - 1`` to ``v``; versions run from 1 upwards without
    gaps. Everything happens in ``tx``, so a failed migration leaves the old
    schema. Raises ``SchemaVersionError`` when the database was written by a
    newer version than this code knows.
    """
    target = max(migrations, default=0)
    if sorted(migrations) != list(range(1, target + 1)):
        raise ValueError(f"migrations of {component} must be numbered 1..{target}")
    current = await schema_version_in(tx, component)
    if current > target:
        raise SchemaVersionError(
            f"the {component} tables are at schema version {current}, "
            f"newer than this Chatflow knows ({target}); upgrade Chatflow"
        )
    for version in range(current + 1, target + 1):
        for statement in migrations[version]:
            await tx.execute(portable_ddl(statement, tx.dialect), ())
    if current != target:
        await tx.execute(
            f"INSERT INTO {VERSIONS_TABLE} (component, version) VALUES (?, ?) "
            "ON CONFLICT(component) DO UPDATE SET version = excluded.version",
            (component, target),
        )
        logger.info("%s schema migrated from version %d to %d", component, current, target)
    return target
