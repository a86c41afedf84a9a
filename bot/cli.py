"""``python -m bot`` / ``chatflow``: run the bot, chat, sessions, ledger, pairing, schedule,
approvals."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import logging
import os
import stat
import sys
from collections.abc import Callable, Coroutine, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bot.agents_loader import load_agents
from bot.config import Settings, load_settings
from bot.core.compaction import is_summary
from bot.core.stores.base import TransactionalStore
from bot.data_dir import ensure_data_dir
from bot.database import instance_lock, open_store
from bot.errors import ChatflowError, ConfigurationError
from bot.gateway.keys import load_or_create_secret, load_or_create_shared_secret
from bot.logs import configure_logging, quiet_console_logs
from bot.setting_typos import refuse_fatal_typos, setting_typos

if TYPE_CHECKING:
    from bot.gateway.ledger.obligations import Obligation, ObligationState

__all__ = ["EXIT_USAGE", "NO_PLATFORM_MESSAGE", "main", "stdin_has_input", "utc_time"]

logger = logging.getLogger(__name__)

Command = Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]

EXIT_USAGE = 2
"""The exit code of every usage error: a wrong argument, an unknown id, a setting."""


def _refuse(command: str, reason: str) -> int:
    """``chatflow: <command>: <reason>`` on stderr; ``EXIT_USAGE``. The CLI's one way to
    say no (a runtime failure, such as a database that cannot be reached, exits 1)."""
    print(f"chatflow: {command}: {reason}", file=sys.stderr)
    return EXIT_USAGE


def utc_time(moment: datetime) -> str:
    """``2026-12-07 02:35:58 UTC``: the CLI's one time format (the console's too)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


NO_PLATFORM_MESSAGE = (
    "no platform configured and no input to chat over: set TELEGRAM_BOT_TOKEN, or "
    "WHATSAPP_PHONE_ID, WHATSAPP_TOKEN, WHATSAPP_VERIFY_TOKEN and WHATSAPP_APP_SECRET, "
    "or CONSOLE_TOKEN for the console's web chat (see .env.example); or talk in a "
    "terminal with `python -m bot chat`"
)
"""Why ``run`` stops when it has nobody to talk to."""


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    console = args.console
    if console is None:
        # Nothing configured: talk over the terminal or piped input (exiting at its end);
        # a service with no input at all would idle forever, so it stops and says why.
        if settings.telegram_enabled or settings.whatsapp_enabled:
            console = False
        elif settings.console_token is not None:
            console = False  # the console's web chat is the platform (no account needed)
        elif stdin_has_input():
            console = True
        else:
            raise ConfigurationError(NO_PLATFORM_MESSAGE, setting="TELEGRAM_BOT_TOKEN")
    if console:
        _quiet_for_a_person(settings)
    load_agents(settings.agents_module)  # a mistake there stops us before anything starts
    from bot.app import Bot  # the whole house: only run and chat need it

    with instance_lock(settings):
        await Bot(settings, console=console, settle_heap=True).run()
    return 0


def stdin_has_input() -> bool:
    """Whether standard input is a terminal, a pipe or a file (not closed, not /dev/null)."""
    if sys.stdin is None:
        return False
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
        if stat.S_ISCHR(mode) and not sys.stdin.isatty():
            return False  # /dev/null and other devices: nobody is typing
    except (OSError, ValueError):
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def _quiet_for_a_person(settings: Settings) -> None:
    if sys.stdin.isatty() and "log_level" not in settings.model_fields_set:
        quiet_console_logs()


async def _chat(settings: Settings, args: argparse.Namespace) -> int:
    _quiet_for_a_person(settings)
    load_agents(settings.agents_module)
    from bot.app import Bot

    with instance_lock(settings):
        await Bot(settings, console=True, serve_http=False, settle_heap=True).run()
    return 0


