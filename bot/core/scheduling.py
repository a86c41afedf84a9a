"""Messages an agent schedules: the three tools, and the table their jobs live in.

``schedule_message``, ``list_scheduled_messages`` and ``cancel_scheduled_message``
(``scheduling_tools``, the three as a list) are opt-in per agent:
``Agent(..., tools=[*scheduling_tools])``. A tool does not write a job itself:
it checks the request and leaves it on the turn (``ToolContext.effects``); the
host (the gateway) writes it in the turn's own transaction, with the route of
the message that started the turn. So a turn that rolls back schedules nothing,
a crash after its commit loses nothing, and a model cannot aim a job at another
chat: no argument names one. ``list`` and ``cancel`` see only the current
conversation's jobs.

The jobs are fired by the gateway's scheduler (``bot.gateway.proactive.scheduler``), which
also hands the tools its ``SchedulingPolicy`` (``ToolContext.services``). Without
one (``Runner`` alone, where nothing would write or fire a job) the tools answer
the model that scheduling is not available.

Limits (``SchedulingPolicy``): a repeat must be at least ``min_repeat_seconds``
apart (``MIN_REPEAT_SECONDS``), a cron that never occurs (30 February) is refused
when scheduled, and ``max_per_chat`` counts the jobs of the whole chat (every
member's conversation in a group), not of one conversation. A repeat follows a
time zone: the tool's ``timezone`` argument, else the policy's
(``SCHEDULE_TIMEZONE``, UTC by default), so 09:00 stays 09:00 across
daylight-saving changes.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.core.sql import Transaction, ensure_schema
from bot.core.stores.base import TransactionalStore
from bot.core.tools import FunctionTool, ToolContext, error_result, tool

__all__ = [
    "COMPONENT",
    "DEFAULT_MAX_PER_CHAT",
    "DEFAULT_MIN_REPEAT_SECONDS",
    "DEFAULT_TIMEZONE",
    "MIGRATIONS",
    "POLICY",
    "SCHEDULED_MARKER",
    "SCHEDULED_REF",
    "TABLE",
    "CancelRequest",
    "JobRoute",
    "ScheduleRequest",
    "SchedulingPolicy",
    "apply_in",
    "cancel_scheduled_message",
    "chat_scope",
    "cron_problem",
    "ensure_jobs_schema_in",
    "is_five_field_cron",
    "list_scheduled_messages",
    "load_timezone",
    "next_occurrence",
    "schedule_message",
    "scheduled_prompt",
    "scheduling_tools",
    "shortest_repeat",
]

TABLE: Final = "chatflow_scheduled_jobs"
"""One row per scheduled job."""
COMPONENT: Final = "scheduled_jobs"
"""The jobs table's row in ``chatflow_schema_versions``."""
MIGRATIONS: Final = {
    1: (
        f"CREATE TABLE IF NOT EXISTS {TABLE} ("
        "id TEXT PRIMARY KEY NOT NULL, "
        "session_key TEXT NOT NULL, "
        "session_id TEXT NOT NULL, "
        "platform TEXT NOT NULL, "
        "chat_id TEXT NOT NULL, "
        "thread_id TEXT, "
        "text TEXT NOT NULL, "
        "run_agent INTEGER NOT NULL DEFAULT 0, "
        "cron TEXT, "
        "due_at REAL NOT NULL, "
        "state TEXT NOT NULL, "
        "created_at REAL NOT NULL, "
        "fired_count INTEGER NOT NULL DEFAULT 0)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_due ON {TABLE} (state, due_at)",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_session ON {TABLE} (session_id, state)",
    ),
    # Who scheduled the job (``sender_digest``, no raw id: their budget pays for its
    # turns, and revoking them cancels it) and the time zone its repeats follow.
    2: (
        f"ALTER TABLE {TABLE} ADD COLUMN sender TEXT",
        f"ALTER TABLE {TABLE} ADD COLUMN timezone TEXT",
        f"CREATE INDEX IF NOT EXISTS {TABLE}_sender ON {TABLE} (platform, sender, state)",
    ),
    # 3: the trace context of the turn that scheduled the job (tracing on); NULL before it.
    3: (f"ALTER TABLE {TABLE} ADD COLUMN traceparent TEXT",),
}
"""``MIGRATIONS[v]`` moves the jobs table from version ``v - 1`` to ``v`` (SQLite DDL)."""

SCHEDULED_REF: Final = "schedule:"
"""Starts the ``message_ref`` of what a job owes (its text, or its turn and the turn's
answer): how the outbox tells a scheduled post from a reply to a person."""

