"""Sign-in and display: the throttle never refuses the right token, signing out
revokes the session server-side, and bidi controls are shown, never obeyed."""

from __future__ import annotations

from pathlib import Path

from markupsafe import Markup

from bot.console.auth import FAILURE_WINDOW_SECONDS, GLOBAL_MAX_FAILURES, ConsoleAuth
from bot.console.sessions import SESSIONS_TABLE, ConsoleSessions
from bot.console.templating import BIDI_CONTROLS, show_bidi_controls
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import PlatformError
from bot.gateway.contract import MediaAttachment
from tests.console.conftest import SECRET, TOKEN, ConsoleRig, csrf_of
from tests.fakes.adapter import make_event

PHONE = "+15551234567"
SPOOFED = "invoice\u202efdp.exe"  # displays as "invoiceexe.pdf" when obeyed
EVERY_CONTROL = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# -- F5: the throttle ------------------------------------------------------------


def test_a_spray_from_many_addresses_is_throttled_and_the_right_token_still_works() -> None:
    clock = Clock()
    auth = ConsoleAuth(TOKEN, SECRET, clock=clock)
    for n in range(GLOBAL_MAX_FAILURES):  # one wrong token from each of many addresses
        assert auth.check("wrong", f"198.51.100.{n % 250}.{n}").retry_after == 0
    spray = auth.check("wrong", "203.0.113.1")  # an address never seen before
    assert not spray.ok and spray.retry_after > 0
    assert auth.check(TOKEN, "203.0.113.1").ok
    assert auth.check(TOKEN, "198.51.100.0.0").ok
    clock.now += FAILURE_WINDOW_SECONDS
    lifted = auth.check("wrong", "203.0.113.1")
    assert not lifted.ok and lifted.retry_after == 0


# -- F6: signing out -------------------------------------------------------------


def test_signing_out_revokes_that_session_and_only_that_one(console: ConsoleRig) -> None:
    console.model.add(ScriptedModel.reply("Hi!"))
    console.deliver(make_event("secret words", chat_id=PHONE, sender_id=PHONE))
    sid = console.session_id()
    csrf = console.sign_in()
    leaked = console.client.cookies["chatflow_console"]
    console.client.cookies.clear()
    console.sign_in()  # another device of the operator
    other = console.client.cookies["chatflow_console"]
    console.client.cookies.clear()

    console.client.cookies.set("chatflow_console", leaked, path="/console")
    out = console.client.post("/console/logout", data={"csrf": csrf}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    dropped = out.headers["set-cookie"]
    assert "Max-Age=0" in dropped and "SameSite=strict" in dropped and "HttpOnly" in dropped

    # The same cookie value, replayed after "Sign out": signed out everywhere.
    console.client.cookies.set("chatflow_console", leaked, path="/console")
    page = console.client.get(f"/console/c/{sid}", follow_redirects=False)
    assert page.status_code == 303 and "secret words" not in page.text
    fragment = console.client.get(f"/console/c/{sid}/messages")
    assert fragment.status_code == 401 and "secret words" not in fragment.text
    took = console.client.post(f"/console/c/{sid}/takeover", data={"csrf": csrf})
    assert took.status_code == 401
    assert not console.call(console.gateway.turns.takeovers.is_taken_over, sid)

    console.client.cookies.set("chatflow_console", other, path="/console")
    assert "secret words" in console.client.get(f"/console/c/{sid}").text


async def test_recorded_sessions_expire_and_are_pruned(tmp_path: Path) -> None:
    clock = Clock()
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    try:
        sessions = ConsoleSessions(store, clock=clock)
        await sessions.add("first", 10.0)
        assert await sessions.active("first") and not await sessions.active("never")
        clock.now += 10.0
        assert not await sessions.active("first")
        await sessions.add("second", 10.0)
        async with store.transaction() as tx:
            rows = await tx.fetchall(f"SELECT session_hash FROM {SESSIONS_TABLE}")
        assert len(rows) == 1 and "second" not in str(rows)  # hashed, expired one pruned
        assert await sessions.revoke("second") and not await sessions.revoke("second")
        assert not await sessions.active("second")
    finally:
        await store.close()


# -- F16: bidi controls ----------------------------------------------------------


def test_every_bidi_control_is_written_out() -> None:
    assert set(EVERY_CONTROL) == BIDI_CONTROLS
    shown = show_bidi_controls("a" + EVERY_CONTROL + "b")
    assert not set(shown) & BIDI_CONTROLS
    assert shown.startswith("a<U+061C><U+200E><U+200F><U+202A>") and shown.endswith("<U+2069>b")
    escaped = show_bidi_controls(Markup("<b>x\u202e</b>"))
    assert escaped == Markup("<b>x&lt;U+202E&gt;</b>")
    assert show_bidi_controls(7) == 7


def test_bidi_controls_in_names_and_texts_are_shown_on_every_page(console: ConsoleRig) -> None:
    console.adapter.files["f1"] = b"%PDF-1.4 not really"
    console.adapter.fail_next.append(
        PlatformError("user blocked the bot", platform="fake", retryable=False)
    )
    console.model.add(ScriptedModel.reply("Your file: report\u2067fdp.exe\u2069 is ready"))
    document = MediaAttachment("document", file_id="f1", mime_type="text/plain", file_name=SPOOFED)
    event = make_event("see \u202eattached", chat_id=PHONE, sender_id=PHONE, media=[document])
    console.deliver(event)
    sid = console.session_id()
    console.sign_in()

    pages = {
        "transcript": console.client.get(f"/console/c/{sid}").text,
        "fragment": console.client.get(f"/console/c/{sid}/messages").text,
        "search": console.client.get("/console", params={"q": "\u202eattached"}).text,
        "ledger": console.client.get("/console/ledger").text,
    }
    for name, html in pages.items():
        assert not set(html) & BIDI_CONTROLS, name
    for name in ("transcript", "fragment"):
        assert "invoice&lt;U+202E&gt;fdp.exe" in pages[name]
        assert "see &lt;U+202E&gt;attached" in pages[name]
        assert "report&lt;U+2067&gt;fdp.exe&lt;U+2069&gt; is ready" in pages[name]
    assert 'value="&lt;U+202E&gt;attached"' in pages["search"]
    assert "report&lt;U+2067&gt;fdp.exe" in pages["ledger"]
    assert csrf_of(pages["transcript"])
