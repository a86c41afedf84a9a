"""Choosing PostgreSQL: settings, the store ``run`` opens, and ``run`` refusing Telegram
long polling beside another live process."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from bot.app import POLLING_CONFLICT_MESSAGE
from bot.config import Settings, load_settings
from bot.core.stores.postgres import PostgresSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.database import instance_lock, open_store
from bot.errors import ConfigurationError
from bot.gateway.instances import InstanceRegistry, Owner
from tests.e2e.botprocess import BotProcess
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID
from tests.pgtest import pg_dsn, wait_until

__all__ = ["pg_dsn"]

ROOT = Path(__file__).resolve().parents[1]
URL = "postgresql://chatflow:s3cret@db.internal:5432/chatflow"


@pytest.mark.parametrize(
    "url",
    [URL, "postgres://db/chatflow", "postgresql://db/chatflow?search_path=tenant_a"],
    ids=["postgresql", "postgres", "search-path"],
)
def test_postgres_urls_are_accepted(url: str) -> None:
    settings = load_settings(database_url=url)
    assert settings.database_dialect == "postgres"
    with pytest.raises(ValueError, match="PostgreSQL"):
        _ = settings.database_path


def test_other_urls_name_both_forms() -> None:
    with pytest.raises(ConfigurationError, match=r"DATABASE_URL: use sqlite:///.*postgresql://"):
        load_settings(database_url="mysql://db/chatflow")


def test_the_banner_label_hides_the_password(tmp_path: Path) -> None:
    assert load_settings(database_url=URL).database_label == (
        "postgresql://chatflow:***@db.internal:5432/chatflow"
    )
    sqlite = load_settings(data_dir=tmp_path)
    assert sqlite.database_dialect == "sqlite"
    assert sqlite.database_label == str(tmp_path / "chatflow.db")


def test_open_store_picks_the_database_and_sizes_the_pools(tmp_path: Path) -> None:
    store = open_store(
        load_settings(database_url=URL, max_concurrent_turns=500, database_connections=5)
    )
    assert isinstance(store, PostgresSessionStore)
    # One pool of DATABASE_CONNECTIONS, whatever the turns: they hold none while thinking.
    assert store._max_pool == 5
    assert store.leases.owner == Owner.current().instance_id
    assert isinstance(open_store(load_settings(data_dir=tmp_path)), SQLiteSessionStore)


def test_several_processes_may_share_a_data_dir_only_on_postgres(tmp_path: Path) -> None:
    postgres = Settings(data_dir=tmp_path, database_url=URL)
    with instance_lock(postgres), instance_lock(postgres):
        pass
    sqlite = Settings(data_dir=tmp_path)
    with instance_lock(sqlite), pytest.raises(ConfigurationError, match="DATA_DIR"):
        instance_lock(sqlite).__enter__()


def test_run_refuses_long_polling_beside_another_live_process(pg_dsn: str, tmp_path: Path) -> None:
    async def register_other() -> InstanceRegistry:
        store = PostgresSessionStore(pg_dsn)
        # This test process plays the other bot: alive, on this host, another pid.
        registry = InstanceRegistry(store, owner=Owner(os.getpid(), "the-other-bot"))
        await registry.register()
        await store.close()
        return registry

    asyncio.run(register_other())
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    result = subprocess.run(
        [sys.executable, "-m", "bot", "run", "--no-console"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={
            **keep,
            "PYTHONPATH": str(ROOT),
            "DATA_DIR": str(tmp_path / "data"),
            "DATABASE_URL": pg_dsn,
            "TELEGRAM_BOT_TOKEN": "123456:test-token",
            "HTTP_PORT": "0",
            "LOG_FORMAT": "text",
        },
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"chatflow: configuration error: {POLLING_CONFLICT_MESSAGE}" in result.stderr
    assert "test-token" not in result.stderr


SLOW_IMPORT_SECONDS = 3.0
SLOW_PLATFORM_LIBRARY = f"""
import importlib.abc, sys, time

class SlowImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pywa":
            sys.meta_path.remove(self)
            time.sleep({SLOW_IMPORT_SECONDS})
        return None

sys.meta_path.insert(0, SlowImport())
"""


async def test_a_slow_start_does_not_let_the_lease_expire(pg_dsn: str, tmp_path: Path) -> None:
    """Slow imports (the platform libraries, the operator's agents) come before the lease.

    They block the event loop (here the WhatsApp library takes 3 s, as it can on a
    busy host), so a lease taken before them expired unrenewed and another process
    took over this one's first messages as if it had died.
    """
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_PLATFORM_LIBRARY, encoding="utf-8")
    lease = SLOW_IMPORT_SECONDS - 1
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token="e2e-token") as graph:
        bot = BotProcess(
            tmp_path / "data",
            {
                "PYTHONPATH": os.pathsep.join((str(ROOT), str(hooks))),
                "DATABASE_URL": pg_dsn,
                "INSTANCE_LEASE_SECONDS": str(lease),
                "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
                "WHATSAPP_TOKEN": "e2e-token",
                "WHATSAPP_VERIFY_TOKEN": "verify-me",
                "WHATSAPP_APP_SECRET": "e2e-app-secret",
                "WHATSAPP_API_BASE_URL": graph.base_url,
            },
        )
        try:
            await bot.start()
            conn = await asyncpg.connect(pg_dsn)
            try:
                ready = await conn.fetchval("SELECT extract(epoch FROM clock_timestamp())")

                async def renewed_since_ready() -> bool:
                    renewed = await conn.fetchval("SELECT max(renewed_at) FROM chatflow_instances")
                    return renewed is not None and renewed > ready

                await wait_until(renewed_since_ready, within=10 * lease)
            finally:
                await conn.close()
        finally:
            await bot.stop()
    assert not [line for line in bot.log if "lease that had expired" in line], bot.log


def test_doctor_checks_a_postgres_database(pg_dsn: str, tmp_path: Path) -> None:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    result = subprocess.run(
        [sys.executable, "-m", "bot", "doctor"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**keep, "PYTHONPATH": str(ROOT), "DATA_DIR": str(tmp_path), "DATABASE_URL": pg_dsn},
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   database: postgresql://" in result.stdout