async def _sessions(settings: Settings, args: argparse.Namespace) -> int:
    from bot.gateway.proactive.jobs import cancel_jobs

    store = open_store(settings)
    try:
        if args.action == "list":
            for session_id in await store.list_sessions():
                print(session_id)
            return 0
        starting = load_agents(settings.agents_module).starting_agent
        # Stored agent names resolve to the operator's agents (no false "unknown agent").
        store.set_agent_resolver({a.name: a for a in starting.reachable_agents()}.get)
        if args.action == "show":
            session = await store.get(args.session_id)
            if session is None:
                return _refuse("sessions", f"no session {args.session_id}")
            print(f"session {session.session_id}  agent: {session.active_agent.name}")
            await _print_session_usage(store, settings, session.session_id)
            # The whole conversation: messages a compaction summarised are marked.
            for message, compacted in await store.conversation(session.session_id) or []:
                who = message.agent or message.role.value
                if is_summary(message):
                    who = "summary"
                mark = "(compacted) " if compacted else ""
                if message.tool_calls:
                    calls = ", ".join(
                        f"{c.name}({json.dumps(c.arguments)})" for c in message.tool_calls
                    )
                    print(f"  {mark}[{message.role.value}:{who}] calls {calls}")
                if message.content:
                    print(f"  {mark}[{message.role.value}:{who}] {message.content}")
            return 0
        session = await store.get(args.session_id)
        if session is None:
            return _refuse("sessions", f"no session {args.session_id}")
        metadata = dict(session.metadata)
        await store.delete(args.session_id)
        # Its scheduled messages go with it: cancelled on reset, erased (texts and chat
        # ids too) on delete.
        jobs = await cancel_jobs(
            store, session_id=args.session_id, erase=args.action == "delete", why=args.action
        )
        also = f" ({jobs} scheduled message(s) cancelled)" if jobs else ""
        if args.action == "reset":
            fresh = await store.get_or_create(args.session_id, starting, metadata)
            await store.save(fresh)
            print(f"reset {args.session_id}{also}")
        else:
            print(f"deleted {args.session_id}{also}")
        return 0
    finally:
        await store.close()


async def _ledger(settings: Settings, args: argparse.Namespace) -> int:
    from bot.gateway.ledger import DeliveryLedger

    store = open_store(settings)
    ledger = DeliveryLedger(store)
    try:
        await ledger.open()
        if args.action == "status":
            counts = await ledger.status()
            print("  ".join(f"{state}: {n}" for state, n in sorted(counts.items())) or "empty")
            rows: list[Obligation] = []
            # What needs the operator first: failed and abandoned replies, then those
            # still on their way; delivered ones only fill what is left of --limit.
            for state in [args.state] if args.state else ATTENTION_ORDER:
                left = args.limit - len(rows)
                if left > 0 and (args.state or counts.get(state)):
                    rows += await ledger.list_obligations(state=state, limit=left)
            now = store.now()
            for row in rows:
                print(
                    f"{row.obligation_id}  {row.state:<10} {row.platform:<9} "
                    f"{_age(now - row.created_at):>4} old  session {row.session_id}  "
                    f"attempts={row.attempts}  {row.last_error or ''}".rstrip()
                )
            return 0
        if args.action == "retry":
            done = await ledger.retry(args.obligation_id)
        else:
            done = await ledger.abandon(args.obligation_id, args.reason)
        if not done:
            return _refuse(
                "ledger", f"cannot {args.action} {args.obligation_id}: not found or not eligible"
            )
        print(f"ok: {args.obligation_id}")
        return 0
    finally:
        await store.close()


ATTENTION_ORDER: tuple[ObligationState, ...] = (
    "failed",
    "abandoned",
    "attempting",
    "pending",
    "delivered",
)
"""``ledger status`` lists states in this order: what needs a person first."""


