"""Several ``python -m bot run`` processes on one PostgreSQL database, behind WhatsApp webhooks.

Each process has its own data directory, port and fake Graph API server (so a
kill can strike the very process whose send just reached the platform); they
share one database schema. Webhooks go to any live process, as a load
balancer would send them, and are retried until one answers 200, as Meta does.

- The crash suite SIGKILLs processes at seeded random moments (and right when
  a reply reaches the platform) and restarts them; at the end every inbound
  message has exactly one committed turn and at least one reply, and every
  copy after the first carries the recovery marker.
- The lease suite kills processes holding work and never restarts them: the
  surviving process takes the work over once the leases expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.e2e.botprocess import BotProcess
from tests.fakes.whatsapp_server import FakeWhatsAppServer, RecordedRequest
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender
from tests.pgtest import fresh_schema, wait_until

pytestmark = pytest.mark.e2e

APP_SECRET = "e2e-app-secret"
TOKEN = "e2e-token"
LEASE_SECONDS = 2.0
SEED = int(os.environ.get("CHATFLOW_CRASH_SEED", "20251010"))
PROCESSES = 3
SESSIONS = 4
MESSAGES_PER_SESSION = 6
RANDOM_KILLS = 4
KILLS_ON_SEND = 2


def whatsapp_env(graph: FakeWhatsAppServer, dsn: str, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": dsn,
        "INSTANCE_LEASE_SECONDS": str(LEASE_SECONDS),
        "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
        "WHATSAPP_TOKEN": TOKEN,
        "WHATSAPP_VERIFY_TOKEN": "verify-me",
        "WHATSAPP_APP_SECRET": APP_SECRET,
        "WHATSAPP_API_BASE_URL": graph.base_url,
        "SHUTDOWN_GRACE_SECONDS": "2",
        **extra,
    }


def new_bot(directory: Path, env: dict[str, str]) -> BotProcess:
    """A bot process with its own working and data directory."""
    (directory / "data").mkdir(parents=True)
    return BotProcess(directory / "data", env)


@dataclass
class Fleet:
    """Bot processes on one database, each with its own fake Graph API."""

    dsn: str
    bots: list[BotProcess] = field(default_factory=list)
    graphs: list[FakeWhatsAppServer] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever any graph records a send."""

    def sends(self) -> list[RecordedRequest]:
        return [sent for graph in self.graphs for sent in graph.sent]

    def replies_to(self, wamid: str) -> list[str]:
        return [
            s.json["text"]["body"]
            for s in self.sends()
            if s.json.get("context", {}).get("message_id") == wamid
        ]

    def running(self) -> list[BotProcess]:
        return [bot for bot in self.bots if bot.proc is not None and bot.proc.returncode is None]

    async def post(self, payload: dict[str, Any], rng: random.Random) -> int:
        """Post like Meta: to any process, again and again until one answers 200."""
        attempts = 0
        async with asyncio.timeout(120):
            while True:
                attempts += 1
                bot = rng.choice(self.bots)
                sender = WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)
                try:
                    response = await sender.post_one(payload)
                except httpx.HTTPError:
                    response = None
                if response is not None and response.status_code == 200:
                    return attempts
                await asyncio.sleep(0.1)  # Meta's retry back-off, shortened

    async def wait_answered(self, wamids: list[str], within: float) -> None:
        try:
            async with asyncio.timeout(within):
                while not all(self.replies_to(w) for w in wamids):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            missing = [w for w in wamids if not self.replies_to(w)]
            logs = "\n".join(
                f"--- bot{i}\n" + "\n".join(b.log[-40:]) for i, b in enumerate(self.bots)
            )
            state = await database_state(self.dsn)
            raise AssertionError(f"unanswered: {missing}\n{state}\n{logs}") from None


@contextlib.asynccontextmanager
async def started_fleet(
    tmp_path: Path,
    count: int,
    env: dict[str, str],
    prepare: Callable[[FakeWhatsAppServer], None] | None = None,
) -> AsyncIterator[Fleet]:
    """``count`` bots on one fresh schema, each with its own fake Graph API (``prepare``d
    before its bot starts) and ``env``; started, and killed afterwards."""
    async with fresh_schema() as dsn:
        made = Fleet(dsn)
        try:
            for index in range(count):
                graph = FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token=TOKEN)
                made.graphs.append(graph)
                await graph.start()
                if prepare is not None:
                    prepare(graph)
                graph.on_send = lambda _request: made.changed.set()
                bot_env = whatsapp_env(graph, dsn, **env)
                made.bots.append(new_bot(tmp_path / f"bot{index}", bot_env))
            await asyncio.gather(*(bot.start() for bot in made.bots))
            yield made
        finally:
            for bot in made.bots:
                await bot.kill()
            for graph in made.graphs:
                await graph.stop()


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    async with fresh_schema() as dsn, contextlib.AsyncExitStack() as stack:
        made = Fleet(dsn)
        for _ in range(PROCESSES):
            graph = await stack.enter_async_context(
                FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token=TOKEN)
            )
            made.graphs.append(graph)
        yield made
        for bot in made.bots:
            if bot.proc is not None:
                await bot.kill()


