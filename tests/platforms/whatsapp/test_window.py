"""WhatsApp's 24-hour customer-service window: the record, the template, the abandons.

The adapter sends to the fake Graph API over HTTP; the window's record lives in a
SQLite store on a hand-moved clock and is written by the inbox's tx 1, as in the bot.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.core.stores.base import TransactionalStore
from bot.core.stores.postgres import PostgresSessionStore
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.contract import MessageEvent, SessionSource
from bot.gateway.inbox import Inbox
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import Obligation
from bot.gateway.outbox import Outbox
from bot.gateway.proactive.windows import TABLE, ContactWindows, window_open
from bot.metrics import Metrics
from bot.platforms.whatsapp.adapter import WhatsAppAdapter
from bot.platforms.whatsapp.templates import (
    PARAMETER_LIMIT,
    WINDOW_CLOSED_REASON,
    WINDOW_SECONDS,
    template_parameter,
    template_parts,
)
from tests.fakes.clock import FakeClock
from tests.fakes.whatsapp_server import FakeWhatsAppServer
from tests.fakes.whatsapp_webhook import PHONE_NUMBER_ID, USER_WA_ID, real_wamid
from tests.pgtest import pg_dsn

__all__ = ["pg_dsn"]  # the fixture, used by name

SECRET = b"s" * 32
TEMPLATE = "order_update"
TEXT = "Tu pedido 4411 sale mañana.\n\nTe aviso cuando llegue."


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SQLiteSessionStore]:
    made = SQLiteSessionStore(tmp_path / "chatflow.db", clock=clock)
    await made.open()
    yield made
    await made.close()


@pytest.fixture
def windows(store: SQLiteSessionStore, clock: FakeClock) -> ContactWindows:
    return ContactWindows(store, SECRET, platforms=["whatsapp"], clock=clock)


@pytest.fixture
async def graph() -> AsyncIterator[FakeWhatsAppServer]:
    async with FakeWhatsAppServer(phone_id=PHONE_NUMBER_ID) as server:
        yield server


async def _ignore(event: MessageEvent) -> bool:
    return True


async def start_adapter(
    graph: FakeWhatsAppServer, windows: ContactWindows, template: str | None = TEMPLATE
) -> WhatsAppAdapter:
    adapter = WhatsAppAdapter(
        PHONE_NUMBER_ID,
        "test-token",
        verify_token="vt",
        app_secret="secret",
        api_base_url=graph.base_url,
        send_pause=0,
        template_name=template,
        template_language="es_MX" if template else "en_US",
    )
    adapter.windows = windows
    await adapter.start(_ignore)
    return adapter


async def user_writes(store: TransactionalStore, windows: ContactWindows, n: int = 1) -> None:
    """The user's message accepted by tx 1, as the gateway does."""
    inbox = Inbox(store, on_accept_in=windows.record_in)
    event = MessageEvent(
        platform="whatsapp",
        source=SessionSource("whatsapp", USER_WA_ID, "dm", USER_WA_ID),
        text="hola",
        message_id=f"whatsapp:{real_wamid(USER_WA_ID)}:{n}",
        platform_message_id=real_wamid(USER_WA_ID),
    )
    assert await inbox.accept(event, session_key="agent:main:whatsapp:dm:x", session_id="s1")


# -- the arithmetic and the record ------------------------------------------------------


def test_window_arithmetic() -> None:
    day = WINDOW_SECONDS
    assert day == 86_400
    assert window_open(None, 1_000.0, day) is None
    assert window_open(1_000.0, 1_000.0, day) is True
    assert window_open(1_000.0, 1_000.0 + day - 1, day) is True
    assert window_open(1_000.0, 1_000.0 + day, day) is False
    assert window_open(1_000.0, 1_000.0 + 3 * day, day) is False


