"""The console as an operator meets it, in headless Chromium, over seeded conversations.

A gateway with Telegram, WhatsApp and web adapters (fakes of the platforms, a
scripted model) is filled the way traffic fills it: names the platforms gave,
a group, a handoff, tool calls, a photo, a takeover where the user waits, a
reply abandoned and one failed. The console is served by the bot's own HTTP
server class; Chromium (Debian's, see ``test_console_browser``) looks at it at
1280 px and at 360 px, in the light and the dark scheme.

``CHATFLOW_SCREENSHOTS=1`` also writes ``docs/console-desktop.png`` and
``docs/console-phone.png`` (the README's pictures); otherwise they go to
``tests/artifacts/`` only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette

from bot.config import Settings
from bot.console import console_routes
from bot.core.agent import Agent
from bot.core.models.base import ModelResponse
from bot.core.models.scripted import RecordedCall, ScriptedModel
from bot.core.runner import Runner
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.core.tools import tool
from bot.errors import PlatformError
from bot.gateway.contract import MediaAttachment, MessageEvent
from bot.gateway.gateway import Gateway
from bot.gateway.keys import session_id_for
from bot.gateway.takeover import OperatorDesk
from bot.platforms.web import WebAdapter
from bot.server import HttpServer
from tests.console.conftest import png
from tests.e2e.botprocess import ROOT
from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_ARGS, need_chromium
from tests.fakes.adapter import FakeAdapter, make_event, transient

pytestmark = pytest.mark.e2e

TOKEN = "screens-test-console-token-0123456789"
SECRET = b"k" * 32
ARTIFACTS = ROOT / "tests" / "artifacts"
DOCS = ROOT / "docs"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 360, "height": 760}


@tool
def track_order(order_id: str) -> str:
    """Where an order is."""
    return f"order {order_id}: shipped, DHL JD014600003, due Thursday"


@tool
def open_refund(order_id: str, reason: str) -> str:
    """Open a refund request."""
    return f"refund R-7731 opened for order {order_id}"


class Clock:
    """The store's clock, set back while older conversations are seeded."""

    def __init__(self) -> None:
        self.back = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) - self.back


@dataclass
class Seeded:
    url: str
    gateway: Gateway
    model: ScriptedModel
    telegram: FakeAdapter
    whatsapp: FakeAdapter
    sessions: dict[str, str]
    """Session id by the name the platform gave."""


def named(event: MessageEvent, chat_name: str) -> MessageEvent:
    return dataclasses.replace(event, source=dataclasses.replace(event.source, chat_name=chat_name))


async def talk(
    gateway: Gateway, adapter: FakeAdapter, event: MessageEvent, *, replies: int = 1
) -> str:
    """Deliver ``event``, wait for its turn; the session id."""
    before = len(adapter.sent)
    assert await adapter.deliver(event)
    await gateway._dispatcher.drain(10.0)
    if replies:
        await adapter.wait_for_sent(before + replies)
    return _session_of(gateway, event)


def _session_of(gateway: Gateway, event: MessageEvent) -> str:
    return session_id_for(gateway.session_key_for(event))


