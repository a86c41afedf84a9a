"""Proof, crash suite: the bot is SIGKILLed at random moments while people keep writing.

Conversations on WhatsApp (signed webhooks, Meta-style retries until 200) and
Telegram (long polling) run while ``CrashDriver`` kills the bot at seeded
moments -- on a model request, on a reply reaching the platform, right after a
webhook was accepted, on a poll, or after a delay from spawn -- and restarts
it. At the end every inbound message must have exactly one committed turn and
its reply delivered; every extra copy of a reply must carry the recovery
marker; every history must pass the pruning invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from bot.gateway.gateway import Replies
from bot.gateway.inbox import MAX_RECOVERIES
from tests.e2e import proof_report
from tests.e2e.botprocess import BotProcess
from tests.e2e.proof_driver import CrashDriver, kill_schedule
from tests.e2e.proof_world import (
    FULL,
    SEED,
    Inbound,
    World,
    history_problems,
    log_leaks,
    post_until_accepted,
    read_database,
)
from tests.fakes.whatsapp_webhook import WebhookSender

pytestmark = pytest.mark.e2e

SESSIONS_PER_PLATFORM = 12 if FULL else 2
MESSAGES_PER_SESSION = 10 if FULL else 5
KILLS = 24 if FULL else 4
MAX_TURNS = 4
MODEL_DELAY = 0.15


def _text(label: str, index: int, rng: random.Random) -> str:
    directive = rng.choices(["", "!tool", "!handoff"], weights=[7, 2, 1])[0]
    return f"Q{label}N{index:03d} {directive} please answer message {index} of {label}".replace(
        "  ", " "
    )


async def _whatsapp_session(
    world: World,
    sender: WebhookSender,
    driver: CrashDriver,
    label: str,
    wa_id: str,
    think: float,
    stats: Counter[str],
) -> None:
    rng = random.Random(f"{SEED}-{label}")
    for index in range(MESSAGES_PER_SESSION):
        payload, _ = world.whatsapp_text(sender, wa_id, _text(label, index, rng), label)
        attempts, _ = await post_until_accepted(sender, payload, within=300)
        stats["webhook posts"] += attempts
        stats["webhook posts refused or cut by a kill"] += attempts - 1
        driver.observe("accept")
        await asyncio.sleep(rng.uniform(0, 2 * think))


async def _telegram_session(
    world: World, label: str, chat_id: int, think: float, stats: Counter[str]
) -> None:
    rng = random.Random(f"{SEED}-{label}")
    for index in range(MESSAGES_PER_SESSION):
        world.telegram_text(chat_id, _text(label, index, rng), label)
        stats["telegram updates queued"] += 1
        await asyncio.sleep(rng.uniform(0, 2 * think))


@pytest.mark.timeout(900 if FULL else 120)
async def test_proof_crash_every_message_answered_once_through_random_kills(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    plans = kill_schedule(rng, KILLS)
    async with World(tmp_path) as world:
        world.model.delay = MODEL_DELAY
        bot = world.bot(MAX_TURNS=str(MAX_TURNS), SHUTDOWN_GRACE_SECONDS="5")
        driver = CrashDriver(bot, plans, fallback_after=3.0)
        world.openai.on_request = lambda _r: driver.observe("model")
        world.send_observers.append(lambda: driver.observe("send"))
        world.telegram.on_request = lambda r: (
            driver.observe("poll") if r.method == "getUpdates" else None
        )
        sender = world.sender(bot)
        think = KILLS * 2.0 / MESSAGES_PER_SESSION
        stats: Counter[str] = Counter()
        traffic = [
            _whatsapp_session(world, sender, driver, f"wa{s:03d}", f"49155500{s:05d}", think, stats)
            for s in range(SESSIONS_PER_PLATFORM)
        ] + [
            _telegram_session(world, f"tg{s:03d}", 4242000000 + s, think, stats)
            for s in range(SESSIONS_PER_PLATFORM)
        ]
        traffic_task = asyncio.gather(*traffic)
        try:
            records = await driver.run()
            await asyncio.wait_for(traffic_task, 300)
        finally:
            traffic_task.cancel()
        inbound = list(world.inbound)
        try:
            missing = await world.wait_answered(inbound, within=120, settle=bot)
            exit_code = await bot.stop()
        finally:
            (tmp_path / "bot.log").write_text("\n".join(bot.log))
        grouped = world.replies_to(inbound)
        db = read_database(bot.data_dir / "chatflow.db")

    # -- what the users saw ------------------------------------------------------
    lost = [i.token for i in inbound if not grouped[i]]
    unmarked_dupes = {
        i.token: n for i in inbound if (n := sum(1 for r in grouped[i] if not r.marked)) > 1
    }
    two_answers = {
        i.token: sorted({r.content for r in grouped[i]})
        for i in inbound
        if len({r.content for r in grouped[i]}) > 1
    }
    marked_copies = sum(1 for i in inbound for r in grouped[i] if r.marked)
    wrong_answers = [
        i.token
        for i in inbound
        if grouped[i] and not all(r.content.startswith(f"R{i.token} ") for r in grouped[i])
    ]
    assert not missing, f"unanswered: {[i.token for i in missing]}"
    assert lost == [], f"lost: {lost}"
    assert unmarked_dupes == {}, f"duplicates without the marker: {unmarked_dupes}" + "".join(
        f"\n{i.token}: {[(r.seq, r.chat_id, r.reply_to, r.text[:60]) for r in grouped[i]]}"
        for i in inbound
        if i.token in unmarked_dupes
    )
    assert two_answers == {}, f"two different committed answers: {two_answers}"
    assert wrong_answers == [], f"replies that answer another message: {wrong_answers}"

    # -- what the database says -------------------------------------------------------
    not_done = {
        i.token: db.inbox.get(i.message_id)
        for i in inbound
        if (db.inbox.get(i.message_id) or ("?", None, ""))[:2] != ("done", None)
    }
    assert not_done == {}, f"inbox rows not done cleanly: {not_done}"
    obligations = {i.token: db.obligations.get(i.message_id, []) for i in inbound}
    not_one = {t: rows for t, rows in obligations.items() if len(rows) != 1}
    assert not_one == {}, f"inbound messages without exactly one committed reply: {not_one}"
    undelivered = {t: rows[0][1] for t, rows in obligations.items() if rows[0][1] != "delivered"}
    assert undelivered == {}, f"replies not delivered per the ledger: {undelivered}"
    assert all(i.message_id in db.processed for i in inbound)

    by_session: dict[str, list[Inbound]] = {}
    for message in inbound:
        by_session.setdefault(message.session, []).append(message)
    history_faults: dict[str, list[str]] = {}
    for label, messages in by_session.items():
        session_id = db.session_of(messages[0].message_id)
        assert session_id is not None
        assert all(db.session_of(m.message_id) == session_id for m in messages)
        history = db.histories.get(session_id, [])
        problems = history_problems(history, MAX_TURNS)
        users = [m.content for m in history if m.role.value == "user"]
        expected = [m.text for m in messages][-MAX_TURNS:]
        if users != expected:
            problems.append(f"user turns {users} != last sent {expected}")
        answers = [m.content for m in history if m.role.value == "model" and not m.tool_calls]
        delivered = [grouped[m][0].content for m in messages][-MAX_TURNS:]
        if answers != delivered:
            problems.append(f"committed answers {answers} != delivered {delivered}")
        if problems:
            history_faults[label] = problems
    assert history_faults == {}, history_faults
    assert world.openai.validation_errors == [], world.openai.validation_errors

    secrets = {i.chat_id for i in inbound} | {i.token or "" for i in inbound}
    secrets |= {i.text.split(" ", 1)[1] for i in inbound}
    leaks = log_leaks(bot.log, secrets)
    assert leaks == [], leaks
    assert exit_code == 0

    startup_kills = sum(1 for r in records if r.during_startup)
    fired = Counter(r.fired_by for r in records)
    proof_report.record(
        "crash",
        {
            "conversations (WhatsApp + Telegram)": f"{len(by_session)} "
            f"({SESSIONS_PER_PLATFORM} + {SESSIONS_PER_PLATFORM})",
            "inbound messages": len(inbound),
            "SIGKILLs": len(records),
            "kills during start-up/recovery": startup_kills,
            "kills by trigger": ", ".join(f"{k} {v}" for k, v in sorted(fired.items())),
            "model requests / replies reaching the platforms": (
                f"{driver.counts['model']} / {driver.counts['send']}"
            ),
            "webhook posts (refused or cut by a kill)": (
                f"{stats['webhook posts']} ({stats['webhook posts refused or cut by a kill']})"
            ),
            "committed turns per inbound message": "exactly 1 (all)",
            "replies delivered (first copies)": len(inbound) - len(lost),
            "extra copies delivered, all with the recovery marker": marked_copies,
            "duplicates delivered without marker": sum(unmarked_dupes.values()),
            "lost messages": len(lost),
            "sessions violating pruning invariants": len(history_faults),
            "log lines with raw ids or message text": len(leaks),
        },
        details=[
            f"Kill schedule (seed {SEED}, max_turns {MAX_TURNS}, model delay "
            f"{MODEL_DELAY} s): "
            + "; ".join(
                f"{n + 1}: {r.plan.describe()} -> {r.fired_by}"
                + (" (start-up)" if r.during_startup else "")
                + f", down {r.plan.downtime_ms} ms"
                for n, r in enumerate(records)
            )
            + "."
        ],
        seconds=time.monotonic() - started,
        about=__doc__,
    )


_POISON_ABOUT = """Poison message.