SCHEDULED_MARKER: Final = "[Scheduled reminder]"
"""Starts the prompt of a ``run_agent`` job's turn, so the model reads it as the
reminder it set itself, not as something the user just wrote."""

DEFAULT_MAX_PER_CHAT: Final = 20
DEFAULT_MIN_REPEAT_SECONDS: Final = 300.0
DEFAULT_TIMEZONE: Final = "UTC"
POLICY: Final = "scheduling"
"""Key of the ``SchedulingPolicy`` in ``ToolContext.services``."""


@dataclass(frozen=True, slots=True)
class SchedulingPolicy:
    """The host's limits for the scheduling tools (``MAX_SCHEDULED_PER_CHAT``,
    ``MIN_REPEAT_SECONDS``, ``SCHEDULE_TIMEZONE``)."""

    max_per_chat: int = DEFAULT_MAX_PER_CHAT
    """Jobs one chat may have waiting (all its conversations together)."""
    min_repeat_seconds: float = DEFAULT_MIN_REPEAT_SECONDS
    """The least time between two runs of a repeating job."""
    timezone: str = DEFAULT_TIMEZONE
    """The IANA time zone of ``every`` when the model gives none."""


@dataclass(frozen=True, slots=True)
class ScheduleRequest:
    """A job a tool asked for, written at the turn's commit."""

    job_id: str
    text: str
    due_at: float
    cron: str | None = None
    run_agent: bool = False
    timezone: str | None = None
    """The IANA zone ``cron`` is read in (``None``: UTC)."""


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A job of this conversation a tool cancelled, marked at the turn's commit."""

    job_id: str


@dataclass(frozen=True, slots=True)
class JobRoute:
    """Where a turn's jobs go: the conversation and chat of the message that started it."""

    session_key: str
    session_id: str
    platform: str
    chat_id: str
    thread_id: str | None
    sender: str | None = None
    """Who asked (``sender_digest`` of the message that started the turn): the jobs'
    turns are charged to them, and revoking them cancels their jobs."""
    traceparent: str | None = None
    """The scheduling span's W3C ``traceparent``: each firing's trace links to it."""


async def ensure_jobs_schema_in(tx: Transaction) -> None:
    """Create or migrate the jobs table inside ``tx``."""
    await ensure_schema(tx, COMPONENT, MIGRATIONS)


async def apply_in(
    tx: Transaction, effects: Sequence[object], route: JobRoute, now: float
) -> tuple[int, int]:
    """Write a turn's scheduling requests in its transaction; ``(scheduled, cancelled)``."""
    requests = [e for e in effects if isinstance(e, ScheduleRequest | CancelRequest)]
    if not requests:
        return 0, 0
    await ensure_jobs_schema_in(tx)
    scheduled = cancelled = 0
    for request in requests:
        if isinstance(request, ScheduleRequest):
            scheduled += await tx.execute(
                f"INSERT INTO {TABLE} (id, session_key, session_id, platform, chat_id, "
                "thread_id, text, run_agent, cron, due_at, state, created_at, fired_count, "
                "sender, timezone, traceparent) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'scheduled', ?, 0, ?, ?, ?) "
                "ON CONFLICT(id) DO NOTHING",
                (
                    request.job_id,
                    route.session_key,
                    route.session_id,
                    route.platform,
                    route.chat_id,
                    route.thread_id,
                    request.text,
                    1 if request.run_agent else 0,
                    request.cron,
                    request.due_at,
                    now,
                    route.sender,
                    request.timezone,
                    route.traceparent,
                ),
            )
        else:
            cancelled += await tx.execute(
                f"UPDATE {TABLE} SET state = 'cancelled' "
                "WHERE id = ? AND session_id = ? AND state = 'scheduled'",
                (request.job_id, route.session_id),
            )
    return scheduled, cancelled


def is_five_field_cron(expression: str) -> bool:
    """Whether ``expression`` is a valid 5-field cron schedule (minute hour day month weekday)."""
    return cron_problem(expression) is None


_FIELDS: Final = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day of the month", 1, 31),
    ("month", 1, 12),
    ("day of the week", 0, 7),
)
_NUMBER: Final = re.compile(r"\d+")


def _field_problem(name: str, low: int, high: int, field: str) -> str | None:
    """Which value of one cron field is out of its range (steps and ``#n`` aside)."""
    for part in field.split(","):
        base, _, _step = part.partition("/")
        base = base.partition("#")[0]  # "1#2": the second Monday; the 2 is no weekday
        for number in _NUMBER.findall(base):
            if not low <= int(number) <= high:
                return f"{name} {number} is out of range ({low}-{high})"
    return None


