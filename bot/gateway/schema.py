"""Schema versions of the gateway's tables: re-exported from ``bot.core.sql``.

The session tables and the gateway's own (inbox, ledger, aliases, instances,
secrets) share one mechanism, ``ensure_schema``; it lives in core so the
session store can use it too. This module keeps the gateway's import path.
"""

from __future__ import annotations

from bot.core.sql import VERSIONS_TABLE, ensure_schema, lock_migrations_in, schema_version_in

__all__ = ["VERSIONS_TABLE", "ensure_schema", "lock_migrations_in", "schema_version_in"]