async def test_inbound_opens_the_window_for_24_hours_by_hashed_id(
    store: SQLiteSessionStore, windows: ContactWindows, clock: FakeClock
) -> None:
    assert await windows.is_open("whatsapp", USER_WA_ID, WINDOW_SECONDS) is None
    await user_writes(store, windows)
    clock.advance(hours=23, minutes=59)
    assert await windows.is_open("whatsapp", USER_WA_ID, WINDOW_SECONDS) is True
    clock.advance(minutes=1)
    assert await windows.is_open("whatsapp", USER_WA_ID, WINDOW_SECONDS) is False
    # A new message opens it again.
    await user_writes(store, windows, n=2)
    assert await windows.is_open("whatsapp", USER_WA_ID, WINDOW_SECONDS) is True
    async with store.transaction() as tx:
        rows = await tx.fetchall(f"SELECT platform, chat_key FROM {TABLE}")
    assert len(rows) == 1
    assert USER_WA_ID not in repr(rows)
    assert str(rows[0][1]).startswith("chat_")


# -- the parameter --------------------------------------------------------------------------


def test_a_parameter_is_folded_and_a_long_one_split_in_numbered_parts_never_cut() -> None:
    assert template_parts(TEXT) == ["Tu pedido 4411 sale mañana. Te aviso cuando llegue."]
    long_text = "pedido\n" * 1000 + "https://example.com/" + "x" * 1500
    parts = template_parts(long_text)
    assert PARAMETER_LIMIT == 974
    assert all(len(p) <= PARAMETER_LIMIT for p in parts)
    assert [p.split(" ", 1)[0] for p in parts] == [f"({i}/10)" for i in range(1, 11)]
    # Nothing lost: the parts, numbers removed, rebuild the folded text (the long
    # "word" was split where a part ended).
    bodies = [p.split(" ", 1)[1] for p in parts]
    assert "".join(bodies).replace(" ", "") == template_parameter(long_text).replace(" ", "")


# -- sending --------------------------------------------------------------------------------


async def test_open_window_sends_free_form_text(
    store: SQLiteSessionStore,
    windows: ContactWindows,
    clock: FakeClock,
    graph: FakeWhatsAppServer,
) -> None:
    adapter = await start_adapter(graph, windows)
    try:
        await user_writes(store, windows)
        clock.advance(hours=23)
        await adapter.send(USER_WA_ID, TEXT)
    finally:
        await adapter.stop()
    (sent,) = graph.sent
    assert sent.json["type"] == "text" and sent.json["text"]["body"] == TEXT
    assert graph.templates == []


async def test_closed_window_sends_the_template_with_the_text_as_parameter(
    store: SQLiteSessionStore,
    windows: ContactWindows,
    clock: FakeClock,
    graph: FakeWhatsAppServer,
) -> None:
    adapter = await start_adapter(graph, windows)
    try:
        await user_writes(store, windows)
        clock.advance(hours=25)
        inbound = real_wamid(USER_WA_ID)
        result = await adapter.send(USER_WA_ID, TEXT, reply_to=inbound)
    finally:
        await adapter.stop()
    assert graph.rejected == []  # no free-form attempt: our clock said closed
    (sent,) = graph.sent
    assert graph.templates == [sent]
    assert result.message_ids == graph.sent_wamids
    assert sent.json["to"] == USER_WA_ID
    assert sent.json["template"]["name"] == TEMPLATE
    assert sent.json["template"]["language"] == {"code": "es_MX"}
    assert graph.template_texts(sent) == [template_parameter(TEXT)]
    assert sent.json["context"] == {"message_id": inbound}


async def test_meta_131047_switches_to_the_template_once(
    windows: ContactWindows, graph: FakeWhatsAppServer
) -> None:
    graph.close_window(USER_WA_ID)  # Meta's clock says closed; ours has no record
    adapter = await start_adapter(graph, windows)
    try:
        await adapter.send(USER_WA_ID, TEXT)
    finally:
        await adapter.stop()
    (refused,) = graph.rejected
    assert refused.json["type"] == "text"
    (sent,) = graph.sent
    assert graph.templates == [sent]
    assert graph.template_texts(sent) == [template_parameter(TEXT)]


# -- through the ledger: what is abandoned, and why --------------------------------------