def cron_problem(expression: str) -> str | None:
    """Why ``expression`` is not a 5-field cron schedule, naming the field; ``None`` if it is."""
    from croniter import croniter  # only the tools and the scheduler need it

    fields = expression.split()
    if len(fields) != 5:
        return f"it has {len(fields)} fields, not 5 (minute hour day month weekday)"
    for (name, low, high), field in zip(_FIELDS, fields, strict=True):
        problem = _field_problem(name, low, high, field)
        if problem is not None:
            return problem
    if not croniter.is_valid(expression):
        return "it is not valid cron syntax"
    return None


def load_timezone(name: str) -> tzinfo:
    """The IANA time zone ``name`` (``Europe/Berlin``); ``ValueError`` naming it if unknown."""
    try:
        return ZoneInfo(name.strip())
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"{name!r} is not an IANA time zone name (e.g. UTC, Europe/Berlin, America/New_York)"
        ) from None


def next_occurrence(expression: str, after: float, timezone: str | None = None) -> float:
    """The first time of ``expression`` strictly after the epoch time ``after``, the cron
    read in ``timezone`` (an IANA name; UTC when ``None``): "0 9 * * 1" in
    Europe/Berlin is 09:00 there in winter and in summer.

    Raises croniter's ``CroniterBadDateError`` (a ``ValueError``) for a schedule that
    never occurs (``0 0 30 2 *``)."""
    from croniter import croniter

    zone = UTC if timezone is None else load_timezone(timezone)
    start = datetime.fromtimestamp(after, zone)
    return float(croniter(expression, start).get_next(datetime).timestamp())


def shortest_repeat(expression: str) -> float:
    """The shortest time in seconds between two runs of ``expression`` on a day (or across
    midnight into the next): a lower bound of how often it may repeat."""
    from croniter import croniter

    expanded = croniter.expand(expression)[0]
    minutes = list(range(60)) if expanded[0] == ["*"] else [int(m) for m in expanded[0]]
    hours = list(range(24)) if expanded[1] == ["*"] else [int(h) for h in expanded[1]]
    times = sorted({hour * 60 + minute for hour in hours for minute in minutes})
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    gaps.append(times[0] + 24 * 60 - times[-1])  # the last run of a day, the next day's first
    return 60.0 * min(gaps)


def chat_scope(session_key: str) -> str:
    """The part of a session key that names the chat (and topic): a group member's own
    conversation (``...:group:<chat>:user:<sender>``) without its ``:user:`` part."""
    head, sep, _ = session_key.rpartition(":user:")
    return head if sep and (":group:" in head or ":channel:" in head) else session_key


def scheduled_prompt(text: str) -> str:
    """The prompt of a ``run_agent`` job's turn: its text behind ``SCHEDULED_MARKER``."""
    return f"{SCHEDULED_MARKER} {text}"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _store_of(ctx: ToolContext) -> TransactionalStore | None:
    store: object = ctx.store
    return store if isinstance(store, TransactionalStore) else None


def _policy(ctx: ToolContext) -> SchedulingPolicy | None:
    """The host's policy; ``None`` where no host writes and fires jobs (``Runner`` alone)."""
    policy = ctx.services.get(POLICY)
    return policy if isinstance(policy, SchedulingPolicy) else None


_UNAVAILABLE: Final = "scheduling is not available here (it needs the running bot and its database)"


def _host(ctx: ToolContext) -> tuple[TransactionalStore, SchedulingPolicy] | None:
    store, policy = _store_of(ctx), _policy(ctx)
    return None if store is None or policy is None else (store, policy)


async def _active_jobs(
    store: TransactionalStore, session_id: str
) -> list[tuple[str, str, float, str | None]]:
    """``(id, text, due_at, every)`` of this conversation's waiting jobs; ``every`` names
    its time zone (``0 9 * * 1 (Europe/Berlin)``)."""

    async def body(tx: Transaction) -> list[tuple[str, str, float, str | None]]:
        await ensure_jobs_schema_in(tx)
        rows = await tx.fetchall(
            f"SELECT id, text, due_at, cron, timezone FROM {TABLE} "
            "WHERE session_id = ? AND state = 'scheduled' ORDER BY due_at, id",
            (session_id,),
        )
        return [(str(r[0]), str(r[1]), float(r[2]), _every(r[3], r[4])) for r in rows]

    return await store.run(body)


