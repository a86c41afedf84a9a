"""The database the settings name: its store, and what keeps two bots apart on it.

Light on purpose: every command of ``python -m bot`` opens the store, and only
``run`` and ``chat`` need the rest of the house.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from bot.config import Settings
from bot.core.stores.base import TransactionalStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.instance_lock import InstanceLock

if TYPE_CHECKING:
    from bot.core.stores.pgconnect import ConnectionOptions

__all__ = ["connection_options", "instance_lock", "open_store"]


def open_store(settings: Settings) -> TransactionalStore:
    """The store ``DATABASE_URL`` names: SQLite (its folder created if missing) or PostgreSQL."""
    if settings.database_dialect == "postgres":
        from bot.core.stores.pgconnect import application_name
        from bot.core.stores.postgres import PostgresSessionStore
        from bot.gateway.instances import Owner

        assert settings.database_url is not None
        # A turn holds a connection only for its short transactions, never while the
        # model thinks: DATABASE_CONNECTIONS is all this process opens.
        owner = Owner.current().instance_id
        return PostgresSessionStore(
            settings.database_url,
            default_max_turns=settings.max_turns,
            prune_to_turns=settings.effective_prune_to_turns,
            max_pool=max(2, settings.database_connections),
            options=connection_options(settings, application_name(owner)),
            lease_owner=owner,
            session_lease_seconds=settings.instance_lease_seconds,
        )
    path = settings.database_path
    path.parent.mkdir(parents=True, exist_ok=True)
    return SQLiteSessionStore(
        str(path),
        default_max_turns=settings.max_turns,
        prune_to_turns=settings.effective_prune_to_turns,
    )


def connection_options(settings: Settings, name: str) -> ConnectionOptions:
    """The PostgreSQL store's timeouts and keepalives from the settings; ``name`` is the
    connections' ``application_name`` (the process's instance, so a process taking this
    one's work over can end its backends)."""
    from bot.core.stores.pgconnect import ConnectionOptions

    user_timeout = settings.database_tcp_user_timeout_seconds
    # Keepalive probes find a silent peer of an idle connection within the same time.
    interval = max(1, int(user_timeout / 6))
    return ConnectionOptions(
        connect_timeout=settings.database_connect_timeout_seconds,
        statement_timeout=settings.database_statement_timeout_seconds,
        acquire_timeout=settings.database_acquire_timeout_seconds,
        keepalive_idle=max(1, int(user_timeout / 2)),
        keepalive_interval=interval,
        keepalive_count=3,
        tcp_user_timeout=user_timeout,
        idle_in_transaction_timeout=settings.database_idle_in_transaction_timeout_seconds,
        application_name=name,
        pooler=settings.database_pooler,
    )


def instance_lock(settings: Settings) -> contextlib.AbstractContextManager[None]:
    """What keeps two bots from sharing state they must not share.

    SQLite: an ``flock`` on ``DATA_DIR`` (one process per data directory).
    PostgreSQL: nothing here; several processes are the point, and leases
    (``InstanceRegistry``) tell who is alive.
    """
    if settings.database_dialect == "postgres":
        return contextlib.nullcontext()
    return InstanceLock(settings.data_dir).held()