def _age(delta: timedelta) -> str:
    """``45s``, ``12m``, ``5h``, ``3d``."""
    seconds = max(int(delta.total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


async def _installation_secret(store: TransactionalStore, settings: Settings) -> bytes:
    """The key session keys are derived with: the database's on PostgreSQL (shared by
    every process), else ``DATA_DIR/secret.key``."""
    if store.dialect == "postgres":
        await store.open()
        return await load_or_create_shared_secret(store)
    return await asyncio.to_thread(load_or_create_secret, settings.data_dir)


async def _pairing(settings: Settings, args: argparse.Namespace) -> int:
    from bot.gateway.access.pairing import Pairing, sender_ref

    store = open_store(settings)
    try:
        secret = await _installation_secret(store, settings)
        pairing = Pairing(store, secret=secret, ttl_seconds=settings.pairing_code_ttl_seconds)
        await pairing.open()
        if args.action == "approve":
            outcome, ref = await pairing.approve(args.code)
            if outcome == "approved":
                print(f"approved {ref}: served from now on, in every running process")
                return 0
            why = "has expired (the sender gets a new one by writing again)"
            return _refuse(
                "pairing", f"code {args.code} {why if outcome == 'expired' else 'is unknown'}"
            )
        if args.action == "revoke":
            removed = await pairing.revoke(args.target)
            if not removed:
                return _refuse("pairing", f"no approval or pending code matches {args.target}")
            print(f"revoked {args.target}")
            return 0
        now = store.now()
        pending_codes = await pairing.pending()
        for pending in pending_codes:
            left = (pending.expires_at - now).total_seconds() / 3600
            who = sender_ref(pending.platform, pending.sender)
            print(f"pending   {pending.code}  {who}  expires in {left:.1f} h")
        approvals = await pairing.approvals()
        for approval in approvals:
            who = sender_ref(approval.platform, approval.sender)
            print(f"approved  {who}  since {utc_time(approval.approved_at)}")
        if not approvals and not pending_codes:
            print("no pending codes and no approved senders")
        return 0
    finally:
        await store.close()


async def _send(settings: Settings, args: argparse.Namespace) -> int:
    from bot.gateway.instances import InstanceRegistry
    from bot.gateway.proactive.operator_send import TargetError, parse_target, queue_message
    from bot.instance_lock import InstanceLock

    def refuse(reason: str) -> int:
        return _refuse("send", reason)

    try:
        target = parse_target(args.target)
    except TargetError as exc:
        return refuse(str(exc))
    enabled = {
        "telegram": settings.telegram_enabled,
        "whatsapp": settings.whatsapp_enabled,
        "console": True,  # the terminal: it goes out when a bot runs with it attached
        "web": settings.console_token is not None,
    }
    if not enabled[target.platform]:
        setting = {"telegram": "TELEGRAM_BOT_TOKEN", "whatsapp": "WHATSAPP_PHONE_ID"}.get(
            target.platform, "CONSOLE_TOKEN"
        )
        return refuse(f"{target.platform} is not configured here (set {setting}, as for the bot)")
    text: str = args.text
    if text == "-":
        text = (await asyncio.to_thread(sys.stdin.read)).rstrip("\n")
    if not text.strip():
        return refuse("the message is empty")
    store = open_store(settings)
    try:
        secret = await _installation_secret(store, settings)
        if store.dialect == "postgres":
            registry = InstanceRegistry(store)
            await registry.open()  # a database no bot has used yet has no table
            running = bool(await registry.live())
        else:
            running = await asyncio.to_thread(InstanceLock(settings.data_dir).held_elsewhere)
        # On SQLite a running bot's session locks are in its own process: writing the
        # conversation from here could fail a turn's save, so the ledger row goes alone.
        into_history = store.dialect == "postgres" or not running
        obligation = await queue_message(
            store, target, text, secret=secret, into_history=into_history
        )
    finally:
        await store.close()
    if running:
        print(f"sent to the running bot: {obligation.obligation_id} goes out within seconds")
    else:
        print(
            f"queued {obligation.obligation_id}: no bot is running; it is sent when the bot starts"
        )
    return 0


async def _schedule(settings: Settings, args: argparse.Namespace) -> int:
    from bot.gateway.proactive.jobs import cancel_job, scheduled_jobs
    from bot.gateway.proactive.operator_send import TargetError, parse_target

    target = None
    if args.action == "list" and args.chat is not None:
        try:
            target = parse_target(args.chat)
        except TargetError as exc:
            return _refuse("schedule", str(exc))
    store = open_store(settings)
    try:
        if args.action == "cancel":
            outcome = await cancel_job(store, args.job_id)
            if outcome != "cancelled":
                why = "no such job" if outcome == "unknown" else f"it was {outcome}"
                return _refuse("schedule", f"cannot cancel {args.job_id}: {why}")
            print(f"cancelled {args.job_id}")
            return 0
        jobs = await scheduled_jobs(store, target=target)
    finally:
        await store.close()
    if not jobs:
        print("No scheduled messages.")
        return 0
    for job in jobs:
        due = utc_time(job.due_at)
        # The chat id (often a phone number) only where the operator typed it.
        where = args.chat if target is not None else job.session_id
        text = " ".join(job.text.split())
        text = text if len(text) <= _LIST_TEXT else text[: _LIST_TEXT - 1] + "…"
        print(f"{job.job_id}  {due}  {job.cron or '-':<13} {job.platform:<9} {where}  {text}")
    return 0


_LIST_TEXT = 60
"""``schedule list`` cuts a job's text to this many characters."""


async def _memory(settings: Settings, args: argparse.Namespace) -> int:
    from bot.memory_commands import memory

    return await memory(settings, args, _installation_secret)


async def _forget_user(settings: Settings, args: argparse.Namespace) -> int:
    from bot.memory_commands import forget_user

    return await forget_user(settings, args, _installation_secret)


async def _approvals(settings: Settings, args: argparse.Namespace) -> int:
    from bot.gateway.approvals.flow import approval_rows, find_approval, operator_decide

    store = open_store(settings)
    try:
        if args.action == "show":
            found = await find_approval(store, args.approval_id)
            if found is None:
                print(f"chatflow: approvals: no approval {args.approval_id}", file=sys.stderr)
                return 2
            print(found.describe())
            return 0
        if args.action in ("approve", "deny"):
            outcome = await operator_decide(store, args.approval_id, args.action)
            if outcome in ("approved", "denied"):
                print(f"{outcome} {args.approval_id}")
                return 0
            why = {
                "unknown": "no such approval",
                "expired": "it had expired",
                "decided": "it was already decided",
            }[outcome]
            return _refuse("approvals", f"cannot {args.action} {args.approval_id}: {why}")
        rows = await approval_rows(store)
    finally:
        await store.close()
    if not rows:
        print("No approvals waiting.")
        return 0
    for row in rows:
        expires = utc_time(row.expires_at)
        # The whole arguments: nothing runs on approve that is not printed here.
        args_text = json.dumps(row.arguments, ensure_ascii=False, sort_keys=True)
        print(
            f"{row.approval_id}  expires {expires}  {row.platform:<9} {row.session_id}  "
            f"{row.agent}: {row.tool_name} {args_text}"
        )
    return 0


async def _print_session_usage(
    store: TransactionalStore, settings: Settings, session_id: str
) -> None:
    from bot.usage_report import format_session_totals, read_prices, session_usage

    try:
        prices = await read_prices(settings.model_prices)
    except ValueError as exc:
        print(f"MODEL_PRICES: {exc}", file=sys.stderr)
        prices = None
    print(format_session_totals(await session_usage(store, session_id), prices))


async def _usage(settings: Settings, args: argparse.Namespace) -> int:
    from bot.usage_report import NO_USAGE, format_usage_table, read_prices, since_day, usage_lines

    try:
        since = since_day(args.since, args.days)
    except ValueError as exc:
        return _refuse("usage", str(exc))
    try:
        prices = await read_prices(settings.model_prices)
    except ValueError as exc:
        return _refuse("usage", f"MODEL_PRICES: {exc}")
    store = open_store(settings)
    try:
        lines = await usage_lines(store, since)
    finally:
        await store.close()
    if not lines:
        print(f"{NO_USAGE} since {since}." if since else f"{NO_USAGE}.")
        return 0
    print(format_usage_table(lines, prices))
    return 0


async def _doctor(settings: Settings, args: argparse.Namespace) -> int:
    from bot.doctor import run_checks

    return await run_checks(settings)


def _version() -> str:
    try:
        return importlib.metadata.version("chatflow-bot")
    except importlib.metadata.PackageNotFoundError:  # a source checkout, not installed
        return "(not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatflow",
        description="Chatflow: LLM agents on Telegram and WhatsApp that never lose a reply.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="start the bot (platforms from .env, HTTP server, recovery)",
        description="Start every configured platform, the HTTP server (webhooks, /healthz, "
        "/metrics) and crash recovery. With no platform configured and a terminal attached, "
        "talk to the bot right here.",
    )
    group = run.add_mutually_exclusive_group()
    group.add_argument(
        "--console",
        dest="console",
        action="store_true",
        default=None,
        help="also talk to the bot in this terminal",
    )
    group.add_argument(
        "--no-console", dest="console", action="store_false", help="never read the terminal"
    )
    run.set_defaults(handler=_run)

    chat = sub.add_parser(
        "chat",
        help="talk to the agents in the terminal (same database, same agents)",
        description="Chat with your agents in the terminal. History is kept in the same "
        "database as the bot; /reset starts over; /compact summarises a long conversation; "
        "Ctrl-D quits.",
    )
    chat.set_defaults(handler=_chat)

    sessions = sub.add_parser(
        "sessions",
        help="list, show, reset or delete conversations",
        description="Inspect and manage stored conversations.",
    )
    s_sub = sessions.add_subparsers(dest="action", required=True, metavar="ACTION")
    s_sub.add_parser("list", help="list session ids")
    for action, text in (
        ("show", "print a conversation"),
        ("reset", "forget a conversation's history, keep its metadata"),
        ("delete", "delete a conversation"),
    ):
        p = s_sub.add_parser(action, help=text)
        p.add_argument("session_id", help="id from `sessions list`")
    sessions.set_defaults(handler=_sessions)

    ledger = sub.add_parser(
        "ledger",
        help="see and steer replies owed to users",
        description="The delivery ledger: replies recorded, sent or owed.",
    )
    l_sub = ledger.add_subparsers(dest="action", required=True, metavar="ACTION")
    status = l_sub.add_parser("status", help="counts by state and the latest rows")
    status.add_argument(
        "--state",
        choices=["pending", "attempting", "delivered", "failed", "abandoned"],
        default=None,
    )
    status.add_argument("--limit", type=int, default=20)
    retry = l_sub.add_parser("retry", help="send a failed or abandoned reply again")
    retry.add_argument("obligation_id")
    abandon = l_sub.add_parser("abandon", help="give up on a reply")
    abandon.add_argument("obligation_id")
    abandon.add_argument("--reason", default="abandoned by the operator")
    ledger.set_defaults(handler=_ledger)

    pairing = sub.add_parser(
        "pairing",
        help="approve, list or revoke senders (ACCESS_MODE=pairing)",
        description="Senders who wrote in pairing mode got a one-time code; approving it "
        "lets them in at once, in every running process.",
    )
    p_sub = pairing.add_subparsers(dest="action", required=True, metavar="ACTION")
    approve = p_sub.add_parser("approve", help="let in the sender who was given CODE")
    approve.add_argument("code", metavar="CODE")
    p_sub.add_parser("list", help="pending codes and approved senders")
    revoke = p_sub.add_parser("revoke", help="withdraw an approval")
    revoke.add_argument(
        "target",
        metavar="CODE|PLATFORM:USER_ID",
        help="the code used, or e.g. telegram:123456789 (or telegram:user_<hex> from list)",
    )
    pairing.set_defaults(handler=_pairing)

    send = sub.add_parser(
        "send",
        help="send a message to a chat yourself (through the ledger, exactly once)",
        description="Owe TEXT to a chat as the operator's message: the running bot (same "
        "DATA_DIR or DATABASE_URL) sends it within seconds; with none running it is sent "
        "when the bot starts.",
    )
    send.add_argument(
        "target",
        metavar="PLATFORM:CHAT_ID[:THREAD_ID]",
        help="e.g. telegram:123456789, telegram:-1001234567890:42 or whatsapp:15551234567",
    )
    send.add_argument("text", metavar="TEXT", help="the message; - reads it from standard input")
    send.set_defaults(handler=_send)

    schedule = sub.add_parser(
        "schedule",
        help="list or cancel the messages agents scheduled",
        description="Scheduled messages waiting to be sent (the same database as the bot, "
        "running or not).",
    )
    sc_sub = schedule.add_subparsers(dest="action", required=True, metavar="ACTION")
    sc_list = sc_sub.add_parser("list", help="waiting jobs, soonest first")
    sc_list.add_argument(
        "--chat",
        metavar="PLATFORM:CHAT_ID[:THREAD_ID]",
        default=None,
        help="only this chat's jobs, e.g. telegram:123456789",
    )
    sc_cancel = sc_sub.add_parser("cancel", help="cancel a job that has not been sent")
    sc_cancel.add_argument("job_id", metavar="ID", help="a job id from `schedule list`")
    schedule.set_defaults(handler=_schedule)

    approvals = sub.add_parser(
        "approvals",
        help="list, approve or deny tool calls waiting for approval",
        description="Tool calls waiting for a person's yes (the same database as the bot, "
        "running or not; a running bot goes on within seconds).",
    )
    ap_sub = approvals.add_subparsers(dest="action", required=True, metavar="ACTION")
    ap_sub.add_parser("list", help="waiting approvals, oldest first, with their whole arguments")
    for action, text in (
        ("show", "one approval in full: its state, whole arguments and the tool's result"),
        ("approve", "run the tool call"),
        ("deny", "refuse the tool call"),
    ):
        ap_action = ap_sub.add_parser(action, help=text)
        ap_action.add_argument("approval_id", metavar="ID", help="an id from `approvals list`")
    approvals.set_defaults(handler=_approvals)

    memory = sub.add_parser(
        "memory",
        help="list or forget the facts agents remembered (remember tool)",
        description="Long-term memories (the same database as the bot, running or not).",
    )
    m_sub = memory.add_subparsers(dest="action", required=True, metavar="ACTION")
    m_list = m_sub.add_parser("list", help="every memory, oldest first")
    m_list.add_argument(
        "--user",
        metavar="PLATFORM:USER_ID",
        default=None,
        help="only the memories this person made, e.g. telegram:123456789",
    )
    m_forget = m_sub.add_parser("forget", help="remove one memory")
    m_forget.add_argument("memory_id", metavar="ID", help="a memory id from `memory list`")
    memory.set_defaults(handler=_memory)

    forget_user = sub.add_parser(
        "forget-user",
        help="remove everything the bot holds about one person",
        description="Removes the person's memories, private sessions, journal and ledger "
        "rows, usage, scheduled jobs, approvals, buttons, pairing and window records and "
        "media files; their messages in shared group sessions are replaced by a marker. "
        "Prints what it removed per kind. Asks first on a terminal (--yes: don't).",
    )
    forget_user.add_argument(
        "person",
        metavar="PLATFORM:USER_ID",
        help="e.g. telegram:123456789 (a Telegram user id) or whatsapp:15551234567",
    )
    forget_user.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    forget_user.set_defaults(handler=_forget_user)

    doctor = sub.add_parser(
        "doctor",
        help="check settings, data folder, database, port, agents, models and platforms",
        description="One line per check (ok, WARN or FAIL); exits non-zero if any check fails.",
    )
    doctor.set_defaults(handler=_doctor)

    usage = sub.add_parser(
        "usage",
        help="tokens per agent and UTC day (and money, with MODEL_PRICES)",
        description="Token usage the bot recorded, per agent and UTC day, from the same "
        "database as the bot (running or not). With MODEL_PRICES, a cost column.",
    )
    period = usage.add_mutually_exclusive_group()
    period.add_argument("--since", metavar="YYYY-MM-DD", help="from this UTC day on")
    period.add_argument("--days", type=int, metavar="N", help="the last N UTC days, today included")
    usage.set_defaults(handler=_usage)

    from bot.knowledge_cli import add_knowledge_parser

    add_knowledge_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m bot`` and the ``chatflow`` script."""
    args = _parser().parse_args(argv)
    handler: Command = args.handler
    try:
        typos = setting_typos(Settings.model_fields)
        if handler is not _doctor:  # doctor reports these as lines of its own
            refuse_fatal_typos(typos)
        settings = load_settings()
        level = settings.log_level
        if handler not in (_run, _chat) and "log_level" not in settings.model_fields_set:
            # An operator command prints its answer; its INFO lines (a schema migrated
            # on first use) are noise on its stderr. LOG_LEVEL set still wins.
            level = "WARNING"
        configure_logging(level, settings.log_format)
        if handler is not _doctor:
            for typo in typos:
                logger.warning("%s", typo.message())
            ensure_data_dir(settings.data_dir)
        return asyncio.run(handler(settings, args))
    except ConfigurationError as exc:
        print(f"chatflow: configuration error: {exc}", file=sys.stderr)
        return 2
    except ChatflowError as exc:
        print(f"chatflow: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