async def _waiting_in_chat(
    store: TransactionalStore, session_id: str, session_key: str
) -> set[str]:
    """Ids of the jobs waiting in this conversation's chat: its own, and (in a group with a
    conversation per member) every member's."""
    scope = chat_scope(session_key) if session_key else ""
    members = f"{scope}:user:"

    async def body(tx: Transaction) -> set[str]:
        await ensure_jobs_schema_in(tx)
        rows = await tx.fetchall(
            f"SELECT id FROM {TABLE} WHERE state = 'scheduled' AND (session_id = ? "
            "OR session_key = ? OR substr(session_key, 1, ?) = ?)",
            (session_id, scope, len(members), members),
        )
        return {str(r[0]) for r in rows}

    return await store.run(body)


def _every(cron: object, zone: object) -> str | None:
    return None if cron is None else f"{cron} ({zone or DEFAULT_TIMEZONE})"


def _pending(ctx: ToolContext) -> tuple[list[ScheduleRequest], set[str]]:
    added = [e for e in ctx.effects if isinstance(e, ScheduleRequest)]
    cancelled = {e.job_id for e in ctx.effects if isinstance(e, CancelRequest)}
    return added, cancelled


def _parse_at(at: str, now: float, zone: str | None = None) -> float | str:
    """The epoch time of ``at`` (read in ``zone`` when it has no offset), or the error to
    tell the model."""
    try:
        moment = datetime.fromisoformat(at.strip())
    except ValueError:
        return f"at={at!r} is not an ISO 8601 date and time (e.g. 2026-05-01T09:00:00+02:00)"
    if (moment.tzinfo is None or moment.utcoffset() is None) and zone is not None:
        moment = moment.replace(tzinfo=load_timezone(zone))
    if moment.tzinfo is None or moment.utcoffset() is None:
        return (
            f"at={at!r} has no UTC offset: add one (e.g. {at.strip()}+00:00 or the user's "
            "own offset such as +02:00), or give the user's timezone; a time without "
            "either is ambiguous"
        )
    due = moment.timestamp()
    if due <= now:
        return f"at={at!r} is in the past (it is now {_iso(now)})"
    return due


def _local_iso(epoch: float, zone: str) -> str:
    return datetime.fromtimestamp(epoch, load_timezone(zone)).isoformat(timespec="seconds")


def _check_every(
    every: str, zone: str | None, now: float, policy: SchedulingPolicy
) -> tuple[str, float] | str:
    """``(cron, its next time)`` of ``every``, or the error to tell the model."""
    cron = " ".join(every.split())
    problem = cron_problem(cron)
    if problem is not None:
        return (
            f"every={every!r} is not a 5-field cron schedule: {problem} "
            '(minute hour day month weekday, e.g. "0 9 * * 1" for Mondays 09:00)'
        )
    try:
        first = next_occurrence(cron, now, zone)
    except ValueError:  # croniter's CroniterBadDateError: no such date, ever
        return f"every={every!r} never occurs (no such date, e.g. 30 February): fix the day"
    gap = shortest_repeat(cron)
    if gap < policy.min_repeat_seconds:
        return (
            f"every={every!r} repeats {gap:.0f} s apart; repeats must be at least "
            f"{policy.min_repeat_seconds:.0f} s apart here: choose a slower schedule"
        )
    return cron, first


