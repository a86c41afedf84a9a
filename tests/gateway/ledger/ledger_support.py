"""Helpers shared by the ledger tests (``test_ledger*.py``): ledgers, rows, owners."""

from __future__ import annotations

import os
from typing import Any

from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.instances import Owner
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation, compute_obligation_id
from tests.fakes.clock import FakeClock

CONTENT = "Tu pedido 4411 sale mañana"

ONE_REPLY: dict[str, Any] = dict(
    obligation_id="o1",
    session_key="k",
    session_id="s",
    platform="telegram",
    chat_id="42",
    thread_id=None,
    reply_to=None,
    content="x",
    message_ref="m",
)
"""Keyword arguments of ``record_obligation_in`` for one small reply."""


def dead_owner(tag: str = "previous") -> Owner:
    """Same pid as this process, another instance: a predecessor that died (PID reuse)."""
    return Owner(os.getpid(), f"dead-{tag}")


async def open_ledger(
    store: SQLiteSessionStore, clock: FakeClock, owner: Owner | None = None
) -> DeliveryLedger:
    """An opened ledger on ``store``, owned by this process unless ``owner`` is given."""
    made = DeliveryLedger(store, clock=clock, owner=owner)
    await made.open()
    return made


async def record(
    ledger: DeliveryLedger,
    ref: str = "telegram:42:1",
    *,
    platform: str = "telegram",
    content: str = CONTENT,
    thread_id: str | None = None,
) -> str:
    """Record one reply through ``record_obligation``; returns its id."""
    key = f"agent:main:{platform}:dm:chat_0123456789ab"
    oid = compute_obligation_id(key, ref, content)
    assert await ledger.record_obligation(
        obligation_id=oid,
        session_key=key,
        session_id=f"{platform}-0123456789abcdef",
        platform=platform,
        chat_id="42",
        thread_id=thread_id,
        reply_to="1",
        content=content,
        message_ref=ref,
    )
    return oid


async def get(ledger: DeliveryLedger, oid: str) -> Obligation:
    """The stored obligation ``oid`` (it must exist)."""
    row = await ledger.get(oid)
    assert row is not None
    return row


async def owner_of(store: SQLiteSessionStore, oid: str) -> tuple[int, str]:
    """``(pid, instance id)`` stamped on the row ``oid``."""
    async with store.transaction() as tx:
        row = await tx.fetchone(
            "SELECT owner_pid, owner_instance FROM chatflow_delivery_obligations "
            "WHERE obligation_id = ?",
            (oid,),
        )
    assert row is not None
    return int(row[0]), str(row[1])
