"""Pairing codes: format, one pending code per sender, single use, expiry, approvals shared."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest

from bot.core.stores.base import TransactionalStore
from bot.gateway.access.pairing import CACHE_SECONDS, CODE_ALPHABET, Pairing, normalize_code
from bot.gateway.access.rate_limits import sender_digest
from tests.fakes.clock import FakeClock
from tests.gateway.access.access_support import StoreFactory, databases

__all__ = ["databases"]

SECRET = b"p" * 32
TTL = 3600.0


class Ticker:
    """A monotonic clock the test moves (the approval cache reads it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def pairing_on(
    store: TransactionalStore, ticker: Ticker | None = None, ttl: float = TTL
) -> Pairing:
    pairing = Pairing(store, secret=SECRET, ttl_seconds=ttl, monotonic=ticker or Ticker())
    await pairing.open()
    return pairing


async def ask(pairing: Pairing, store: TransactionalStore, sender: str = "42") -> str:
    async with store.transaction() as tx:
        code, _ = await pairing.request_in(tx, "telegram", sender)
    return code


async def issued(pairing: Pairing, store: TransactionalStore, sender: str = "42") -> bool:
    async with store.transaction() as tx:
        _, new = await pairing.request_in(tx, "telegram", sender)
    return new


async def test_a_code_is_one_word_of_unambiguous_characters(databases: StoreFactory) -> None:
    store = await databases()
    pairing = await pairing_on(store)
    codes = {await ask(pairing, store, str(n)) for n in range(50)}
    assert len(codes) == 50
    for code in codes:
        assert re.fullmatch(r"[A-Z0-9]{6,12}", code)
        assert not set(code) & set("0O1IL")
        assert set(code) <= set(CODE_ALPHABET)


async def test_a_sender_asking_again_gets_the_same_pending_code(databases: StoreFactory) -> None:
    store = await databases()
    pairing = await pairing_on(store)
    first = await ask(pairing, store)
    assert await ask(pairing, store) == first
    assert await ask(pairing, store, "43") != first
    assert [p.code for p in await pairing.pending()] == [first, await ask(pairing, store, "43")]


async def test_a_code_counts_as_issued_once_per_lifetime(
    databases: StoreFactory, clock: FakeClock
) -> None:
    """The gateway answers only an issued code: one message per stranger per TTL."""
    store = await databases()
    pairing = await pairing_on(store)
    assert await issued(pairing, store)
    assert not await issued(pairing, store)
    assert await issued(pairing, store, "43")
    clock.advance(seconds=TTL + 1)
    assert await issued(pairing, store)


async def test_two_processes_asking_at_once_agree_on_one_code(databases: StoreFactory) -> None:
    one, two = await databases(), await databases()
    a, b = await pairing_on(one), await pairing_on(two)
    codes = await asyncio.gather(*(ask(a, one) for _ in range(3)), *(ask(b, two) for _ in range(3)))
    assert len(set(codes)) == 1


async def test_approve_lets_the_sender_in_and_uses_the_code_up(databases: StoreFactory) -> None:
    store = await databases()
    ticker = Ticker()
    pairing = await pairing_on(store, ticker)
    assert not await pairing.is_approved("telegram", "42")
    code = await ask(pairing, store)
    outcome, ref = await pairing.approve(f" {code.lower()[:4]}-{code.lower()[4:]} ")
    assert outcome == "approved"
    assert ref == "telegram:user_" + sender_digest("telegram", "42", SECRET)[:12]
    ticker.now += CACHE_SECONDS
    assert await pairing.is_approved("telegram", "42")
    assert not await pairing.is_approved("telegram", "43")
    assert not await pairing.is_approved("whatsapp", "42")
    assert await pairing.approve(code) == ("unknown", None)
    assert await pairing.pending() == []


async def test_unknown_and_expired_codes_are_refused(
    databases: StoreFactory, clock: FakeClock
) -> None:
    store = await databases()
    pairing = await pairing_on(store)
    assert await pairing.approve("ABCDEFGH") == ("unknown", None)
    code = await ask(pairing, store)
    clock.advance(seconds=TTL + 1)
    assert await pairing.approve(code) == ("expired", None)
    assert not await pairing.is_approved("telegram", "42")
    # an expired code is not handed out again: the sender gets a fresh one
    assert await ask(pairing, store) != code


async def test_a_code_expires_after_its_ttl_and_a_new_one_replaces_it(
    databases: StoreFactory, clock: FakeClock
) -> None:
    store = await databases()
    pairing = await pairing_on(store)
    code = await ask(pairing, store)
    clock.advance(seconds=TTL - 1)
    assert await ask(pairing, store) == code
    clock.advance(seconds=2)
    fresh = await ask(pairing, store)
    assert fresh != code
    assert await pairing.approve(code) == ("unknown", None)
    assert (await pairing.approve(fresh))[0] == "approved"


async def test_another_process_approval_counts_at_once_and_revocation_within_seconds(
    databases: StoreFactory,
) -> None:
    bot_store, cli_store = await databases(), await databases()
    ticker = Ticker()
    bot = await pairing_on(bot_store, ticker)
    cli = await pairing_on(cli_store)
    code = await ask(bot, bot_store)
    assert not await bot.is_approved("telegram", "42")
    assert (await cli.approve(code))[0] == "approved"
    assert await bot.is_approved("telegram", "42")  # at once: refusals are not cached
    assert await cli.revoke("telegram:42") == 1
    assert await bot.is_approved("telegram", "42")  # cached for at most CACHE_SECONDS
    ticker.now += CACHE_SECONDS
    assert not await bot.is_approved("telegram", "42")


@pytest.mark.parametrize(
    "how",
    [
        pytest.param("code", id="by-code"),
        pytest.param("raw-id", id="by-platform-and-user-id"),
        pytest.param("raw-id-as-typed", id="by-platform-and-user-id-in-other-case-and-spaces"),
        pytest.param("listed", id="by-ref-from-list"),
    ],
)
async def test_revoke_withdraws_an_approval(databases: StoreFactory, how: str) -> None:
    store = await databases()
    ticker = Ticker()
    pairing = await pairing_on(store, ticker)
    code = await ask(pairing, store)
    _, ref = await pairing.approve(code)
    assert ref is not None
    target = {
        "code": code.lower(),
        "raw-id": "telegram:42",
        "raw-id-as-typed": " Telegram: 42 ",
        "listed": ref,
    }[how]
    assert await pairing.revoke(target) == 1
    ticker.now += CACHE_SECONDS
    assert not await pairing.is_approved("telegram", "42")
    assert await pairing.approvals() == []
    assert await pairing.revoke(target) == 0


async def test_approvals_are_stored_hashed(databases: StoreFactory) -> None:
    store = await databases()
    pairing = await pairing_on(store)
    code = await ask(pairing, store, "16505551234")
    await pairing.approve(code)
    async with store.transaction() as tx:
        rows = await tx.fetchall("SELECT * FROM chatflow_pairing_approvals")
        pending = await tx.fetchall("SELECT * FROM chatflow_pairing_requests")
    assert len(rows) == 1 and pending == []
    assert "16505551234" not in str(rows) and code not in str(rows)
    (approval,) = await pairing.approvals()
    assert approval.sender == sender_digest("telegram", "16505551234", SECRET)


async def test_codes_are_never_logged(
    databases: StoreFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = await databases()
    pairing = await pairing_on(store)
    code = await ask(pairing, store, "16505551234")
    await ask(pairing, store, "16505551234")
    await pairing.approve(code)
    await pairing.revoke(code)
    assert caplog.records  # issuing and approving are logged...
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert code not in text and "16505551234" not in text  # ...without the code or the id


def test_normalize_code_ignores_case_spaces_and_dashes() -> None:
    assert normalize_code(" ab-cd ef23 ") == "ABCDEF23"
