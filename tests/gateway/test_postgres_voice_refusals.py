"""Voice refusals on PostgreSQL: a chat that refused voice notes is known to every process."""

from __future__ import annotations

from pathlib import Path

from bot import Voice
from bot.core.media_store import MediaStore
from bot.core.stores.postgres import PostgresSessionStore
from bot.gateway.voice_replies import VoiceReplies
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]

CHAT = "123456789"


async def test_a_refusal_recorded_by_one_process_is_seen_by_another(
    pg_dsn: str, tmp_path: Path
) -> None:
    stores = [PostgresSessionStore(pg_dsn), PostgresSessionStore(pg_dsn)]
    try:
        first, second = (
            VoiceReplies(store, MediaStore(tmp_path / "media"), None, default=Voice(mode="auto"))
            for store in stores
        )
        await first.open()
        await second.open()  # the table exists: opening again migrates nothing
        assert not await second.is_refused("telegram", CHAT)

        await first.refuse("telegram", CHAT)
        await first.refuse("telegram", CHAT)  # twice: one row, no error

        assert await second.is_refused("telegram", CHAT)
        assert not await second.is_refused("whatsapp", CHAT)
        assert not await second.is_refused("telegram", "987654321")
        async with stores[0].transaction() as tx:
            rows = await tx.fetchall("SELECT platform, chat_hash FROM chatflow_voice_refusals")
        assert len(rows) == 1 and CHAT not in str(rows)  # the raw chat id is not kept
    finally:
        for store in stores:
            await store.close()
