"""The world the proof suite runs the real bot in: three fakes, a scripted model, checks.

``World`` starts the fake Telegram Bot API, the fake WhatsApp Graph API and
the fake OpenAI server on 127.0.0.1, and builds ``BotProcess`` objects that
talk to all three with ``AGENTS_MODULE=tests.e2e.proof_agents``. It records
every inbound message the test sends (``Inbound``), maps every reply the fakes
received back to the message it answers (replies quote their inbound message:
WhatsApp ``context.message_id``, Telegram ``reply_parameters``), and reads the
SQLite file after a run (``read_database``) to check the durable state.

``ProofModel`` is the fake model's brain. Every inbound text starts with a
token (``Qwa003N007``); the model answers ``Rwa003N007 #<n>`` where ``n``
counts model answers, so two committed turns for one message can never
produce the same reply text. Words after the token steer it: ``!tool``,
``!handoff`` and ``!fault:<kind>`` (see ``FAULTS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import sqlite3
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bot.core.messages import Message, Role
from bot.gateway.ledger.obligations import RECOVERED_MARKER
from tests.e2e.botprocess import BotProcess
from tests.fakes.openai_server import FakeOpenAIServer, FakeResponse, RecordedRequest
from tests.fakes.telegram_server import FakeTelegramServer
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, WebhookSender

__all__ = [
    "APP_SECRET",
    "FAULTS",
    "FULL",
    "LONG_UNIT",
    "SEED",
    "VERIFY_TOKEN",
    "Database",
    "Inbound",
    "ProofModel",
    "Reply",
    "World",
    "history_problems",
    "log_leaks",
    "metrics",
    "post_until_accepted",
    "read_database",
    "session_snapshot",
    "token_of",
]

FULL = os.environ.get("CHATFLOW_PROOF", "").lower() == "full"
"""``CHATFLOW_PROOF=full`` (``make proof``): the full-size scenarios; else the reduced ones."""
SEED = int(os.environ.get("CHATFLOW_PROOF_SEED", "20240611"))
"""Seed of every random choice the suite makes (kill schedule, traffic, duplicates)."""

APP_SECRET = "proof-app-secret"
VERIFY_TOKEN = "proof-verify-token"
WA_TOKEN = "proof-graph-token"
TOKEN_RE = re.compile(r"\b[QR]([a-z]{2}\d{3}N\d{3,4})\b")

LONG_UNIT = (
    "שלום\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466مرحبا\U0001f1ea\U0001f1f8"
)
"""Hebrew, a ZWJ family emoji, Arabic and a flag, no spaces: ``!long:<pad>`` repeats it
400 times after ``pad`` x's, so platform limits cut through it at shifting offsets."""

FAULTS = (
    "429x1",
    "500x1",
    "500",
    "malformedx1",
    "malformed",
    "nochoicesx1",
    "slow",
    "401",
    "badjson",
    "badargs",
    "unknowntool",
    "ghost",
    "raise",
    "loop",
)
"""Model faults ``ProofModel`` can play (``!fault:<kind>``); ``xN``: only the first N calls."""


def token_of(text: str) -> str | None:
    """The message token in an inbound text or a model reply, if any."""
    found = TOKEN_RE.search(text)
    return found.group(1) if found else None


# ---------------------------------------------------------------------------- the model


