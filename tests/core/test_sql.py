"""The SQL both databases run: placeholder translation, row counts, DDL types, DSN redaction."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.core.sql import (
    MIGRATION_LOCK_KEY,
    advisory_key,
    is_postgres_url,
    portable_ddl,
    qmark_to_dollar,
    redact_dsn,
    rowcount_from_status,
)


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT 1", "SELECT 1"),
        ("SELECT ? , ?", "SELECT $1 , $2"),
        (
            "UPDATE t SET a = ?, b = 'done?' WHERE c = ? AND d != 'it''s ?'",
            "UPDATE t SET a = $1, b = 'done?' WHERE c = $2 AND d != 'it''s ?'",
        ),
        ('SELECT "odd?name" FROM t WHERE x = ?', 'SELECT "odd?name" FROM t WHERE x = $1'),
        ("SELECT ? -- why?\n, ?", "SELECT $1 -- why?\n, $2"),
        ("SELECT /* ? */ ?", "SELECT /* ? */ $1"),
        ("INSERT INTO t VALUES (?, ?, 'x', ?)", "INSERT INTO t VALUES ($1, $2, 'x', $3)"),
    ],
    ids=[
        "none",
        "two",
        "string-literals",
        "quoted-identifier",
        "line-comment",
        "block-comment",
        "values",
    ],
)
def test_qmark_to_dollar(sql: str, expected: str) -> None:
    assert qmark_to_dollar(sql) == expected


@given(st.lists(st.sampled_from(["a", " ", "?", "'x?'", ",", "'it''s'"]), max_size=30))
def test_every_unquoted_placeholder_is_numbered_in_order(tokens: list[str]) -> None:
    sql = "".join(tokens)
    translated = qmark_to_dollar(sql)
    count = tokens.count("?")
    for n in range(1, count + 1):
        assert f"${n}" in translated
    assert f"${count + 1}" not in translated
    # Nothing else changes: removing the numbers gives the original back.
    restored = translated
    for n in range(count, 0, -1):
        restored = restored.replace(f"${n}", "?")
    assert restored == sql


@pytest.mark.parametrize(
    ("status", "rows"),
    [
        ("INSERT 0 1", 1),
        ("INSERT 0 0", 0),
        ("UPDATE 3", 3),
        ("DELETE 0", 0),
        ("SELECT 7", 7),
        ("CREATE TABLE", -1),
        ("BEGIN", -1),
        ("ALTER TABLE", -1),
    ],
    ids=["insert", "insert-none", "update", "delete", "select", "create", "begin", "alter"],
)
def test_rowcount_from_status(status: str, rows: int) -> None:
    assert rowcount_from_status(status) == rows


def test_portable_ddl_widens_types_on_postgres_only() -> None:
    ddl = (
        "CREATE TABLE t (a REAL NOT NULL, b INTEGER DEFAULT 0, "
        "c TEXT CHECK (c IN ('REAL', 'INTEGER')), realm TEXT)"
    )
    assert portable_ddl(ddl, "sqlite") == ddl
    assert portable_ddl(ddl, "postgres") == (
        "CREATE TABLE t (a DOUBLE PRECISION NOT NULL, b BIGINT DEFAULT 0, "
        "c TEXT CHECK (c IN ('REAL', 'INTEGER')), realm TEXT)"
    )


def test_portable_ddl_makes_sqlite_row_ids_identity_columns_on_postgres() -> None:
    ddl = "CREATE TABLE t (id INTEGER  PRIMARY KEY, n INTEGER NOT NULL, k TEXT PRIMARY KEY)"
    assert portable_ddl(ddl, "sqlite") == ddl
    assert portable_ddl(ddl, "postgres") == (
        "CREATE TABLE t (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
        "n BIGINT NOT NULL, k TEXT PRIMARY KEY)"
    )


def test_advisory_keys_are_signed_64_bit_and_stable() -> None:
    keys = {advisory_key(f"session-{i}") for i in range(1000)}
    assert len(keys) == 1000
    assert all(-(2**63) <= k < 2**63 for k in keys)
    assert advisory_key("chatflow:schema-migrations") == MIGRATION_LOCK_KEY


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://bot:s3cret@db:5432/chatflow", "postgresql://bot:***@db:5432/chatflow"),
        ("postgresql://bot@db/chatflow?sslmode=require", "postgresql://bot@db/chatflow"),
        ("postgres://db/chatflow", "postgres://db/chatflow"),
        (
            "postgresql://bot:s3cret@db1:5432,db2:5433/chatflow?target_session_attrs=read-write",
            "postgresql://bot:***@db1:5432,db2:5433/chatflow",
        ),
        ("postgresql://bot:p@[::1]:5432/chatflow", "postgresql://bot:***@[::1]:5432/chatflow"),
    ],
    ids=["password", "query", "no-user", "multi-host", "ipv6"],
)
def test_redact_dsn_hides_the_password(dsn: str, shown: str) -> None:
    assert redact_dsn(dsn) == shown
    assert is_postgres_url(dsn)
    assert not is_postgres_url("sqlite:///data/chatflow.db")
