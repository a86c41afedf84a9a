"""The console as an operator's inbox: names, previews, states, unread counts,
attachments inline, the live header, the ledger's order, and its small faults (D14, D16)."""

from __future__ import annotations

import html
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.console.guard import SECURITY_HEADERS
from bot.core.models.scripted import ScriptedModel
from bot.errors import PlatformError
from bot.gateway.contract import MediaAttachment
from bot.logs import configure_logging, quiet_console_logs
from bot.platforms.whatsapp.payload import parse_webhook
from tests.console.conftest import TOKEN, ConsoleRig, csrf_of, png, running_console
from tests.fakes.adapter import FakeAdapter, make_event

PAYLOADS = Path("/work/shared/payloads/whatsapp")
PHONE = "+15551234567"


def whatsapp_payload() -> dict[str, object]:
    """A real webhook body (whatsapp-api-js's fixture): a text from "test user name"."""
    path = PAYLOADS / "whatsapp-api-js" / "incoming.json"
    return json.loads(path.read_text())  # type: ignore[no-any-return]


@pytest.fixture
def whatsapp(tmp_path: Path) -> Iterator[ConsoleRig]:
    with running_console(tmp_path, FakeAdapter(name="whatsapp")) as rig:
        yield rig


def talk(console: ConsoleRig, text: str = "hello", reply: str = "Hi!", **event: object) -> str:
    console.model.add(ScriptedModel.reply(reply))
    console.deliver(make_event(text, chat_id=PHONE, sender_id=PHONE, **event))  # type: ignore[arg-type]
    return console.session_id()


def line_of(page: str, session_id: str) -> str:
    """The inbox line of ``session_id`` in a page's HTML."""
    found = re.search(
        rf'<li class="conv[^"]*">\s*<a href="/console/c/{session_id}"[^>]*>(.*?)</a>\s*</li>',
        page,
        re.S,
    )
    assert found is not None, page
    return words(html.unescape(re.sub(r"<[^>]+>", " ", found.group(1))))


def words(text: str) -> str:
    return " ".join(text.split())


