"""``python -m bot approvals list|approve|deny``: the operator's answer to gated tool calls."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bot import Agent, tool
from bot.agents_loader import LoadedAgents
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.doctor import _check_approvals
from bot.gateway.approvals import OPERATOR_OWNER, TABLE, ensure_approvals_schema_in
from tests.test_cli import _bot

PHONE = "15551234567"


def _approvals(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    result = _bot(tmp_path, "approvals", *args)
    return result.returncode, result.stdout, result.stderr


def _sqlite(tmp_path: Path) -> SQLiteSessionStore:
    (tmp_path / "data").mkdir(exist_ok=True)
    return SQLiteSessionStore(str(tmp_path / "data" / "chatflow.db"))


async def _pending(
    tmp_path: Path,
    approval_id: str,
    *,
    ttl: float = 3600,
    arguments: dict[str, object] | None = None,
) -> None:
    store = _sqlite(tmp_path)
    now = time.time()
    async with store.transaction() as tx:
        await ensure_approvals_schema_in(tx)
        await tx.execute(
            f"INSERT INTO {TABLE} (id, session_key, session_id, platform, chat_id, thread_id, "
            "sender_ref, agent, tool_name, call_id, arguments_json, state, created_at, "
            "expires_at) VALUES (?, ?, ?, 'whatsapp', ?, NULL, 'user_0123456789ab', 'Billing', "
            "'refund', 'call_1', ?, 'pending', ?, ?)",
            (
                approval_id,
                "agent:main:whatsapp:dm:chat_x",
                "whatsapp-0123456789abcdef",
                PHONE,
                json.dumps(arguments or {"amount": 25, "order_id": "1001"}),
                now,
                now + ttl,
            ),
        )
    await store.close()


async def _state(tmp_path: Path, approval_id: str) -> tuple[str, str | None]:
    store = _sqlite(tmp_path)
    async with store.transaction() as tx:
        row = await tx.fetchone(
            f"SELECT state, decided_by FROM {TABLE} WHERE id = ?", (approval_id,)
        )
        inbox = await tx.fetchone(
            "SELECT owner_instance, state FROM chatflow_inbox WHERE message_id = ?",
            (f"approval:{approval_id}",),
        )
    await store.close()
    assert row is not None
    assert inbox == (OPERATOR_OWNER, "received")  # for the bot to run
    return str(row[0]), None if row[1] is None else str(row[1])


def test_list_with_nothing_waiting_says_so(tmp_path: Path) -> None:
    code, out, err = _approvals(tmp_path, "list")
    assert (code, out) == (0, "No approvals waiting.\n"), err


async def test_list_shows_the_waiting_call_without_the_chat_id(tmp_path: Path) -> None:
    await _pending(tmp_path, "a1b2c3d4e5f6")
    code, out, err = _approvals(tmp_path, "list")
    assert code == 0, err
    [line] = out.splitlines()
    assert line.startswith("a1b2c3d4e5f6  expires ")
    assert "whatsapp-0123456789abcdef" in line
    assert line.endswith('Billing: refund {"amount": 25, "order_id": "1001"}')
    assert PHONE not in out


async def test_list_and_show_print_the_whole_arguments(tmp_path: Path) -> None:
    """G5: what runs on approve is printed whole, however long (list and show)."""
    to = "anna@example-customer.com,billing@example-customer.com,exfil@evil.example"
    await _pending(tmp_path, "a1b2c3d4e5f6", arguments={"to": to, "body": "x" * 500})
    code, out, err = _approvals(tmp_path, "list")
    assert code == 0, err
    assert "exfil@evil.example" in out and "x" * 500 in out
    code, out, err = _approvals(tmp_path, "show", "a1b2c3d4e5f6")
    assert code == 0, err
    assert out.splitlines()[0] == "approval a1b2c3d4e5f6: pending"
    assert f'"to": "{to}"' in out and "x" * 500 in out and PHONE not in out
    code, out, err = _approvals(tmp_path, "show", "nope")
    assert code == 2 and "no approval nope" in err


async def test_approve_decides_once_and_journals_the_turn(tmp_path: Path) -> None:
    await _pending(tmp_path, "a1b2c3d4e5f6")
    code, out, err = _approvals(tmp_path, "approve", "a1b2c3d4e5f6")
    assert (code, out) == (0, "approved a1b2c3d4e5f6\n"), err
    assert await _state(tmp_path, "a1b2c3d4e5f6") == ("approved", "operator")
    code, out, err = _approvals(tmp_path, "deny", "a1b2c3d4e5f6")
    assert code == 2 and "already decided" in err
    assert await _state(tmp_path, "a1b2c3d4e5f6") == ("approved", "operator")
    assert _approvals(tmp_path, "list")[1] == "No approvals waiting.\n"


async def test_deny_and_the_refusals(tmp_path: Path) -> None:
    await _pending(tmp_path, "a1b2c3d4e5f6")
    code, out, err = _approvals(tmp_path, "deny", "a1b2c3d4e5f6")
    assert (code, out) == (0, "denied a1b2c3d4e5f6\n"), err
    assert await _state(tmp_path, "a1b2c3d4e5f6") == ("denied", "operator")
    code, _, err = _approvals(tmp_path, "approve", "nope")
    assert code == 2 and "no such approval" in err


async def test_a_decision_after_the_expiry_time_expires_it(tmp_path: Path) -> None:
    await _pending(tmp_path, "0000aaaa1111", ttl=-1)
    code, _, err = _approvals(tmp_path, "approve", "0000aaaa1111")
    assert code == 2 and "expired" in err
    assert (await _state(tmp_path, "0000aaaa1111"))[0] == "expired"


def test_doctor_lists_the_tools_that_wait_for_approval(tmp_path: Path) -> None:
    result = _bot(tmp_path, "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    # The refund's check first declines what cannot be refunded (an unpaid invoice).
    assert "ok   approvals: Billing: request_refund (when its check says so)\n" in result.stdout


def test_doctor_says_which_tools_ask_only_sometimes_and_when_none_asks() -> None:
    @tool(needs_approval=lambda ctx, args: True)
    def pay(amount: float) -> str:
        """Pay."""
        return "paid"

    @tool
    def look() -> str:
        """Look."""
        return "ok"

    sometimes = _check_approvals(
        LoadedAgents(Agent(name="Ops", instructions="x", tools=[pay, look]), "x")
    )
    assert sometimes.detail == "Ops: pay (when its check says so)"
    never = _check_approvals(LoadedAgents(Agent(name="Ops", instructions="x", tools=[look]), "x"))
    assert (never.ok, never.detail) == (True, "no tool waits for approval")
