"""Proof, model faults: the model misbehaves; the user gets one answer, the session stays valid.

Each fault gets its own conversation: a normal message first, then the message
on which the fake model misbehaves, then a normal message again. Transient
faults (a 429 or 500 once, malformed JSON once, no choices once) must be
retried into a normal answer; bad tool calls (arguments that are not JSON or
fail the schema, an unknown tool, a handoff to an agent that does not exist, a
tool that raises) must reach the model as error results and end in a normal
answer; lasting faults (429/500/malformed every time, a model slower than
``MODEL_TIMEOUT_SECONDS``, a 401, a model calling tools forever) must roll the
turn back -- the stored session byte-for-byte as before -- and send exactly one
apology. The follow-up message proves the session is still valid: the fake
server applies OpenAI's own validation (tool messages paired with tool calls)
to every request.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from bot.gateway.gateway import Replies
from tests.e2e import proof_report
from tests.e2e.botprocess import BotProcess
from tests.e2e.proof_world import (
    FULL,
    Inbound,
    World,
    history_problems,
    log_leaks,
    post_until_accepted,
    read_database,
    session_snapshot,
)

pytestmark = pytest.mark.e2e

MODEL_TIMEOUT = 2.0
RECOVERS = {
    "429x1": "retried after a 429 with Retry-After",
    "500x1": "retried after a 500",
    "malformedx1": "retried after a body that is not JSON",
    "nochoicesx1": "retried after an answer without choices",
    "badjson": "tool arguments that are not JSON -> error result -> answer",
    "badargs": "tool arguments failing the schema -> error result -> answer",
    "unknowntool": "call of a tool that does not exist -> error result -> answer",
    "ghost": "handoff to an agent that does not exist -> error result -> answer",
    "raise": "tool that raises -> error result -> answer",
}
FAILS = {
    "429": "429 on every attempt",
    "500": "500 on every attempt",
    "malformed": "malformed JSON on every attempt",
    "slow": f"answer slower than MODEL_TIMEOUT_SECONDS={MODEL_TIMEOUT:g}",
    "401": "401 (not retryable)",
    "loop": "tool calls forever (max tool rounds)",
}
PLATFORMS = ("whatsapp", "telegram") if FULL else ("whatsapp",)
ROUNDS = 2 if FULL else 1


async def _send(world: World, bot: BotProcess, platform: str, n: int, text: str) -> Inbound:
    label = text.split("N", 1)[0][1:]
    if platform == "whatsapp":
        payload, inbound = world.whatsapp_text(world.sender(bot), f"4915553{n:05d}", text, label)
        await post_until_accepted(world.sender(bot), payload)
        return inbound
    return world.telegram_text(4545000000 + n, text, label)


async def _conversation(
    world: World, bot: BotProcess, platform: str, n: int, kind: str, outcome: dict[str, Any]
) -> None:
    label = f"mf{n:03d}"
    db_path = bot.data_dir / "chatflow.db"
    first = await _send(world, bot, platform, n, f"Q{label}N000 hello before the fault")
    assert await world.wait_answered([first], within=30) == []
    before_db = await asyncio.to_thread(read_database, db_path)
    session_id = before_db.session_of(first.message_id)
    assert session_id is not None
    before = await asyncio.to_thread(session_snapshot, db_path, session_id)
    faulty = await _send(world, bot, platform, n, f"Q{label}N001 !fault:{kind} please")
    assert await world.wait_answered([faulty], within=30) == []
    after = await asyncio.to_thread(session_snapshot, db_path, session_id)
    last = await _send(world, bot, platform, n, f"Q{label}N002 and after the fault?")
    assert await world.wait_answered([last], within=30) == []
    outcome.update(
        kind=kind,
        platform=platform,
        first=first,
        faulty=faulty,
        last=last,
        unchanged=before == after,
        session_id=session_id,
    )


@pytest.mark.timeout(300 if FULL else 120)
async def test_proof_model_faults_retry_or_roll_back_with_one_apology(tmp_path: Path) -> None:
    started = time.monotonic()
    async with World(tmp_path) as world:
        world.model.slow_delay = MODEL_TIMEOUT + 1.5
        bot = world.bot(MODEL_TIMEOUT_SECONDS=str(MODEL_TIMEOUT))
        await bot.start()
        outcomes: list[dict[str, Any]] = []
        n = 0
        async with asyncio.TaskGroup() as group:
            for _ in range(ROUNDS):
                for platform in PLATFORMS:
                    for kind in (*RECOVERS, *FAILS):
                        outcome: dict[str, Any] = {}
                        outcomes.append(outcome)
                        group.create_task(_conversation(world, bot, platform, n, kind, outcome))
                        n += 1
        await world.wait_answered(world.inbound, within=30, settle=bot)
        assert await bot.stop() == 0
        grouped = world.replies_to(world.inbound)
        db = read_database(bot.data_dir / "chatflow.db")
        model = world.model
        validation_errors = list(world.openai.validation_errors)

    apology = Replies().apology
    problems: list[str] = []
    for outcome in outcomes:
        kind, token = outcome["kind"], outcome["faulty"].token
        where = f"{kind} on {outcome['platform']}"
        replies = {key: grouped[outcome[key]] for key in ("first", "faulty", "last")}
        if any(len(r) != 1 for r in replies.values()):
            problems.append(f"{where}: replies {[len(r) for r in replies.values()]} != 1 each")
            continue
        answer = replies["faulty"][0].content
        history = db.histories[outcome["session_id"]]
        users = [m.content for m in history if m.role.value == "user"]
        problems += [f"{where}: {p}" for p in history_problems(history, 40)]
        if not replies["last"][0].content.startswith(f"R{outcome['last'].token} "):
            problems.append(f"{where}: the message after the fault was not answered normally")
        if kind in FAILS:
            if answer != apology:
                problems.append(f"{where}: answered {answer[:60]!r}, not the apology")
            if not outcome["unchanged"]:
                problems.append(f"{where}: the failed turn changed the stored session")
            if outcome["faulty"].text in users:
                problems.append(f"{where}: the failed turn's message is in the history")
            state, error, _ = db.inbox[outcome["faulty"].message_id]
            if state != "done" or not error:
                problems.append(f"{where}: inbox row {state}/{error}, expected done with error")
        else:
            if not answer.startswith(f"R{token} "):
                problems.append(f"{where}: answered {answer[:60]!r}, not a normal answer")
            if outcome["faulty"].text not in users:
                problems.append(f"{where}: the recovered turn is not in the history")
            if kind.endswith("x1") and model.first_calls[token or ""] < 2:
                problems.append(f"{where}: the model call was not retried")
        if users != [
            outcome[key].text
            for key in ("first", "faulty", "last")
            if kind not in FAILS or key != "faulty"
        ]:
            problems.append(f"{where}: history user turns {users}")
    assert problems == [], problems
    assert validation_errors == [], validation_errors
    secrets = {i.chat_id for i in world.inbound} | {i.text for i in world.inbound}
    leaks = log_leaks(bot.log, secrets)
    assert leaks == [], leaks

    proof_report.record(
        "model_faults",
        {
            "conversations (one per fault and platform)": len(outcomes),
            "faults recovered into a normal answer": (
                f"{sum(o['kind'] in RECOVERS for o in outcomes)}: " + "; ".join(RECOVERS.values())
            ),
            "faults rolled back with one apology": (
                f"{sum(o['kind'] in FAILS for o in outcomes)}: " + "; ".join(FAILS.values())
            ),
            "replies per message": "exactly 1 (all)",
            "failed turns that changed the stored session": 0,
            "requests refused by OpenAI-style validation (orphan tool messages)": 0,
            "sessions violating pruning invariants": 0,
        },
        seconds=time.monotonic() - started,
        about=__doc__,
    )
