"""SQL that runs on both SQLite and PostgreSQL: placeholders, row counts, DDL types, lock keys.

Chatflow's SQL is written once, for SQLite's ``?`` placeholders, in the subset
both databases accept (``INSERT ... ON CONFLICT ... DO NOTHING``, no ``rowid``).
The PostgreSQL store translates ``?`` to ``$1, $2, ...`` and reads row counts
from the server's command tags; migrations translate the two column types whose
meaning differs (PostgreSQL's ``REAL`` is a 4-byte float, too coarse for Unix
times, and its ``INTEGER`` is 32-bit).
"""

from __future__ import annotations

import functools
import hashlib
import re
from typing import Final, Literal
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "MIGRATION_LOCK_KEY",
    "Dialect",
    "advisory_key",
    "is_postgres_url",
    "portable_ddl",
    "qmark_to_dollar",
    "redact_dsn",
    "rowcount_from_status",
]

Dialect = Literal["sqlite", "postgres"]
"""The SQL dialects a store's ``Transaction`` may speak."""


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
_DDL_TYPE_RE: Final = re.compile(r"\b(REAL|INTEGER)\b")
_QUOTED_RE: Final = re.compile(r"('(?:[^']|'')*'|\"(?:[^\"]|\"\")*\")")


def portable_ddl(sql: str, dialect: Dialect) -> str:
    """``sql`` (written for SQLite) with column types fit for ``dialect``.

    On PostgreSQL ``REAL`` becomes ``DOUBLE PRECISION`` and ``INTEGER`` becomes
    ``BIGINT`` (outside quotes); SQLite gets ``sql`` unchanged.
    """
    if dialect != "postgres":
        return sql
    pieces = _QUOTED_RE.split(sql)
    # Odd positions are the quoted parts captured by the split.
    for index in range(0, len(pieces), 2):
        pieces[index] = _DDL_TYPE_RE.sub(lambda m: _DDL_TYPES[m.group(1)], pieces[index])
    return "".join(pieces)


def is_postgres_url(url: str) -> bool:
    """True for ``postgresql://`` and ``postgres://`` URLs."""
    return url.startswith(("postgresql://", "postgres://"))


def redact_dsn(dsn: str) -> str:
    """``dsn`` without its password (and query), fit for logs and banners."""
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "postgresql://(unparsable URL)"
    user = parts.username or ""
    auth = f"{user}:***@" if parts.password is not None else (f"{user}@" if user else "")
    return urlunsplit((parts.scheme, auth + host, parts.path, "", ""))