class ProofModel:
    """Deterministic responder for ``FakeOpenAIServer`` (see the module docstring)."""

    def __init__(self, *, delay: float = 0.0, slow_delay: float = 5.0) -> None:
        self.delay = delay
        """Seconds every answer takes (a slow model)."""
        self.slow_delay = slow_delay
        """Seconds a ``!fault:slow`` answer takes (longer than ``MODEL_TIMEOUT_SECONDS``)."""
        self.answers = 0
        """Final (text) answers given."""
        self.calls: Counter[str] = Counter()
        """Requests per token."""
        self.first_calls: Counter[str] = Counter()
        """Requests per token that start a turn (last message is the user's)."""

    def __call__(self, record: RecordedRequest) -> FakeResponse:
        messages = record.messages
        last_user = max(
            (i for i, m in enumerate(messages) if m.get("role") == "user"), default=None
        )
        if last_user is None:
            return self._timed(FakeOpenAIServer.reply("no user message?"))
        text = str(messages[last_user].get("content") or "")
        token = token_of(text) or "none"
        after = messages[last_user + 1 :]
        self.calls[token] += 1
        fault = re.search(r"!fault:(\w+)", text)
        kind = fault.group(1) if fault else None
        if not after:
            self.first_calls[token] += 1
        if kind is not None:
            scripted = self._fault(kind, token, after, record)
            if scripted is not None:
                return scripted
        long = re.search(r"!long:(\d+)", text)
        if long is not None and not after:
            self.answers += 1
            body = "x" * int(long.group(1)) + LONG_UNIT * 400
            return self._timed(FakeOpenAIServer.reply(f"R{token} #{self.answers} {body}"))
        if not after and "!poison" in text:
            return self._timed(FakeOpenAIServer.call("crash_process"))
        if not after and "!tool" in text:
            return self._timed(FakeOpenAIServer.call("lookup_order", order_id=token))
        if not after and "!handoff" in text:
            return self._timed(FakeOpenAIServer.call("transfer_to_specialist"))
        return self._answer(token, after)

    def _answer(self, token: str, after: Sequence[dict[str, Any]]) -> FakeResponse:
        self.answers += 1
        results = sum(1 for m in after if m.get("role") == "tool")
        suffix = f" after {results} tool result(s)" if results else ""
        return self._timed(FakeOpenAIServer.reply(f"R{token} #{self.answers}{suffix}"))

    def _timed(self, response: FakeResponse) -> FakeResponse:
        response.delay = max(response.delay, self.delay)
        return response

    def _fault(
        self, kind: str, token: str, after: Sequence[dict[str, Any]], record: RecordedRequest
    ) -> FakeResponse | None:
        base, _, limit = kind.partition("x")
        first = self.first_calls[token]
        if limit and first > int(limit):
            return None  # the fault is spent: answer normally
        if base == "429" and not after:
            return FakeOpenAIServer.rate_limited(retry_after=0.05)
        if base == "500" and not after:
            return FakeOpenAIServer.error(500, "scripted server error")
        if base == "malformed" and not after:
            return FakeOpenAIServer.malformed()
        if base == "nochoices" and not after:
            body = FakeOpenAIServer.completion("x")
            body["choices"] = []
            return FakeResponse(body=body)
        if base == "slow" and not after:
            return FakeResponse(body=FakeOpenAIServer.completion("too late"), delay=self.slow_delay)
        if base == "401":
            return FakeOpenAIServer.error(401, "Incorrect API key provided", code="invalid_api_key")
        if not after and base == "badjson":
            call = FakeOpenAIServer.tool_call("lookup_order", "{not json")
            return FakeOpenAIServer.tool_calls(call)
        if not after and base == "badargs":
            return FakeOpenAIServer.call("lookup_order", wrong_field=1)
        if not after and base == "unknowntool":
            return FakeOpenAIServer.call("no_such_tool", x=1)
        if not after and base == "ghost":
            return FakeOpenAIServer.call("transfer_to_ghost")
        if not after and base == "raise":
            return FakeOpenAIServer.call("explode", reason="scripted")
        if base == "loop":
            return FakeOpenAIServer.call("lookup_order", order_id=token)
        return None


# ---------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Inbound:
    """One message the test sent as a user."""

    platform: str
    """``telegram`` or ``whatsapp``."""
    chat_id: str
    """Raw chat id (Telegram chat id, WhatsApp ``wa_id``)."""
    message_id: str
    """The bot's dedup id (``telegram:<chat>:<id>`` or the wamid)."""
    platform_message_id: str
    """What a reply quotes (Telegram message id, wamid)."""
    text: str
    """Text as sent."""
    session: str
    """Label of the conversation it belongs to (tests' own grouping)."""

    @property
    def token(self) -> str | None:
        """Its token (see ``token_of``)."""
        return token_of(self.text)


@dataclass(frozen=True)
class Reply:
    """One message the bot sent, as a fake received it."""

    platform: str
    """``telegram`` or ``whatsapp``."""
    chat_id: str
    """Raw chat id it was sent to."""
    text: str
    """Text as sent."""
    reply_to: str | None
    """Platform id of the message it quotes (first part of a reply only)."""
    seq: int = 0
    """Position among the messages the platform's fake received."""

    @property
    def marked(self) -> bool:
        """Whether it carries the recovery marker."""
        return self.text.startswith(RECOVERED_MARKER)

    @property
    def content(self) -> str:
        """Text without the marker."""
        return self.text.removeprefix(RECOVERED_MARKER)


# ---------------------------------------------------------------------------- the world