async def seed(
    gateway: Gateway, model: ScriptedModel, clock: Clock, tg: FakeAdapter, wa: FakeAdapter
) -> dict[str, str]:
    sessions: dict[str, str] = {}

    # A group on Telegram, three hours ago: a handoff, then a tool.
    clock.back = timedelta(hours=3, minutes=5)
    model.add(
        ScriptedModel.call("transfer_to_order_tracking"),
        ScriptedModel.call("track_order", order_id="1042"),
        ScriptedModel.reply(
            "Order 1042 left the warehouse this morning (DHL JD014600003); "
            "it should arrive on Thursday."
        ),
    )
    event = make_event(
        "@acme_help where is order 1042?",
        platform="telegram",
        chat_id="-100200300",
        sender_id="5001",
        chat_type="group",
        mentions_bot=True,
        sender_name="Sam Okafor",
    )
    sessions["Acme Ops team"] = await talk(gateway, tg, named(event, "Acme Ops team"))

    # WhatsApp, two hours ago: answered, then a person took it and replied.
    clock.back = timedelta(hours=2, minutes=10)
    model.add(ScriptedModel.reply("Yes: tell me the new address and the order number."))
    lucia = make_event(
        "Hola! Can I change the delivery address?",
        platform="whatsapp",
        chat_id="34600111222",
        sender_id="34600111222",
        sender_name="Lucía Fernández",
    )
    sid = await talk(gateway, wa, lucia)
    sessions["Lucía Fernández"] = sid
    await gateway.turns.takeovers.take_over(sid)
    await talk(
        gateway,
        wa,
        make_event(
            "Calle Mayor 12, Madrid. Order 2291.",
            platform="whatsapp",
            chat_id="34600111222",
            sender_id="34600111222",
            sender_name="Lucía Fernández",
        ),
        replies=0,
    )
    desk = OperatorDesk(gateway.store, gateway.ledger, gateway.outbox, gateway.adapters)
    await desk.reply(sid, "Done: order 2291 now goes to Calle Mayor 12.")
    await wa.wait_for_sent(2)

    # WhatsApp, seventy minutes ago: the reply was refused for good (abandoned).
    clock.back = timedelta(minutes=70)
    wa.fail_next.append(
        PlatformError(
            "131047: more than 24 hours since the user wrote", platform="whatsapp", retryable=False
        )
    )
    model.add(ScriptedModel.reply("Your invoice INV-88 is attached to your account page."))
    tomas = make_event(
        "Where can I download my invoice?",
        platform="whatsapp",
        chat_id="351912345678",
        sender_id="351912345678",
        sender_name="Tomás Ribeiro",
    )
    assert await wa.deliver(tomas)
    await gateway._dispatcher.drain(10.0)
    sessions["Tomás Ribeiro"] = _session_of(gateway, tomas)

    # Telegram, forty minutes ago: a photo, a handoff to Billing, a refund, then a
    # person took over and the user wrote again (waiting).
    clock.back = timedelta(minutes=40)
    tg.files["photo-1"] = png()
    model.add(
        ScriptedModel.call("transfer_to_billing"),
        ScriptedModel.call("open_refund", order_id="3317", reason="arrived cracked"),
        ScriptedModel.reply(
            "I'm sorry it arrived broken. I opened refund R-7731 for "
            "order 3317; a colleague will confirm it shortly."
        ),
    )
    photo = MediaAttachment("image", file_id="photo-1", mime_type="image/png")
    priya = make_event(
        "The blender from order 3317 arrived cracked.",
        platform="telegram",
        chat_id="7001",
        sender_id="7001",
        sender_name="Priya Natarajan",
        media=[photo],
    )
    sid = await talk(gateway, tg, named(priya, "Priya Natarajan"))
    sessions["Priya Natarajan"] = sid
    await gateway.turns.takeovers.take_over(sid)
    await talk(
        gateway,
        tg,
        named(
            make_event(
                "Thanks. Will it be a full refund, shipping included?",
                platform="telegram",
                chat_id="7001",
                sender_id="7001",
                sender_name="Priya Natarajan",
            ),
            "Priya Natarajan",
        ),
        replies=0,
    )

    # Telegram, now: two messages nobody has read yet.
    clock.back = timedelta(minutes=1)
    model.add(ScriptedModel.reply("Hi Mei! Order 5120 is packed and leaves today."))
    mei = make_event(
        "Hi! Is order 5120 on its way?",
        platform="telegram",
        chat_id="7003",
        sender_id="7003",
        sender_name="Mei Chen",
    )
    sessions["Mei Chen"] = await talk(gateway, tg, named(mei, "Mei Chen"))
    model.add(ScriptedModel.reply("You're welcome!"))
    await talk(
        gateway,
        tg,
        named(
            make_event(
                "Great, thank you!",
                platform="telegram",
                chat_id="7003",
                sender_id="7003",
                sender_name="Mei Chen",
            ),
            "Mei Chen",
        ),
    )
    # Telegram, fifteen minutes ago (seeded last: the fake's next send fails): the send
    # failed and waits for its retry.
    clock.back = timedelta(minutes=15)
    tg.fail_next.append(transient("Bad Gateway", platform="telegram"))
    model.add(ScriptedModel.reply("We ship to Austria: 3-5 working days, free above 50 EUR."))
    jonas = make_event(
        "Do you ship to Austria?",
        platform="telegram",
        chat_id="7002",
        sender_id="7002",
        sender_name="Jonas Weber",
    )
    assert await tg.deliver(named(jonas, "Jonas Weber"))
    await gateway._dispatcher.drain(10.0)
    sessions["Jonas Weber"] = _session_of(gateway, jonas)

    clock.back = timedelta()
    # Telegram goes away: the retry, 30 s on, waits instead of delivering, so the
    # reply is failed, or (a test slower than 30 s) pending with "waiting: telegram is
    # not connected": owed either way, never delivered.
    await tg.stop()
    return sessions


