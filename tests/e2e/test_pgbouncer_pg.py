"""Two ``python -m bot run`` processes through PgBouncer in transaction mode (issue #38).

Debian's ``pgbouncer`` (``tests/pgbouncer.py``) pools the bots' connections
onto a few server connections: nothing may live in a database session between
transactions. Several chats, each with messages posted to both processes, are
answered once each, in order per chat, and the bots' server connections stay
within the pooler's pool.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import asyncpg
import pytest

from tests.e2e.test_multiprocess_pg import APP_SECRET, TOKEN, new_bot, settled, whatsapp_env
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender, real_wamid
from tests.pgbouncer import bouncer
from tests.pgtest import fresh_schema, wait_until

pytestmark = pytest.mark.e2e

CHATS = 6
MESSAGES_PER_CHAT = 2
POOL_SIZE = 4


async def test_two_processes_through_pgbouncer_answer_every_message_once(tmp_path: Path) -> None:
    async with (
        fresh_schema() as dsn,
        bouncer(dsn, pool_size=POOL_SIZE) as through,
        contextlib.AsyncExitStack() as stack,
    ):
        graphs = [
            await stack.enter_async_context(
                FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token=TOKEN)
            )
            for _ in range(2)
        ]
        bots = [
            new_bot(
                tmp_path / f"bot{i}",
                whatsapp_env(
                    graph, through, DATABASE_POOLER="transaction", DATABASE_CONNECTIONS="3"
                ),
            )
            for i, graph in enumerate(graphs)
        ]
        try:
            await asyncio.gather(*(bot.start() for bot in bots))
            senders = [WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET) for bot in bots]
            wamids: list[str] = []
            for k in range(MESSAGES_PER_CHAT):
                posts = []
                for chat in range(CHATS):
                    wa_id = f"1650555{chat:04d}"
                    wamid = f"{real_wamid(wa_id)}{k}"
                    wamids.append(wamid)
                    sender = senders[(chat + k) % 2]  # each chat's messages reach both
                    posts.append(sender.post_one(sender.text(f"m{k}", wa_id=wa_id, wamid=wamid)))
                responses = await asyncio.gather(*posts)
                assert [r.status_code for r in responses] == [200] * CHATS

            def replies(wamid: str) -> int:
                return sum(
                    1
                    for graph in graphs
                    for sent in graph.sent
                    if sent.json.get("context", {}).get("message_id") == wamid
                )

            async def answered() -> bool:
                return all(replies(w) >= 1 for w in wamids)

            await wait_until(answered, within=60)
            await wait_until(lambda: settled(dsn), within=30)
            assert [replies(w) for w in wamids] == [1] * len(wamids)
            conn = await asyncpg.connect(dsn)
            try:
                turns = await conn.fetchval(
                    "SELECT count(*) FROM chatflow_messages WHERE role = 'user'"
                )
                free = await conn.fetchval(
                    "SELECT count(*) FROM chatflow_session_leases WHERE owner_instance = ''"
                )
                leases = await conn.fetchval("SELECT count(*) FROM chatflow_session_leases")
            finally:
                await conn.close()
            assert turns == CHATS * MESSAGES_PER_CHAT  # one committed turn per message
            assert free == leases >= CHATS  # every session lease given back
            for bot in bots:
                assert not [line for line in bot.log if "Traceback" in line], bot.log[-30:]
        finally:
            for bot in bots:
                await bot.kill()