class World:
    """Three fakes, a model brain, the inbound log, and bot processes built on them."""

    def __init__(self, root: Path, model: ProofModel | None = None) -> None:
        self.root = root
        self.model = model or ProofModel()
        self.telegram = FakeTelegramServer()
        self.graph = FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID, token=WA_TOKEN)
        self.openai = FakeOpenAIServer(responder=self.model)
        self.inbound: list[Inbound] = []
        self._tg_message_ids: dict[int, int] = defaultdict(lambda: 100)
        self._wamids = 0
        self._bots: list[BotProcess] = []
        self.send_observers: list[Callable[[], None]] = []
        """Called whenever a fake platform received a message from the bot."""
        self._activity = asyncio.Event()
        self.telegram.on_send = lambda _sent: self._sent()
        self.graph.on_send = lambda _request: self._sent()

    async def __aenter__(self) -> World:
        await self.telegram.start()
        await self.graph.start()
        await self.openai.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for bot in self._bots:
            # Kept with pytest's tmp_path for a post-mortem; also ends a bot left running.
            with contextlib.suppress(Exception):
                await bot.kill()
            (bot.data_dir.parent / f"{bot.data_dir.name}.log").write_text("\n".join(bot.log))
        for server in (self.openai, self.graph, self.telegram):
            with contextlib.suppress(Exception):
                await server.stop()

    # -- bots ------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a bot talking to every fake."""
        env = {
            "WHATSAPP_PHONE_ID": PHONE_NUMBER_ID,
            "WHATSAPP_TOKEN": WA_TOKEN,
            "WHATSAPP_VERIFY_TOKEN": VERIFY_TOKEN,
            "WHATSAPP_APP_SECRET": APP_SECRET,
            "WHATSAPP_API_BASE_URL": self.graph.base_url,
            "TELEGRAM_BOT_TOKEN": self.telegram.token,
            "TELEGRAM_API_BASE_URL": self.telegram.base_url,
            "OPENAI_API_KEY": self.openai.api_key,
            "OPENAI_BASE_URL": self.openai.base_url,
            "DEFAULT_MODEL": "gpt-4o-mini",
            "AGENTS_MODULE": "tests.e2e.proof_agents",
        }
        env.update(extra)
        return env

    def bot(self, name: str = "data", **extra: str) -> BotProcess:
        """A bot process (not started) with its own data directory under ``root``."""
        bot = BotProcess(self.root / name, self.env(**extra))
        self._bots.append(bot)
        return bot

    def sender(self, bot: BotProcess) -> WebhookSender:
        """Meta's side of ``bot``'s WhatsApp webhook."""
        return WebhookSender(f"{bot.url}/webhooks/whatsapp", APP_SECRET)

    # -- inbound -----------------------------------------------------------------

    def next_wamid(self) -> str:
        """A fresh, unique wamid."""
        self._wamids += 1
        return f"wamid.PROOF{self._wamids:06d}{os.getpid():08d}"

    def whatsapp_text(
        self, sender: WebhookSender, wa_id: str, text: str, session: str
    ) -> tuple[dict[str, Any], Inbound]:
        """A signed-ready WhatsApp text body and its ``Inbound`` record (not yet posted)."""
        wamid = self.next_wamid()
        payload = sender.text(text, wa_id=wa_id, wamid=wamid)
        inbound = Inbound("whatsapp", wa_id, wamid, wamid, text, session)
        self.inbound.append(inbound)
        return payload, inbound

    def telegram_text(self, chat_id: int, text: str, session: str) -> Inbound:
        """Queue a private Telegram text on the fake Bot API; returns its record."""
        self._tg_message_ids[chat_id] += 1
        message_id = self._tg_message_ids[chat_id]
        self.telegram.push_update(telegram_update(chat_id, message_id, text))
        inbound = Inbound(
            "telegram",
            str(chat_id),
            f"telegram:{chat_id}:{message_id}",
            str(message_id),
            text,
            session,
        )
        self.inbound.append(inbound)
        return inbound

    # -- replies -----------------------------------------------------------------

    def replies(self) -> list[Reply]:
        """Every message the bot sent on both platforms, in arrival order per platform."""
        result: list[Reply] = []
        for seq, sent in enumerate(self.telegram.sent):
            reply = sent.reply_parameters or {}
            quoted = reply.get("message_id")
            quoted_id = None if quoted is None else str(quoted)
            result.append(Reply("telegram", str(sent.chat_id), sent.text, quoted_id, seq))
        for seq, request in enumerate([*self.graph.sent, *self.graph.hung]):
            body = request.json
            context = body.get("context") or {}
            result.append(
                Reply(
                    "whatsapp",
                    str(body.get("to")),
                    str((body.get("text") or {}).get("body", "")),
                    context.get("message_id"),
                    seq,
                )
            )
        return result

    def replies_to(self, inbound: Iterable[Inbound]) -> dict[Inbound, list[Reply]]:
        """Replies grouped by the inbound message they quote (every inbound gets a list)."""
        index: dict[tuple[str, str, str], Inbound] = {
            (i.platform, i.chat_id, i.platform_message_id): i for i in inbound
        }
        grouped: dict[Inbound, list[Reply]] = {i: [] for i in index.values()}
        for reply in self.replies():
            if reply.reply_to is None:
                continue
            target = index.get((reply.platform, reply.chat_id, reply.reply_to))
            if target is not None:
                grouped[target].append(reply)
        return grouped

    def unanswered(self, inbound: Iterable[Inbound]) -> list[Inbound]:
        """Inbound messages no reply quotes yet."""
        return [i for i, replies in self.replies_to(inbound).items() if not replies]

    async def wait_answered(
        self, inbound: Sequence[Inbound], within: float, *, settle: BotProcess | None = None
    ) -> list[Inbound]:
        """Wait until every message in ``inbound`` has a reply; returns the unanswered ones.

        With ``settle``, also wait until that bot's database owes nothing (no
        ledger row left to send, no inbox row left to run).
        """
        deadline = time.monotonic() + within
        while True:
            missing = self.unanswered(inbound)
            settled = True
            if not missing and settle is not None:
                settled = await asyncio.to_thread(_settled, settle.data_dir / "chatflow.db")
            if (not missing and settled) or time.monotonic() > deadline:
                return missing
            await self._changed(0.1)

    def _sent(self) -> None:
        event, self._activity = self._activity, asyncio.Event()
        event.set()
        for observer in self.send_observers:
            observer()

    async def _changed(self, at_most: float) -> None:
        """Return when a fake platform received a message, or after ``at_most`` seconds."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._activity.wait(), at_most)


def telegram_update(chat_id: int, message_id: int, text: str, **message: Any) -> dict[str, Any]:
    """A private-chat text update as the Bot API sends it (no ``update_id``)."""
    body: dict[str, Any] = {
        "message_id": message_id,
        "date": int(time.time()),
        "chat": {"id": chat_id, "type": "private", "first_name": "Proof"},
        "from": {"id": chat_id, "is_bot": False, "first_name": "Proof"},
        "text": text,
    }
    body.update(message)
    return {"message": body}


def _settled(db: Path) -> bool:
    if not db.exists():
        return False
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
        try:
            open_rows = conn.execute(
                "SELECT COUNT(*) FROM chatflow_delivery_obligations "
                "WHERE state IN ('pending', 'attempting', 'failed')"
            ).fetchone()[0]
            received = conn.execute(
                "SELECT COUNT(*) FROM chatflow_inbox WHERE state = 'received'"
            ).fetchone()[0]
        except sqlite3.OperationalError:
            return False
    return int(open_rows) == 0 and int(received) == 0


# ---------------------------------------------------------------------------- the database


@dataclass
class Database:
    """What a bot left on disk, read after it stopped."""

    histories: dict[str, list[Message]] = field(default_factory=dict)
    """Session id -> history in order."""
    inbox: dict[str, tuple[str, str | None, str]] = field(default_factory=dict)
    """Inbound message id -> (state, error, session id)."""
    obligations: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    """Inbound message id -> [(obligation id, state, content)]."""
    processed: set[str] = field(default_factory=set)
    """Dedup ids claimed."""
    session_keys: dict[str, str] = field(default_factory=dict)
    """Session id -> session key (from the inbox)."""
    tables: dict[str, int] = field(default_factory=dict)
    """Row count of every chatflow table."""

    def session_of(self, message_id: str) -> str | None:
        """Session id an inbound message was routed to."""
        row = self.inbox.get(message_id)
        return row[2] if row else None


def read_database(path: Path) -> Database:
    """Read the bot's SQLite file (the bot must be stopped or idle)."""
    db = Database()
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as conn:
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'chatflow_%'"
        ):
            db.tables[str(name)] = int(conn.execute(f"SELECT COUNT(*) FROM {name}").fetchone()[0])
        for session_id, message_json in conn.execute(
            "SELECT session_id, message_json FROM chatflow_messages ORDER BY session_id, seq"
        ):
            db.histories.setdefault(str(session_id), []).append(
                Message.model_validate_json(message_json)
            )
        for (session_id,) in conn.execute("SELECT session_id FROM chatflow_sessions"):
            db.histories.setdefault(str(session_id), [])
        if "chatflow_inbox" in db.tables:
            for message_id, state, error, session_id, session_key in conn.execute(
                "SELECT message_id, state, error, session_id, session_key FROM chatflow_inbox"
            ):
                db.inbox[str(message_id)] = (str(state), error, str(session_id))
                db.session_keys[str(session_id)] = str(session_key)
        if "chatflow_delivery_obligations" in db.tables:
            for obligation_id, ref, state, content in conn.execute(
                "SELECT obligation_id, message_ref, state, content "
                "FROM chatflow_delivery_obligations ORDER BY created_at"
            ):
                db.obligations.setdefault(str(ref), []).append(
                    (str(obligation_id), str(state), str(content))
                )
        db.processed = {
            str(r[0]) for r in conn.execute("SELECT message_id FROM chatflow_processed_messages")
        }
    return db