@asynccontextmanager
async def seeded_console(tmp_path: Path) -> AsyncIterator[Seeded]:
    clock = Clock()
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"), clock=clock)
    model = ScriptedModel()
    billing = Agent(name="Billing", instructions="Refunds.", tools=[open_refund])
    orders = Agent(name="Order Tracking", instructions="Orders.", tools=[track_order])
    triage = Agent(name="Triage", instructions="Route.", handoffs=[orders, billing])
    runner = Runner(triage, store, model=model)
    telegram, whatsapp = FakeAdapter(name="telegram"), FakeAdapter(name="whatsapp")
    settings = Settings(data_dir=tmp_path)
    gateway = Gateway(runner, store, [telegram, whatsapp, WebAdapter()], settings, secret=SECRET)
    await gateway.start()
    await gateway.wait_ready()
    server: HttpServer | None = None
    try:
        sessions = await seed(gateway, model, clock, telegram, whatsapp)
        server = HttpServer(
            Starlette(routes=await console_routes(TOKEN, SECRET, gateway)), "127.0.0.1", 0
        )
        await server.start()
        yield Seeded(
            f"http://127.0.0.1:{server.port}", gateway, model, telegram, whatsapp, sessions
        )
    finally:
        if server is not None:
            await server.stop()
        await gateway.stop(grace=1)
        await store.close()


@asynccontextmanager
async def chromium(tmp_path: Path) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as driver:
        browser = await driver.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            await browser.close()


async def signed_in(browser: Any, url: str, viewport: dict[str, int], scheme: str = "light") -> Any:
    context = await browser.new_context(viewport=viewport, color_scheme=scheme)
    page = await context.new_page()
    await page.goto(f"{url}/console")
    ARTIFACTS.mkdir(exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"console-login-{viewport['width']}.png"))
    await page.get_by_label("Console token").fill(TOKEN)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url(f"{url}/console")
    return page


def save(name: str) -> Path:
    """Where a screenshot goes: ``docs/`` when asked, else the artifacts folder."""
    if os.environ.get("CHATFLOW_SCREENSHOTS"):
        return DOCS / name
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


async def boxes(*locators: Any) -> list[Any]:
    """The elements' boxes, once all are laid out: the live view may swap the messages
    in between two reads, and a detached element has no box."""
    async with asyncio.timeout(10):
        while True:
            found = [await locator.bounding_box() for locator in locators]
            if all(found):
                return found
            await asyncio.sleep(0.05)


