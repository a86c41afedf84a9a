"""The chaos suite's world: bot processes on PostgreSQL behind fault proxies, and its figures.

Every bot (``python -m bot run`` against its own fake WhatsApp Graph API)
reaches the database through proxies of its own (``tests.faultproxy``), one
per server of its multi-host ``DATABASE_URL``
(``host1,host2?target_session_attrs=read-write``), so a fault can strike
every bot's link or one bot's only. Webhooks go to any bot and are retried
like Meta's until one answers 200 (a bot whose database is away must answer
non-2xx). Scheduled jobs are written into the jobs table, due inside the
fault.

After each fault heals, with no restart, a phase is judged by what the fakes
received and what the database holds:

- lost: messages some bot accepted (200) that got no reply;
- unmarked duplicates: copies beyond one without the recovery marker, per
  message or job occurrence;
- marked duplicates: copies with the marker (allowed: the marker says it);
- stranded: inbox rows still ``received`` and ledger rows still owed at the end;
- acknowledged commits lost: messages accepted (200) missing from the journal;
- heal to last owed reply: seconds from the end of the fault to the last reply
  (or job message) of the phase;
- jobs: deliveries of each scheduled job (each must be exactly one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.e2e.botprocess import BotProcess
from tests.fakes.whatsapp_server import FakeWhatsAppServer, RecordedRequest
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender, sign
from tests.faultproxy import FaultProxy

__all__ = ["ChaosWorld", "Figures", "Phase"]

APP_SECRET = "chaos-app-secret"
TOKEN = "chaos-token"
LEASE_SECONDS = 3.0


@dataclass
class Figures:
    """What one fault did."""

    fault: str
    messages: int = 0
    lost: int = 0
    unmarked_duplicates: int = 0
    marked_duplicates: int = 0
    stranded: int = 0
    acknowledged_lost: int = 0
    heal_to_last_reply: float = 0.0
    jobs: int = 0
    jobs_once: int = 0
    refused_webhooks: int = 0
    """Webhook posts answered non-2xx (or not at all) during the phase."""

    def row(self) -> str:
        return (
            f"| {self.fault} | {self.messages} | {self.lost} | {self.unmarked_duplicates} | "
            f"{self.marked_duplicates} | {self.stranded} | {self.acknowledged_lost} | "
            f"{self.heal_to_last_reply:.1f} s | {self.jobs_once}/{self.jobs} | "
            f"{self.refused_webhooks} |"
        )

    def holds(self, lease: float) -> bool:
        return (
            self.lost == 0
            and self.unmarked_duplicates == 0
            and self.stranded == 0
            and self.acknowledged_lost == 0
            and self.jobs_once == self.jobs
            and self.heal_to_last_reply <= 3 * lease + 20
        )


HEADER = (
    "| fault | messages | lost | unmarked dups | marked dups | stranded | acked commits lost "
    "| heal to last reply | jobs once | webhooks refused |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


@dataclass
class Phase:
    """One fault: ``inject`` it, hold ``hold`` seconds, ``heal``."""

    name: str
    inject: Callable[[], Awaitable[None]]
    heal: Callable[[], Awaitable[None]]
    hold: float


@dataclass
class ChaosWorld:
    """Bots, their proxies and fakes, on the servers at ``ports`` (the primary's first)."""

    ports: list[int]
    """PostgreSQL ports, in the order of the bots' DATABASE_URL hosts."""
    admin_dsn: Callable[[], str]
    """A direct (proxy-free) DSN of the current primary, for the harness's own reads."""
    database: str
    query: str
    """The DSN query the bots use (``target_session_attrs``, ``search_path``...)."""
    rng: random.Random
    bots: list[BotProcess] = field(default_factory=list)
    graphs: list[FakeWhatsAppServer] = field(default_factory=list)
    proxies: list[list[FaultProxy]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self, root: Path, count: int, extra_env: dict[str, str]) -> None:
        for index in range(count):
            graph = FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token=TOKEN)
            await graph.start()
            graph.on_send = lambda _request: self.changed.set()
            self.graphs.append(graph)
            links = [await FaultProxy(port).start() for port in self.ports]
            self.proxies.append(links)
            hosts = ",".join(f"127.0.0.1:{p.port}" for p in links)
            env = {
                "DATABASE_URL": f"postgresql://postgres@{hosts}/{self.database}?{self.query}",
                "INSTANCE_LEASE_SECONDS": str(LEASE_SECONDS),
                "DATABASE_CONNECT_TIMEOUT_SECONDS": "1",
                "DATABASE_STATEMENT_TIMEOUT_SECONDS": "3",
                "DATABASE_ACQUIRE_TIMEOUT_SECONDS": "3",
                "DATABASE_TCP_USER_TIMEOUT_SECONDS": "4",
                "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS": "6",
                "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
                "WHATSAPP_TOKEN": TOKEN,
                "WHATSAPP_VERIFY_TOKEN": "verify-me",
                "WHATSAPP_APP_SECRET": APP_SECRET,
                "WHATSAPP_API_BASE_URL": graph.base_url,
                "SHUTDOWN_GRACE_SECONDS": "2",
                "SCHEDULE_MAX_LATENESS_SECONDS": "3600",
                **extra_env,
            }
            (root / f"bot{index}" / "data").mkdir(parents=True)
            self.bots.append(BotProcess(root / f"bot{index}" / "data", env))
        await asyncio.gather(*(bot.start(within=90) for bot in self.bots))

    async def stop(self) -> None:
        for bot in self.bots:
            if bot.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    bot.proc.send_signal(18)  # SIGCONT: a stopped bot must be able to die
            await bot.kill()
        for links in self.proxies:
            for proxy in links:
                await proxy.stop()
        for graph in self.graphs:
            await graph.stop()

    # -- links ---------------------------------------------------------------------------

    def links(self, bot: int | None = None) -> list[FaultProxy]:
        chosen = self.proxies if bot is None else [self.proxies[bot]]
        return [proxy for links in chosen for proxy in links]

    async def silence(self, bot: int | None = None) -> None:
        for proxy in self.links(bot):
            proxy.silence()

    async def cut(self, bot: int | None = None) -> None:
        for proxy in self.links(bot):
            await proxy.cut()

    async def heal(self, bot: int | None = None) -> None:
        for proxy in self.links(bot):
            await proxy.heal()

    # -- traffic ---------------------------------------------------------------------------

    async def post(self, payload: dict[str, Any]) -> None:
        """Like Meta: to any bot, again and again until one answers 200."""
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Hub-Signature-256": sign(body, APP_SECRET),
        }
        async with httpx.AsyncClient(timeout=3.0) as client, asyncio.timeout(180):
            while True:
                bot = self.rng.choice(self.bots)
                try:
                    response = await client.post(
                        f"{bot.url}/webhooks/whatsapp", content=body, headers=headers
                    )
                    status = response.status_code
                except httpx.HTTPError:
                    status = 0
                self.statuses.append(status)
                if status == 200:
                    return
                await asyncio.sleep(0.2)  # Meta's retry back-off, shortened

    def sends(self) -> list[RecordedRequest]:
        return [sent for graph in self.graphs for sent in graph.sent]

    def replies_to(self, wamid: str) -> list[str]:
        return [
            s.json["text"]["body"]
            for s in self.sends()
            if s.json.get("context", {}).get("message_id") == wamid
        ]

    def job_copies(self, text: str) -> list[str]:
        return [
            s.json["text"]["body"]
            for s in self.sends()
            if s.json.get("type") == "text"
            and s.json["text"]["body"] in (text, RECOVERED_MARKER + text)
        ]

    async def _admin(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.admin_dsn())

    async def add_jobs(self, phase: str, count: int, due_in: float) -> list[str]:
        """One-shot scheduled messages due ``due_in`` s from now; returns their texts."""
        texts = [f"job {phase} {n}" for n in range(count)]
        conn = await self._admin()
        try:
            now = time.time()
            for n, text in enumerate(texts):
                await conn.execute(
                    "INSERT INTO chatflow_scheduled_jobs (id, session_key, session_id, platform, "
                    "chat_id, thread_id, text, run_agent, cron, due_at, state, created_at, "
                    "fired_count) VALUES ($1, $2, $3, 'whatsapp', $4, NULL, $5, 0, NULL, $6, "
                    "'scheduled', $7, 0)",
                    f"chaos-{phase}-{n}",
                    f"agent:main:whatsapp:dm:chaos-{phase}-{n}",
                    f"chaos-{phase}-{n}",
                    f"1650999{n:04d}",
                    text,
                    now + due_in,
                    now,
                )
        finally:
            await conn.close()
        return texts

    async def open_rows(self, refs: list[str]) -> int:
        """Inbox rows still ``received`` and ledger rows still owed, of ``refs``."""
        conn = await self._admin()
        try:
            inbox = await conn.fetchval(
                "SELECT count(*) FROM chatflow_inbox WHERE state = 'received' "
                "AND message_id = ANY($1::text[])",
                refs,
            )
            ledger = await conn.fetchval(
                "SELECT count(*) FROM chatflow_delivery_obligations WHERE state IN "
                "('pending', 'attempting', 'failed') AND (message_ref = ANY($1::text[]) "
                "OR message_ref LIKE 'schedule:%')",
                refs,
            )
        finally:
            await conn.close()
        return int(inbox) + int(ledger)

    async def journaled(self, refs: list[str]) -> int:
        conn = await self._admin()
        try:
            found = await conn.fetchval(
                "SELECT count(*) FROM chatflow_inbox WHERE message_id = ANY($1::text[])", refs
            )
        finally:
            await conn.close()
        return int(found)

    # -- one phase --------------------------------------------------------------------------

    async def run_phase(
        self, index: int, phase: Phase, *, conversations: int, messages: int, jobs: int
    ) -> Figures:
        name = f"p{index}"
        sender = WebhookSender("http://unused", APP_SECRET)
        wamids: list[str] = []
        posted = len(self.statuses)

        async def conversation(number: int) -> None:
            wa_id = f"1650{index:02d}{number:05d}"
            for m in range(messages):
                payload = sender.text(f"{name} chat {number} message {m}", wa_id=wa_id)
                wamids.append(payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"])
                await self.post(payload)
                # The user's think time: the conversation goes on through the whole fault.
                await asyncio.sleep(self.rng.uniform(0.5, 1.5) * (phase.hold + 2) / messages)

        job_texts = await self.add_jobs(name, jobs, due_in=1.5)
        traffic = asyncio.gather(*(conversation(n) for n in range(conversations)))
        await asyncio.sleep(1.0)  # messages in flight when the fault strikes
        await phase.inject()
        await asyncio.sleep(phase.hold)  # the fault's duration is the point here
        await phase.heal()
        healed = time.monotonic()
        await traffic
        refs = list(wamids)  # journaled under the wamid itself
        deadline = healed + 3 * LEASE_SECONDS + 20
        last = healed
        seen = 0
        while time.monotonic() < deadline:
            answered = all(self.replies_to(w) for w in wamids)
            jobs_sent = all(self.job_copies(t) for t in job_texts)
            count = len(self.sends())
            if count != seen:
                seen, last = count, time.monotonic()
            if answered and jobs_sent and await self.open_rows(refs) == 0:
                break
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.5)
        # A quiet moment for duplicates to show (a resend after the answer would count).
        await asyncio.sleep(2 * LEASE_SECONDS)
        figures = Figures(phase.name, messages=len(wamids), jobs=len(job_texts))
        for wamid in wamids:
            replies = self.replies_to(wamid)
            if not replies:
                figures.lost += 1
            unmarked = [r for r in replies if not r.startswith(RECOVERED_MARKER)]
            figures.unmarked_duplicates += max(0, len(unmarked) - 1)
            figures.marked_duplicates += len(replies) - len(unmarked)
        for text in job_texts:
            copies = self.job_copies(text)
            unmarked = [c for c in copies if not c.startswith(RECOVERED_MARKER)]
            figures.jobs_once += 1 if len(unmarked) == 1 else 0
            figures.unmarked_duplicates += max(0, len(unmarked) - 1)
            figures.marked_duplicates += len(copies) - len(unmarked)
        figures.stranded = await self.open_rows(refs)
        figures.acknowledged_lost = len(wamids) - await self.journaled(refs)
        figures.heal_to_last_reply = max(0.0, last - healed)
        figures.refused_webhooks = sum(1 for s in self.statuses[posted:] if s != 200)
        return figures