@tool(name="schedule_message")
async def _schedule_message(
    ctx: ToolContext,
    text: str,
    delay_seconds: int | None = None,
    at: str | None = None,
    every: str | None = None,
    run_agent: bool = False,
    timezone: str | None = None,
) -> str:
    """Schedule a message to this chat for later: a reminder or a follow-up. Give
    exactly one of delay_seconds or at; with every, the message repeats on that
    schedule (then both may be left out: the first run is the schedule's next time).

    Args:
        text: The message to send, as the user should read it.
        delay_seconds: Send it this many seconds from now (at least 1).
        at: Send it at this ISO 8601 date and time, with its UTC offset
            (e.g. 2026-05-01T09:00:00+02:00); without one, it is read in timezone.
        every: Repeat on this 5-field cron schedule (minute hour day month weekday),
            e.g. "0 9 * * 1" for Mondays 09:00, read in timezone.
        run_agent: At the due time, run a turn of this conversation with the text as
            its prompt (marked "[Scheduled reminder]") and send the answer, instead
            of sending the text itself.
        timezone: The user's IANA time zone (e.g. "Europe/Berlin"), when they said
            where they are or gave a local clock time: repeats keep that local time
            across daylight-saving changes. Left out: the bot's default zone.
    """
    if not text.strip():
        return error_result("text is empty: give the message to send")
    host = _host(ctx)
    if host is None:
        return error_result(_UNAVAILABLE)
    store, policy = host
    now = store.now().timestamp()
    if delay_seconds is not None and at is not None:
        return error_result("give either delay_seconds or at, not both")
    if delay_seconds is None and at is None and every is None:
        return error_result("give delay_seconds or at (or every for a repeating message)")
    zone = policy.timezone
    if timezone is not None:
        try:
            load_timezone(timezone)
        except ValueError as exc:
            return error_result(f"timezone: {exc}")
        zone = timezone.strip()
    cron: str | None = None
    first: float | None = None
    if every is not None:
        checked = _check_every(every, zone, now, policy)
        if isinstance(checked, str):
            return error_result(checked)
        cron, first = checked
    if delay_seconds is not None:
        if delay_seconds < 1:
            return error_result(f"delay_seconds must be at least 1, not {delay_seconds}")
        due = now + delay_seconds
    elif at is not None:
        parsed = _parse_at(at, now, None if timezone is None else zone)
        if isinstance(parsed, str):
            return error_result(parsed)
        due = parsed
    else:
        assert first is not None
        due = first
    if not math.isfinite(due) or due > now + 10 * 366 * 86_400:
        return error_result("that is more than ten years away")
    added, cancelled = _pending(ctx)
    session_key = str(ctx.metadata.get("session_key") or "")
    waiting = await _waiting_in_chat(store, ctx.session_id, session_key) - cancelled
    limit = policy.max_per_chat
    if len(waiting) + len(added) >= limit:
        return error_result(
            f"this chat already has {limit} scheduled messages (the limit, for everyone in "
            "it together): cancel one first (list_scheduled_messages shows this "
            "conversation's)"
        )
    job_id = f"job_{uuid.uuid4().hex[:12]}"
    ctx.effects.append(
        ScheduleRequest(
            job_id, text, due, cron, run_agent=bool(run_agent), timezone=zone if cron else None
        )
    )
    answer = {"job_id": job_id, "due_at_utc": _iso(due), "status": "scheduled"}
    if zone != DEFAULT_TIMEZONE:
        answer["due_at_local"] = f"{_local_iso(due, zone)} ({zone})"
    if run_agent:
        answer["runs_agent"] = "yes: the answer to the text is sent, not the text"
    if cron is not None:
        answer["repeats"] = f"{cron} ({zone})"
    return json.dumps(answer)


@tool(name="list_scheduled_messages")
async def _list_scheduled_messages(ctx: ToolContext) -> str:
    """List the messages scheduled for this chat: job id, next due time (UTC),
    repeat schedule and text."""
    host = _host(ctx)
    if host is None:
        return error_result(_UNAVAILABLE)
    store = host[0]
    added, cancelled = _pending(ctx)
    jobs = [
        {"job_id": job_id, "due_at_utc": _iso(due), "every": cron, "text": text}
        for job_id, text, due, cron in await _active_jobs(store, ctx.session_id)
        if job_id not in cancelled
    ]
    jobs += [
        {
            "job_id": r.job_id,
            "due_at_utc": _iso(r.due_at),
            "every": _every(r.cron, r.timezone),
            "text": r.text,
        }
        for r in added
        if r.job_id not in cancelled
    ]
    return json.dumps({"scheduled": jobs}, ensure_ascii=False)


@tool(name="cancel_scheduled_message")
async def _cancel_scheduled_message(ctx: ToolContext, job_id: str) -> str:
    """Cancel a message scheduled for this chat.

    Args:
        job_id: The job id schedule_message or list_scheduled_messages gave.
    """
    host = _host(ctx)
    if host is None:
        return error_result(_UNAVAILABLE)
    store = host[0]
    added, cancelled = _pending(ctx)
    known = {j[0] for j in await _active_jobs(store, ctx.session_id)} | {r.job_id for r in added}
    if job_id not in known or job_id in cancelled:
        return error_result(
            f"no scheduled message {job_id!r} in this chat (list_scheduled_messages shows them)"
        )
    ctx.effects.append(CancelRequest(job_id))
    return json.dumps({"job_id": job_id, "status": "cancelled"})


schedule_message: FunctionTool = _schedule_message
"""Tool: schedule a message to the current chat (once, or repeating on a cron schedule)."""
list_scheduled_messages: FunctionTool = _list_scheduled_messages
"""Tool: list the current chat's scheduled messages."""
cancel_scheduled_message: FunctionTool = _cancel_scheduled_message
"""Tool: cancel one of the current chat's scheduled messages."""
scheduling_tools: Final[list[FunctionTool]] = [
    schedule_message,
    list_scheduled_messages,
    cancel_scheduled_message,
]
"""The three scheduling tools, to spread into ``Agent(tools=[...])``."""