async def send_owed(
    store: SQLiteSessionStore, clock: FakeClock, adapter: WhatsAppAdapter
) -> tuple[Obligation, list[str]]:
    """One reply owed to the user, sent through the outbox; the row after it, and the
    platforms whose rows were abandoned."""
    abandoned: list[str] = []
    ledger = DeliveryLedger(store, clock=clock, on_abandoned=abandoned.append)
    await ledger.open()
    owed = Obligation.owed(
        obligation_id="ob-window",
        session_key="agent:main:whatsapp:dm:chat_x",
        session_id="s1",
        platform="whatsapp",
        chat_id=USER_WA_ID,
        thread_id=None,
        reply_to=None,
        content=TEXT,
        message_ref="whatsapp:m1",
    )
    async with store.transaction() as tx:
        assert await ledger.record_in(tx, owed, claimed=True)
    claimed = await ledger.get(owed.obligation_id)
    assert claimed is not None
    await Outbox(ledger, {"whatsapp": adapter}, Metrics()).send(claimed)
    row = await ledger.get(owed.obligation_id)
    assert row is not None
    return row, abandoned


async def test_no_template_abandons_with_the_reason(
    store: SQLiteSessionStore,
    windows: ContactWindows,
    clock: FakeClock,
    graph: FakeWhatsAppServer,
) -> None:
    adapter = await start_adapter(graph, windows, template=None)
    try:
        await user_writes(store, windows)
        clock.advance(days=2)
        row, abandoned = await send_owed(store, clock, adapter)
    finally:
        await adapter.stop()
    assert row.state == "abandoned"
    assert row.last_error == WINDOW_CLOSED_REASON
    assert WINDOW_CLOSED_REASON == "WhatsApp 24-hour window closed; set WHATSAPP_TEMPLATE_NAME"
    assert abandoned == ["whatsapp"]
    assert graph.requests == []


async def test_no_template_after_meta_131047_abandons_with_the_reason(
    store: SQLiteSessionStore,
    windows: ContactWindows,
    clock: FakeClock,
    graph: FakeWhatsAppServer,
) -> None:
    graph.close_window(USER_WA_ID)
    adapter = await start_adapter(graph, windows, template=None)
    try:
        row, _ = await send_owed(store, clock, adapter)
    finally:
        await adapter.stop()
    assert row.state == "abandoned"
    assert row.last_error == WINDOW_CLOSED_REASON
    assert len(graph.rejected) == 1 and graph.sent == []


@pytest.mark.parametrize("code", [132000, 132001, 132005, 132012, 132015, 132016])
async def test_template_errors_are_permanent_with_the_code(
    code: int,
    store: SQLiteSessionStore,
    windows: ContactWindows,
    clock: FakeClock,
    graph: FakeWhatsAppServer,
) -> None:
    adapter = await start_adapter(graph, windows)
    try:
        await user_writes(store, windows)
        clock.advance(days=2)
        # A 5xx would make any other error retryable: a template refusal stays final.
        graph.inject_error(code, status=500 if code == 132015 else 400)
        row, abandoned = await send_owed(store, clock, adapter)
    finally:
        await adapter.stop()
    assert row.state == "abandoned"
    assert row.attempts == 1
    assert str(code) in (row.last_error or "")
    assert abandoned == ["whatsapp"]
    (refused,) = graph.rejected
    assert refused.json["type"] == "template"


async def test_the_record_works_on_postgres(pg_dsn: str) -> None:
    clock = FakeClock()
    async with PostgresSessionStore(pg_dsn, clock=clock) as store:
        windows = ContactWindows(store, SECRET, platforms=["whatsapp"], clock=clock)
        await user_writes(store, windows)
        clock.advance(hours=1)
        await user_writes(store, windows, n=2)  # moves the window on (ON CONFLICT DO UPDATE)
        clock.advance(hours=23, minutes=59)
        assert await windows.is_open("whatsapp", USER_WA_ID, WINDOW_SECONDS) is True
        clock.advance(minutes=1)
        assert await windows.is_open("whatsapp", USER_WA_ID, WINDOW_SECONDS) is False


def test_doctor_shows_the_template_settings() -> None:
    from bot.config import Settings
    from bot.doctor import _whatsapp_template

    unset = _whatsapp_template(Settings(_env_file=None))
    assert unset.ok and unset.warning
    assert "not set: replies after 24 h of silence are abandoned" in unset.detail
    named = _whatsapp_template(
        Settings(
            _env_file=None, whatsapp_template_name=TEMPLATE, whatsapp_template_language="pt_BR"
        )
    )
    assert named.ok and not named.warning
    assert named.detail == f"{TEMPLATE} (pt_BR)"