One message makes its turn kill the process (a tool that SIGKILLs the bot);
four more wait behind it (one turn at a time). The bot is restarted each time
it dies, as a supervisor would. The crash loop must end after a bounded
number of crashes with one apology for the poison message, and every message
that merely waited behind it, through all those crashes, must be answered
normally.
"""


async def _supervise(
    world: World, bot: BotProcess, inbound: list[Inbound], max_restarts: int
) -> int:
    """Restart the bot whenever it dies (as systemd would) until ``inbound`` is answered."""
    restarts = 0
    while True:
        proc = bot.proc
        assert proc is not None
        exited = asyncio.ensure_future(proc.wait())
        answered = asyncio.ensure_future(world.wait_answered(inbound, within=20, settle=bot))
        done, _ = await asyncio.wait({exited, answered}, return_when=asyncio.FIRST_COMPLETED)
        if answered in done:
            exited.cancel()
            return restarts
        answered.cancel()
        await asyncio.gather(answered, return_exceptions=True)
        restarts += 1
        if restarts > max_restarts:
            raise AssertionError(f"still crashing after {max_restarts} restarts")
        await bot.kill()  # reap it
        with contextlib.suppress(AssertionError):  # it may die again before it is ready
            await bot.start()
        if bot.proc is None or bot.proc.returncode is not None:
            await bot.kill()
            await bot.start()


@pytest.mark.timeout(120)
async def test_proof_crash_poison_message_gets_an_apology_and_spares_the_queue(
    tmp_path: Path,
) -> None:
    """A message whose turn kills the process, and four messages queued behind it.

    The bot is restarted each time it dies. The poison message must end the
    crash loop after ``MAX_RECOVERIES`` starts with one apology; the messages
    that merely waited behind it, however many crashes they sat through, must
    be answered normally.
    """
    started = time.monotonic()
    async with World(tmp_path) as world:
        bot = world.bot(MAX_CONCURRENT_TURNS="1")
        await bot.start()
        sender = world.sender(bot)
        world.model.delay = 1.0  # the poison turn waits for its model while the rest arrive
        inbound = []
        for index, text in enumerate(
            ["Qpz000N000 !poison", *(f"Qpz{n:03d}N000 waiting {n}" for n in range(1, 5))]
        ):
            payload, message = world.whatsapp_text(sender, f"49155530{index:04d}", text, "pz")
            assert (await sender.post_one(payload)).status_code == 200
            inbound.append(message)
        world.model.delay = 0.0
        restarts = await _supervise(world, bot, inbound, max_restarts=2 * MAX_RECOVERIES)
        assert await bot.stop() == 0
        grouped = world.replies_to(inbound)
        db = read_database(bot.data_dir / "chatflow.db")

    poison, *waiting = inbound
    assert [len(grouped[m]) for m in inbound] == [1] * len(inbound), {
        m.token: [r.text[:40] for r in grouped[m]] for m in inbound
    }
    assert grouped[poison][0].content == Replies().apology
    assert all(grouped[m][0].content.startswith(f"R{m.token} ") for m in waiting)
    # The crash loop is bounded: a few restarts, then the poison message is answered.
    assert 1 <= restarts <= MAX_RECOVERIES + 1
    assert db.inbox[poison.message_id][:2] != ("done", None)
    assert all(db.inbox[m.message_id][:2] == ("done", None) for m in waiting)
    proof_report.record(
        "poison",
        {
            "poison message (its tool SIGKILLs the bot) + messages queued behind it": (
                f"1 + {len(waiting)}"
            ),
            "crashes before the crash loop ended (bot restarted each time)": restarts,
            "poison message answered with": "one apology",
            "queued messages answered normally": f"{len(waiting)} of {len(waiting)}",
            "lost messages": 0,
        },
        seconds=time.monotonic() - started,
        about=_POISON_ABOUT,
    )