def session_snapshot(path: Path, session_id: str) -> tuple[Any, ...]:
    """A session exactly as stored: its row (agent, metadata) and every message's JSON."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)) as conn:
        row = conn.execute(
            "SELECT active_agent_name, metadata_json FROM chatflow_sessions WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        messages = conn.execute(
            "SELECT seq, role, message_json FROM chatflow_messages WHERE session_id = ? "
            "ORDER BY seq",
            (session_id,),
        ).fetchall()
    return (row, tuple(messages))


def history_problems(history: Sequence[Message], max_turns: int) -> list[str]:
    """Where ``history`` breaks DESIGN §3.2's pruning rules (empty: it is valid).

    Also checks what a committed turn always leaves: every MODEL tool call is
    answered by a TOOL message right after it, and every turn ends with a MODEL
    text answer.
    """
    problems: list[str] = []
    roles = [m.role for m in history]
    first_other = next((i for i, r in enumerate(roles) if r is not Role.SYSTEM), len(roles))
    if any(r is Role.SYSTEM for r in roles[first_other:]):
        problems.append("a SYSTEM message after the first non-system message")
    rest = history[first_other:]
    if rest and rest[0].role is not Role.USER:
        problems.append(f"first non-system message is {rest[0].role.value}, not user")
    turns = sum(1 for m in rest if m.role is Role.USER)
    if turns > max_turns:
        problems.append(f"{turns} turns kept, more than max_turns={max_turns}")
    calls: dict[str, int] = {}
    for index, message in enumerate(rest):
        if message.role is Role.MODEL:
            for call in message.tool_calls:
                calls[call.id] = index
        if message.role is Role.TOOL and message.tool_call_id not in calls:
            problems.append(f"TOOL message {index} answers no kept tool call")
    for index, message in enumerate(rest):
        if message.role is not Role.MODEL or not message.tool_calls:
            continue
        answered = set()
        for follower in rest[index + 1 :]:
            if follower.role is not Role.TOOL:
                break
            answered.add(follower.tool_call_id)
        missing = {c.id for c in message.tool_calls} - answered
        if missing:
            problems.append(f"MODEL message {index} has unanswered tool calls")
    starts = [i for i, m in enumerate(rest) if m.role is Role.USER] + [len(rest)]
    for begin, end in itertools.pairwise(starts):
        last = rest[end - 1]
        if end - begin < 2 or last.role is not Role.MODEL or last.tool_calls:
            problems.append(f"turn at {begin} does not end with a model answer")
    return problems


def log_leaks(log: Iterable[str], secrets: Iterable[str]) -> list[str]:
    """Log lines at INFO or above that contain any of ``secrets`` (raw ids, texts)."""
    needles = [s for s in set(secrets) if s]
    leaks = []
    for line in log:
        if " DEBUG " in line:
            continue
        for needle in needles:
            if needle in line:
                leaks.append(f"{needle!r} in: {line[:200]}")
    return leaks


async def post_until_accepted(
    sender: WebhookSender,
    payload: dict[str, Any] | bytes,
    *,
    pause: float = 0.05,
    within: float = 120.0,
) -> tuple[int, list[int]]:
    """POST like Meta does until a 200 (retrying refusals and dead sockets).

    Returns (attempts, statuses seen).
    """
    deadline = time.monotonic() + within
    statuses: list[int] = []
    attempts = 0
    while True:
        attempts += 1
        try:
            response = await sender.post_one(payload)
            statuses.append(response.status_code)
            if response.status_code == 200:
                return attempts, statuses
        except httpx.HTTPError:
            statuses.append(0)
        if time.monotonic() > deadline:
            raise AssertionError(f"webhook never accepted: statuses {statuses[-10:]}")
        await asyncio.sleep(pause)


async def metrics(bot: BotProcess) -> Counter[str]:
    """The bot's ``/metrics``, summed over labels (``chatflow_dedup_hits_total`` ...)."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{bot.url}/metrics")
    totals: Counter[str] = Counter()
    for line in response.text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        totals[name.split("{", 1)[0]] += int(float(value))
    return totals
