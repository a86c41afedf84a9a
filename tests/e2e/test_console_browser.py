"""The operator console in a real browser, against the real bot and the fake Bot API.

Headless Chromium (Debian's ``chromium``, installed by ``scripts/ensure-chromium.sh``
when missing; never ``playwright install``) signs in, opens the conversation,
takes it over, sees a new message arrive live, replies (the reply reaches the
fake Telegram through the ledger), hands back (the bot answers again) and
starts a test chat on the web channel (answered live). Screenshots are saved
in ``tests/artifacts/``; the README's are ``test_console_screens``' work.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.botprocess import ROOT, BotProcess
from tests.fakes.telegram_server import FakeTelegramServer

pytestmark = pytest.mark.e2e

CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
TOKEN = "browser-test-console-token-0123456789"
DATA = ROOT / "tests" / "data" / "telegram"
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def update(update_id: int, text: str) -> dict[str, Any]:
    payload: dict[str, Any] = copy.deepcopy(json.loads((DATA / "private_text.json").read_text()))
    payload["update_id"] = update_id
    payload["message"].update(text=text, message_id=100 + update_id)
    return payload


def need_chromium() -> None:
    if CHROMIUM.exists():
        return
    message = f"{CHROMIUM} missing: run scripts/ensure-chromium.sh (as root)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
async def telegram() -> AsyncIterator[FakeTelegramServer]:
    async with FakeTelegramServer() as server:
        yield server


def bot_env(telegram: FakeTelegramServer, **more: str) -> dict[str, str]:
    return {
        "TELEGRAM_BOT_TOKEN": telegram.token,
        "TELEGRAM_API_BASE_URL": telegram.base_url,
        **more,
    }


async def test_sign_in_take_over_reply_and_hand_back_in_chromium(
    tmp_path: Path, telegram: FakeTelegramServer
) -> None:
    need_chromium()
    from playwright.async_api import async_playwright, expect

    bot = BotProcess(tmp_path / "data", bot_env(telegram, CONSOLE_TOKEN=TOKEN))
    await bot.start()
    try:
        telegram.push_update(update(1, "hello there"))
        (first,) = await telegram.wait_for_sent(1, within=20)
        async with async_playwright() as driver:
            context = await driver.chromium.launch_persistent_context(
                str(tmp_path / "profile"),
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1100, "height": 800},
            )
            try:
                page = await context.new_page()
                missing: list[str] = []
                page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
                await page.goto(f"{bot.url}/console")
                await expect(page).to_have_url(f"{bot.url}/console/login?next=/console")
                await page.get_by_label("Console token").fill(TOKEN)
                await page.get_by_role("button", name="Sign in").click()
                await expect(page).to_have_url(f"{bot.url}/console")

                row = page.locator("ul.convs > li")
                await expect(row).to_have_count(1)
                await expect(row).to_contain_text("Alice Liddell")  # the name Telegram gave
                await expect(row).to_contain_text("Telegram · DM")
                await expect(row).to_contain_text("Triage")
                ARTIFACTS.mkdir(exist_ok=True)
                await page.screenshot(path=str(ARTIFACTS / "console-conversations.png"))
                link = row.get_by_role("link")
                assert (await link.get_attribute("href") or "").startswith("/console/c/telegram-")
                await link.click()
                messages = page.locator("#messages")
                await expect(messages).to_contain_text("hello there")
                await expect(messages).to_contain_text("delivered")

                await page.get_by_role("button", name="Take over").click()
                await expect(page.get_by_text("A person answers this conversation")).to_be_visible()
                # Arrives while the page is open: shown live, and the bot stays quiet.
                telegram.push_update(update(2, "is anyone <b>there</b>?"))
                await expect(messages).to_contain_text("is anyone <b>there</b>?", timeout=15_000)
                assert len(telegram.sent) == 1

                await page.get_by_label("Reply as a person").fill("Hi, this is Ana from support.")
                await page.get_by_role("button", name="Send").click()
                sent = await telegram.wait_for_sent(2, within=20)
                assert sent[1].text == "Hi, this is Ana from support."
                assert sent[1].chat_id == first.chat_id
                person = messages.locator("li.person")
                await expect(person).to_contain_text("Hi, this is Ana from support.")
                await expect(person).to_contain_text("delivered", timeout=15_000)

                await page.screenshot(
                    path=str(ARTIFACTS / "console-transcript.png"), full_page=True
                )

                await page.get_by_role("button", name="Hand back").click()
                await expect(page.get_by_role("button", name="Take over")).to_be_visible()
                telegram.push_update(update(3, "thanks!"))
                sent = await telegram.wait_for_sent(3, within=20)
                assert sent[2].text != "Hi, this is Ana from support."
                await page.screenshot(path=str(ARTIFACTS / "console-handed-back.png"))

                # The web channel: a test chat through the same inbox, runner and ledger.
                await page.get_by_role("link", name="Try the agents").click()
                await page.get_by_label("your first message").fill("hello from the web")
                await page.get_by_role("button", name="Start").click()
                await expect(page).to_have_url(re.compile(r".*/console/c/web-[0-9a-f]{16}$"))
                await expect(messages).to_contain_text("hello from the web")
                await expect(messages).to_contain_text("You said", timeout=15_000)
                await expect(messages).to_contain_text("delivered", timeout=15_000)
                await page.screenshot(path=str(ARTIFACTS / "console-web-chat.png"))
                assert missing == []  # not even /favicon.ico
            finally:
                await context.close()
        log = "\n".join(bot.log)
        assert TOKEN not in log and "Ana from support" not in log
    finally:
        await bot.stop()


async def test_without_a_token_nothing_of_the_console_exists(
    tmp_path: Path, telegram: FakeTelegramServer
) -> None:
    bot = BotProcess(tmp_path / "data", bot_env(telegram))
    await bot.start()
    try:
        async with httpx.AsyncClient(base_url=bot.url) as client:
            for path in ("/console", "/console/login", "/console/static/console.js"):
                assert (await client.get(path)).status_code == 404, path
            assert (await client.post("/console/login", data={"token": TOKEN})).status_code == 404
            assert (await client.get("/healthz")).status_code == 200
    finally:
        await bot.stop()


async def test_a_short_token_stops_the_bot_with_one_line(
    tmp_path: Path, telegram: FakeTelegramServer
) -> None:
    bot = BotProcess(tmp_path / "data", bot_env(telegram, CONSOLE_TOKEN="too-short"))
    with pytest.raises(AssertionError, match="bot exited"):
        await bot.start(within=30)
    lines = [line for line in bot.log if "CONSOLE_TOKEN" in line]
    assert len(lines) == 1 and "at least 24 characters" in lines[0]
    assert "too-short" not in "\n".join(bot.log)