def test_the_inbox_shows_the_name_whatsapp_gave_the_last_message_and_who_answers(
    whatsapp: ConsoleRig,
) -> None:
    (event,) = parse_webhook(whatsapp_payload(), phone_id="123456123").events
    whatsapp.model.add(ScriptedModel.reply("Hello! How can I help?"))
    whatsapp.deliver(event)
    session_id = whatsapp.session_id()
    whatsapp.sign_in()

    page = whatsapp.client.get("/console").text
    assert "test user name" in page
    line = line_of(page, session_id)
    assert line.startswith("TU test user name")  # initials, then the name WhatsApp gave
    assert "Helper: Hello! How can I help?" in line
    assert "WhatsApp · DM" in line and "Bot · Helper" in line
    assert "16315551181" not in page and "US.1349" not in page  # no raw ids
    transcript = whatsapp.client.get(f"/console/c/{session_id}").text
    assert "<h1>test user name</h1>" in transcript
    listing = whatsapp.client.get(
        "/console/api/conversations", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()["conversations"]
    assert [(c["title"], c["state"]) for c in listing] == [("test user name", "bot")]


def test_unread_counts_the_users_messages_since_an_operator_opened_the_conversation(
    console: ConsoleRig,
) -> None:
    session_id = talk(console, "first")
    talk(console, "second")
    console.sign_in()
    assert "2 unread" in line_of(console.client.get("/console").text, session_id)

    console.client.get(f"/console/c/{session_id}")  # the operator reads it
    assert "unread" not in line_of(console.client.get("/console").text, session_id)
    talk(console, "third")
    assert "1 unread" in line_of(console.client.get("/console").text, session_id)

    # /reset starts the conversation over: the old mark does not hide the new one.
    console.client.get(f"/console/c/{session_id}")
    console.deliver(make_event("/reset", chat_id=PHONE, sender_id=PHONE, command="reset"))
    talk(console, "a fresh start")
    assert "1 unread" in line_of(console.client.get("/console").text, session_id)


def test_waiting_means_a_person_owes_the_user_an_answer(console: ConsoleRig) -> None:
    session_id = talk(console)
    csrf = console.sign_in()
    assert "Bot · Helper" in line_of(console.client.get("/console").text, session_id)

    console.client.post(f"/console/c/{session_id}/takeover", data={"csrf": csrf})
    console.deliver(make_event("hello? anyone?", chat_id=PHONE, sender_id=PHONE))
    inbox = console.client.get("/console").text
    assert "Waiting" in line_of(inbox, session_id)
    assert re.search(r'Inbox <span class="count warn"[^>]*>1</span>', inbox)
    needs = console.client.get("/console", params={"view": "person"}).text
    assert "Waiting" in line_of(needs, session_id)
    head = console.client.get(f"/console/c/{session_id}").text
    assert '<p class="banner state-waiting" role="status">' in head
    assert "Hand back" in head

    form = {"csrf": csrf, "text": "Yes, I am here.", "nonce": "a" * 32}
    console.client.post(f"/console/c/{session_id}/reply", data=form)
    console.call(console.adapter.wait_for_sent, 2)
    inbox = console.client.get("/console").text
    line = line_of(inbox, session_id)
    assert "Human" in line and "You: Yes, I am here." in line
    assert 'class="count warn"' not in inbox

    console.client.post(f"/console/c/{session_id}/handback", data={"csrf": csrf})
    assert "Bot · Helper" in line_of(console.client.get("/console").text, session_id)
    quiet = console.client.get("/console", params={"view": "person"}).text
    assert "Nobody waits for a person" in quiet


def test_the_live_view_brings_the_header_with_the_messages(console: ConsoleRig) -> None:
    session_id = talk(console)
    csrf = console.sign_in()
    first = console.client.get(f"/console/c/{session_id}/live")
    assert first.status_code == 200
    assert '<template id="live-head">' in first.text and "Take over" in first.text
    assert '<template id="live-messages">' in first.text and "Hi!" in first.text
    # State changed elsewhere (another tab, another process): the next swap shows it.
    console.call(console.gateway.turns.takeovers.take_over, session_id)
    live = console.client.get(f"/console/c/{session_id}/live").text
    assert "Hand back" in live and "A person answers this conversation" in live
    assert csrf_of(live) == csrf
    assert console.client.get("/console/c/fake-0000000000000000/live").status_code == 404


def test_a_photo_is_shown_in_the_bubble_and_served_only_for_its_conversation(
    console: ConsoleRig,
) -> None:
    picture = png()
    console.adapter.files["photo-1"] = picture
    photo = MediaAttachment("image", file_id="photo-1", mime_type="image/png")
    session_id = talk(console, "it arrived cracked", reply="Sorry!", media=[photo])
    console.adapter.files["doc-1"] = b"order 3317, one blender"
    document = MediaAttachment(
        "document", file_id="doc-1", mime_type="text/plain", file_name="receipt.txt"
    )
    talk(console, "my receipt", reply="Thanks", media=[document])
    console.sign_in()

    page = console.client.get(f"/console/c/{session_id}").text
    (src,) = re.findall(r'<img src="(/console/c/[^"]+/media/[0-9a-f]{64})"', page)
    assert 'class="fname">receipt.txt<' in page
    image = console.client.get(src)
    assert image.status_code == 200 and image.content == picture
    assert image.headers["content-type"] == "image/png"
    assert image.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    (download,) = re.findall(r'href="(/console/c/[^"]+/media/[0-9a-f]{64})" download', page)
    served = console.client.get(download)
    assert served.content == b"order 3317, one blender"
    assert served.headers["content-type"] == "application/octet-stream"
    assert served.headers["content-disposition"] == "attachment"

    # Another conversation cannot name this file; an unknown hash is not a file.
    other = src.replace(session_id, "fake-0000000000000000")
    assert console.client.get(other).status_code == 404
    assert console.client.get(src[:-64] + "0" * 64).status_code == 404
    console.client.cookies.clear()
    assert console.client.get(src).status_code == 401


def test_the_ledger_lists_what_needs_a_person_first(console: ConsoleRig) -> None:
    """D16: undelivered replies came newest first, so owed ones hid an abandoned one."""
    console.adapter.fail_next.append(
        PlatformError("user blocked the bot", platform="fake", retryable=False)
    )
    talk(console, "first", reply="given up on")
    console.adapter.connected_on_start = False
    console.call(console.adapter.stop)  # the next replies stay owed
    for n in range(3):
        console.model.add(ScriptedModel.reply(f"still owed {n}"))
        console.deliver(make_event(f"more {n}", chat_id=f"chat-{n}"))
    console.sign_in()
    page = console.client.get("/console/ledger").text
    # Given up on (a person must act) before the newer ones the bot still retries.
    assert page.index("given up on") < page.index("still owed 2") < page.index("still owed 0")
    order = re.findall(r'<li class="owed state-(\w+)">', page)
    # The platform is down: those replies wait (never tried), they did not fail (N6).
    assert order == ["abandoned", "pending", "pending", "pending"]
    assert page.count("waiting: fake is not connected") == 3
    assert page.index("Needs attention") < page.index("given up on")
    assert re.search(r'Ledger <span class="count bad"[^>]*>1</span>', page)  # only the abandoned


def test_every_page_has_an_icon_of_its_own(console: ConsoleRig) -> None:
    """D14: the browser asked for /favicon.ico and got 404."""
    talk(console)
    console.sign_in()
    for path in ("/console/login", "/console", "/console/ledger", "/console/web"):
        page = console.client.get(path).text
        assert '<link rel="icon" href="/console/static/icon.svg"' in page, path
    icon = console.client.get("/console/static/icon.svg")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg")


def test_the_test_chat_form_says_what_to_type(console: ConsoleRig) -> None:
    """D14: "Start a new test chat with" read as a label cut off."""
    console.sign_in()
    page = console.client.get("/console/web").text
    (label,) = re.findall(r'<label for="text">([^<]+)</label>', page)
    assert label == "Start a test chat: your first message"


def test_a_wrong_token_stays_off_the_terminal_chat(
    console: ConsoleRig, capsys: pytest.CaptureFixture[str]
) -> None:
    """D14: a refused sign-in printed a WARNING onto the terminal chat's prompt line."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        configure_logging("INFO", "text")
        quiet_console_logs()  # what ``python -m bot run`` does when a person chats in it
        capsys.readouterr()
        wrong = console.client.post("/console/login", data={"token": "nope" * 8})
        assert wrong.status_code == 401 and "Wrong token." in wrong.text
        logging.getLogger("bot.console.views").warning("a real warning still shows")
        terminal = capsys.readouterr().err
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert "a real warning still shows" in terminal
    assert "sign-in refused" not in terminal


def test_the_platform_filter_offers_every_platform_not_only_the_connected(
    console: ConsoleRig,
) -> None:
    # N9: run web-only, the filter offered "All platforms" and "Web" while the list
    # showed a "Terminal" conversation.
    talk(console)
    console.sign_in()
    page = console.client.get("/console").text
    offered = re.findall(r'<option value="(\w+)"', page)
    assert {"console", "telegram", "web", "whatsapp", "fake"} <= set(offered)
    terminal = console.client.get("/console", params={"platform": "console"}).text
    assert 'option value="console" selected' in terminal