async def database_state(dsn: str) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT state, count(*) FROM chatflow_inbox GROUP BY 1")
        inbox = {str(r[0]): int(r[1]) for r in rows}
        rows = await conn.fetch(
            "SELECT state, count(*) FROM chatflow_delivery_obligations GROUP BY 1"
        )
        ledger = {str(r[0]): int(r[1]) for r in rows}
        per_message = await conn.fetch(
            "SELECT message_ref, count(*) FROM chatflow_delivery_obligations GROUP BY 1"
        )
        users = await conn.fetch(
            "SELECT session_id, message_json FROM chatflow_messages WHERE role = 'user'"
        )
        errors = await conn.fetchval("SELECT count(*) FROM chatflow_inbox WHERE error IS NOT NULL")
    finally:
        await conn.close()
    return {
        "inbox": inbox,
        "ledger": ledger,
        "obligations_per_message": {r[0]: r[1] for r in per_message},
        "user_messages": [r[1] for r in users],
        "inbox_errors": errors,
    }


async def settled(dsn: str) -> bool:
    state = await database_state(dsn)
    return set(state["inbox"]) <= {"done"} and set(state["ledger"]) <= {"delivered"}


# -- the crash suite -------------------------------------------------------------------


async def test_three_processes_killed_at_random_answer_every_message_once(
    fleet: Fleet, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    for index, graph in enumerate(fleet.graphs):
        fleet.bots.append(new_bot(tmp_path / f"bot{index}", whatsapp_env(graph, fleet.dsn)))
    await asyncio.gather(*(bot.start() for bot in fleet.bots))

    done = asyncio.Event()
    kills: list[str] = []
    killed_on_send: set[str] = set()

    def on_send(index: int) -> Callable[[RecordedRequest], None]:
        def hook(request: RecordedRequest) -> None:
            fleet.changed.set()
            wamid = request.json.get("context", {}).get("message_id")
            bot = fleet.bots[index]
            if (
                done.is_set()
                or len(killed_on_send) >= KILLS_ON_SEND
                or wamid in killed_on_send
                or bot.proc is None
                or rng.random() > 0.3
            ):
                return
            # The reply reached the platform; the process dies before it hears so.
            killed_on_send.add(wamid)
            kills.append(f"bot{index} on send")
            with contextlib.suppress(ProcessLookupError):
                os.kill(bot.proc.pid, signal.SIGKILL)

        return hook

    for index, graph in enumerate(fleet.graphs):
        graph.on_send = on_send(index)

    up = asyncio.Event()  # set whenever a restarted process is up

    async def supervise(bot: BotProcess) -> None:
        """Restart the process whenever it dies, after a short, random downtime."""
        while not done.is_set():
            if bot.proc is not None:  # None: a start that was killed midway, reaped already
                await bot.proc.wait()
                await bot.kill()  # reap it
            await asyncio.sleep(rng.uniform(0.2, 1.5))  # the scenario's downtime
            if done.is_set():
                return
            with contextlib.suppress(AssertionError):  # killed again while starting: retry
                await bot.start()
                up.set()

    async def killer() -> None:
        for _ in range(RANDOM_KILLS):
            await asyncio.sleep(rng.uniform(0.8, 2.0))  # the scenario's schedule
            # Every process may be down at once (killed on a send, restarting on a busy
            # host): the kill waits for one to be up again rather than being skipped.
            while not (running := fleet.running()) and not done.is_set():
                up.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(up.wait(), 1.0)
            if done.is_set():
                return
            victim = rng.choice(running)
            assert victim.proc is not None
            kills.append(f"bot{fleet.bots.index(victim)} at random")
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim.proc.pid, signal.SIGKILL)

    wamids: list[str] = []

    async def conversation(number: int) -> None:
        sender = WebhookSender("http://unused", APP_SECRET)
        wa_id = f"1650555{number:04d}"
        for index in range(MESSAGES_PER_SESSION):
            payload = sender.text(f"session {number} message {index}", wa_id=wa_id)
            wamids.append(payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"])
            await fleet.post(payload, rng)
            await asyncio.sleep(rng.uniform(0, 0.4))  # the user's think time

    supervisors = [asyncio.create_task(supervise(bot)) for bot in fleet.bots]
    chaos = asyncio.create_task(killer())
    try:
        await asyncio.gather(*(conversation(n) for n in range(SESSIONS)))
        await chaos
        await fleet.wait_answered(wamids, within=60)
        await wait_until(lambda: settled(fleet.dsn), within=30)
    finally:
        done.set()
        for task in (chaos, *supervisors):
            task.cancel()
        await asyncio.gather(chaos, *supervisors, return_exceptions=True)
    # A last restart of every process (some were mid-start when the chaos ended),
    # with nothing left to do, then a clean stop of all of them.
    for bot in fleet.bots:
        await bot.kill()
    await asyncio.gather(*(bot.start() for bot in fleet.bots))
    exit_codes = [await bot.stop() for bot in fleet.bots]
    assert len(kills) >= RANDOM_KILLS, kills
    assert exit_codes == [0] * PROCESSES  # and a clean stop after all that
    state = await database_state(fleet.dsn)
    # Exactly one committed turn per inbound message...
    assert state["inbox"] == {"done": len(wamids)}
    assert state["inbox_errors"] == 0
    assert sorted(state["obligations_per_message"]) == sorted(wamids)
    assert set(state["obligations_per_message"].values()) == {1}
    texts = [json.loads(m)["content"] for m in state["user_messages"]]
    assert len(texts) == len(wamids) == len(set(texts))  # each question once, in one history
    # ...its reply delivered, and every extra copy marked.
    for wamid in wamids:
        replies = fleet.replies_to(wamid)
        assert replies, f"no reply for {wamid}"
        unmarked = [r for r in replies if not r.startswith(RECOVERED_MARKER)]
        assert len(unmarked) <= 1, (wamid, replies)
    # A process killed as its reply reached the platform: the copy resent is marked.
    for wamid in killed_on_send:
        replies = fleet.replies_to(wamid)
        assert len(replies) >= 2, replies
        assert any(r.startswith(RECOVERED_MARKER) for r in replies), replies
    logs = "\n".join(line for bot in fleet.bots for line in bot.log)
    assert "16505550000" not in logs and "message 0" not in logs


# -- leases ----------------------------------------------------------------------------


class HangingModel:
    """An OpenAI-compatible endpoint that accepts requests and never answers."""

    def __init__(self) -> None:
        self.requests = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._held: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> HangingModel:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._held:
            writer.close()
        await self._server.wait_closed()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._held.append(writer)
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            self.requests.set()
            await reader.read()  # until the client goes away


async def test_work_of_killed_processes_is_taken_over_without_a_restart(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Process 0 dies inside a turn (its model never answers), process 1 dies while a
    reply is on its way to the platform; neither comes back. Process 2 finishes both
    once their leases expire."""
    async with HangingModel() as model:
        envs = [
            whatsapp_env(
                fleet.graphs[0],
                fleet.dsn,
                DEFAULT_MODEL="gpt-4o-mini",
                OPENAI_API_KEY="sk-test",
                OPENAI_BASE_URL=model.base_url,
            ),
            whatsapp_env(fleet.graphs[1], fleet.dsn),
            whatsapp_env(fleet.graphs[2], fleet.dsn),
        ]
        for index, env in enumerate(envs):
            fleet.bots.append(new_bot(tmp_path / f"bot{index}", env))
        await asyncio.gather(*(bot.start() for bot in fleet.bots))
        stuck, sending, survivor = fleet.bots
        sender = WebhookSender(f"{stuck.url}/webhooks/whatsapp", APP_SECRET)

        fleet.graphs[1].inject_hang(1)
        in_send = sender.text("and order #2002?", wa_id="16505550002")
        to_sending = WebhookSender(f"{sending.url}/webhooks/whatsapp", APP_SECRET)
        assert (await to_sending.post_one(in_send)).status_code == 200
        await fleet.graphs[1].wait_for_hung(1, within=20)

        in_turn = sender.text("where is my order #1001?", wa_id="16505550001")
        assert (await sender.post_one(in_turn)).status_code == 200
        await asyncio.wait_for(model.requests.wait(), 20)
        # Both die before either lease can expire: only process 2 may take their work
        # over (were process 1 still alive, it could run process 0's turn itself).
        await sending.kill()
        await stuck.kill()

        turn_reply = await fleet.graphs[2].wait_for_sent(1, within=LEASE_SECONDS * 10)
        sent = await fleet.graphs[2].wait_for_sent(2, within=LEASE_SECONDS * 10)
        assert turn_reply
        by_order = {("1001" if "1001" in s.json["text"]["body"] else "2002"): s for s in sent}
        assert set(by_order) == {"1001", "2002"}
        # The turn never committed in process 0: process 2 ran it, a first reply, unmarked.
        assert not by_order["1001"].json["text"]["body"].startswith(RECOVERED_MARKER)
        # Process 1 may have delivered its reply before it died: the resend is marked.
        assert by_order["2002"].json["text"]["body"].startswith(RECOVERED_MARKER)
        assert stuck.proc is None and sending.proc is None  # no restart did this
        assert survivor.proc is not None
        await wait_until(lambda: settled(fleet.dsn), within=20)
        log = "\n".join(survivor.log)
        assert "took over 1 message" in log