async def test_the_console_at_desktop_and_phone_widths(tmp_path: Path) -> None:
    need_chromium()
    from playwright.async_api import expect

    async with seeded_console(tmp_path) as seeded, chromium(tmp_path) as browser:
        page = await signed_in(browser, seeded.url, DESKTOP)
        failures: list[str] = []
        page.on("response", lambda r: failures.append(r.url) if r.status >= 400 else None)
        page.on("console", lambda m: failures.append(m.text) if m.type == "error" else None)

        # The inbox: names the platforms gave, previews, platform, state, unread.
        rows = page.locator("ul.convs > li")
        await expect(rows).to_have_count(6)
        mei = rows.filter(has_text="Mei Chen")
        await expect(mei).to_contain_text("You're welcome!")
        await expect(mei).to_contain_text("Telegram")
        await expect(mei.locator(".unread-count")).to_have_text("2 unread")
        await expect(rows.filter(has_text="Acme Ops team")).to_contain_text("group")
        await expect(rows.filter(has_text="Priya Natarajan")).to_contain_text("Waiting")
        await expect(rows.filter(has_text="Lucía Fernández")).to_contain_text("WhatsApp")
        await expect(page.locator(".tabs .count.warn")).to_have_text("1")
        await expect(rows.filter(has_text="Lucía Fernández")).to_contain_text("Human")
        assert "telegram-" not in await rows.first.inner_text()

        # A transcript: bubbles, the photo inline, tools and handoffs on the bot's side.
        await rows.filter(has_text="Priya Natarajan").get_by_role("link").click()
        messages = page.locator("#messages")
        await expect(messages).to_contain_text("arrived cracked")
        photo = messages.locator("li.user img")
        await expect(photo).to_be_visible()
        assert await photo.evaluate("img => img.naturalWidth") == 240
        await expect(messages.locator("li.handoff")).to_contain_text("Transferred to Billing")
        await expect(page.locator("#conv-head")).to_contain_text("Waiting")
        await expect(page.get_by_role("button", name="Hand back")).to_be_visible()
        user_box, tool_box, agent_box = await boxes(
            messages.locator("li.user").first,
            messages.locator("li.tool").filter(has_text="open_refund"),
            messages.locator("li.agent").last,
        )
        assert tool_box["x"] > user_box["x"] + 100  # not in the user's column
        assert abs(tool_box["x"] + tool_box["width"] - agent_box["x"] - agent_box["width"]) < 2
        await page.screenshot(path=str(save("console-desktop.png")))
        await page.emulate_media(color_scheme="dark")
        await page.screenshot(path=str(ARTIFACTS / "console-desktop-dark.png"))
        await page.emulate_media(color_scheme="light")
        await expect(page.locator(".conv.current")).to_contain_text("Priya Natarajan")

        # The ledger: what needs a person first.
        await page.get_by_role("link", name="Ledger").click()
        owed = page.locator("li.owed")
        await expect(owed).to_have_count(2)
        await expect(owed.first).to_contain_text("abandoned")
        await expect(owed.first).to_contain_text("Tomás Ribeiro")
        await expect(owed.nth(1)).to_contain_text(
            re.compile(r"failed|waiting: telegram is not connected")
        )
        await page.screenshot(path=str(ARTIFACTS / "console-desktop-ledger.png"), full_page=True)
        await page.goto(seeded.url + "/console")
        await page.screenshot(path=str(ARTIFACTS / "console-desktop-inbox.png"), full_page=True)
        assert failures == []  # no favicon 404, no script error

        # Phone: nothing wider than the screen, on every page.
        phone = await signed_in(browser, seeded.url, PHONE)
        sid = seeded.sessions["Priya Natarajan"]
        pages = ("/console", f"/console/c/{sid}", "/console/ledger", "/console/web")
        for n, path in enumerate(pages):
            await phone.goto(seeded.url + path)
            width = await phone.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"], (path, width)
            ARTIFACTS.mkdir(exist_ok=True)
            await phone.screenshot(path=str(ARTIFACTS / f"console-phone-{n}.png"), full_page=True)
        await phone.goto(seeded.url + "/console")
        await phone.screenshot(path=str(save("console-phone.png")), full_page=True)
        # N9: the nav wraps on a phone: every tab on screen, none scrolled out of sight.
        edges = await phone.evaluate(
            "[...document.querySelectorAll('.tabs a')].map(a => a.getBoundingClientRect().right)"
        )
        assert len(edges) >= 4 and max(edges) <= PHONE["width"], edges

        # Both colour schemes render: light text on dark, dark text on light.
        for scheme, dark in (("light", False), ("dark", True)):
            await phone.emulate_media(color_scheme=scheme)
            colours = await phone.evaluate(
                "[getComputedStyle(document.body).backgroundColor,"
                " getComputedStyle(document.body).color]"
            )
            background, text = (_luminance(c) for c in colours)
            assert (background < text) is dark, (scheme, colours)
            await phone.screenshot(path=str(ARTIFACTS / f"console-phone-{scheme}.png"))


def _luminance(css: str) -> float:
    red, green, blue = (float(v) for v in css[css.index("(") + 1 : -1].split(",")[:3])
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


async def test_a_new_test_chat_header_follows_the_conversation_live(tmp_path: Path) -> None:
    """D14: right after "Start" the header showed ``web · ? · agent Triage`` until a reload."""
    need_chromium()
    from playwright.async_api import expect

    async with seeded_console(tmp_path) as seeded, chromium(tmp_path) as browser:
        page = await signed_in(browser, seeded.url, DESKTOP)
        go = asyncio.Event()

        async def after_the_page_is_shown(call: RecordedCall) -> ModelResponse:
            await go.wait()
            return ScriptedModel.call("transfer_to_billing")

        seeded.model.add(
            after_the_page_is_shown, ScriptedModel.reply("Billing here: how can I help?")
        )
        await page.get_by_role("link", name="Try the agents").click()
        await page.locator("textarea#text").fill("I was charged twice")
        await page.get_by_role("button", name="Start").click()
        head = page.locator("main")  # the header, by what it says on any version
        await expect(head).to_contain_text("agent Triage")  # before the turn is done
        go.set()
        await expect(page.locator("#messages")).to_contain_text("Billing here", timeout=15_000)
        await expect(head).to_contain_text("agent Billing", timeout=15_000)
        await expect(page.locator("#conv-head")).to_contain_text("Web · DM")
