"""The console's routes through Starlette's TestClient: auth, CSRF, escaping, takeover, ledger."""

from __future__ import annotations

import logging
import re

import pytest

from bot.console.auth import MAX_FAILURES
from bot.core.models.scripted import ScriptedModel
from bot.errors import PlatformError
from tests.console.conftest import TOKEN, ConsoleRig, csrf_of
from tests.fakes.adapter import make_event

PHONE = "+15551234567"


def talk(console: ConsoleRig, text: str = "hello", reply: str = "Hi!", **event: object) -> str:
    """One message answered by the bot; returns the session id."""
    console.model.add(ScriptedModel.reply(reply))
    console.deliver(make_event(text, chat_id=PHONE, sender_id=PHONE, **event))  # type: ignore[arg-type]
    return console.session_id()


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        pytest.param("GET", "/console", 303, id="list-redirects"),
        pytest.param("GET", "/console/ledger", 303, id="ledger-redirects"),
        pytest.param("GET", "/console/c/fake-0123456789abcdef", 303, id="transcript-redirects"),
        pytest.param("GET", "/console/c/fake-0123456789abcdef/messages", 401, id="fragment-401"),
        pytest.param("GET", "/console/c/fake-0123456789abcdef/events", 401, id="stream-401"),
        pytest.param("POST", "/console/c/fake-0123456789abcdef/takeover", 401, id="takeover-401"),
        pytest.param("POST", "/console/c/fake-0123456789abcdef/reply", 401, id="reply-401"),
        pytest.param("POST", "/console/ledger/abc/retry", 401, id="retry-401"),
        pytest.param("POST", "/console/logout", 401, id="logout-401"),
    ],
)
def test_signed_out_requests_get_no_data(
    console: ConsoleRig, method: str, path: str, expected: int
) -> None:
    session_id = talk(console, "secret words")
    path = path.replace("fake-0123456789abcdef", session_id)
    response = console.client.request(method, path, follow_redirects=False)
    assert response.status_code == expected
    assert "secret words" not in response.text
    if expected == 303:
        assert response.headers["location"].startswith("/console/login?next=/console")


def test_sign_in_sets_a_strict_httponly_cookie_and_lists_conversations(
    console: ConsoleRig,
) -> None:
    session_id = talk(console)
    response = console.client.post(
        "/console/login", data={"token": TOKEN, "next": "/console"}, follow_redirects=False
    )
    assert response.status_code == 303
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    page = console.client.get("/console")
    assert page.status_code == 200
    assert f'<a href="/console/c/{session_id}">' in page.text
    assert "Fake · DM" in page.text and "Bot · Helper" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert PHONE not in page.text and "user-1" not in page.text


def test_a_forged_or_expired_cookie_is_signed_out(console: ConsoleRig) -> None:
    console.client.cookies.set("chatflow_console", "1.abc.deadbeef", path="/console")
    response = console.client.get("/console", follow_redirects=False)
    assert response.status_code == 303


def test_wrong_tokens_are_throttled_but_the_right_token_always_signs_in(
    console: ConsoleRig,
) -> None:
    for _ in range(MAX_FAILURES):
        wrong = console.client.post("/console/login", data={"token": "nope" * 8})
        assert wrong.status_code == 401
        assert "set-cookie" not in wrong.headers
    # Past the limit wrong tokens are told to wait, by the form and by bearer alike.
    throttled = console.client.post("/console/login", data={"token": "nope" * 8})
    assert throttled.status_code == 429 and "set-cookie" not in throttled.headers
    assert int(throttled.headers["retry-after"]) > 0
    wrong_bearer = console.client.get("/console", headers={"Authorization": "Bearer nope"})
    assert wrong_bearer.status_code == 429 and "Hi!" not in wrong_bearer.text
    # Whoever shares the address (a proxy's users) cannot lock the operator out.
    right = console.client.post(
        "/console/login", data={"token": TOKEN, "next": "/console"}, follow_redirects=False
    )
    assert right.status_code == 303 and "chatflow_console=" in right.headers["set-cookie"]
    assert csrf_of(console.client.get("/console").text)
    bearer = console.client.get("/console/api/ledger", headers={"Authorization": f"Bearer {TOKEN}"})
    assert bearer.status_code == 200


def test_bearer_token_authenticates_scripts_without_csrf(console: ConsoleRig) -> None:
    session_id = talk(console)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    assert console.client.get("/console", headers=headers).status_code == 200
    wrong = console.client.get("/console", headers={"Authorization": "Bearer " + "x" * 32})
    assert wrong.status_code == 401
    taken = console.client.post(
        f"/console/c/{session_id}/takeover", headers=headers, follow_redirects=False
    )
    assert taken.status_code == 303
    assert console.call(console.gateway.turns.takeovers.is_taken_over, session_id)


@pytest.mark.parametrize(
    "csrf",
    [pytest.param(None, id="missing"), pytest.param("0" * 64, id="wrong")],
)
def test_state_changes_need_the_csrf_token(console: ConsoleRig, csrf: str | None) -> None:
    session_id = talk(console)
    console.sign_in()
    data = {} if csrf is None else {"csrf": csrf}
    response = console.client.post(f"/console/c/{session_id}/takeover", data=data)
    assert response.status_code == 403
    assert not console.call(console.gateway.turns.takeovers.is_taken_over, session_id)


def test_get_never_changes_state(console: ConsoleRig) -> None:
    session_id = talk(console)
    console.sign_in()
    response = console.client.get(f"/console/c/{session_id}/takeover")
    assert response.status_code == 405
    assert not console.call(console.gateway.turns.takeovers.is_taken_over, session_id)


def test_message_text_is_escaped_not_stripped(console: ConsoleRig) -> None:
    session_id = talk(console, "<script>alert(1)</script>", reply="<b>bold</b> & co")
    console.sign_in()
    for path in (f"/console/c/{session_id}", f"/console/c/{session_id}/messages"):
        html = console.client.get(path).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert "<script>alert" not in html
        assert "&lt;b&gt;bold&lt;/b&gt; &amp; co" in html
        assert PHONE not in html


def test_take_over_reply_and_hand_back_through_the_pages(console: ConsoleRig) -> None:
    session_id = talk(console)
    csrf = console.sign_in()
    page = console.client.get(f"/console/c/{session_id}").text
    assert "Take over" in page and "(this takes the conversation over)" in page

    console.client.post(f"/console/c/{session_id}/takeover", data={"csrf": csrf})
    page = console.client.get(f"/console/c/{session_id}").text
    assert "Hand back" in page and "Reply as a person</label>" in page
    console.deliver(make_event("are you a person?", chat_id=PHONE, sender_id=PHONE))
    nonce = re.search(r'name="nonce" value="([0-9a-f]{32})"', page)
    assert nonce is not None
    form = {"csrf": csrf, "text": "Yes, I am Ana.", "nonce": nonce.group(1)}
    console.client.post(f"/console/c/{session_id}/reply", data=form)
    console.client.post(f"/console/c/{session_id}/reply", data=form)  # sent twice: once
    sent = console.call(console.adapter.wait_for_sent, 2)
    assert [(s.chat_id, s.text) for s in sent] == [(PHONE, "Hi!"), (PHONE, "Yes, I am Ana.")]
    assert len(console.model.requests) == 1

    console.call(console.gateway.ledger.flush)
    page = console.client.get(f"/console/c/{session_id}").text
    assert "are you a person?" in page
    assert "operator (person)" in page
    assert page.count(">delivered</span>") == 2

    console.client.post(f"/console/c/{session_id}/handback", data={"csrf": csrf})
    assert not console.call(console.gateway.turns.takeovers.is_taken_over, session_id)
    assert "Take over" in console.client.get(f"/console/c/{session_id}").text


def test_ledger_page_retries_and_abandons(console: ConsoleRig) -> None:
    blocked = PlatformError("user blocked the bot", platform="fake", retryable=False)
    console.adapter.fail_next.append(blocked)
    talk(console)
    csrf = console.sign_in()
    page = console.client.get("/console/ledger").text
    assert "user blocked the bot" in page and "<strong>1</strong> abandoned" in page
    assert "<dt>messages in</dt><dd>1</dd>" in page and "<dt>abandoned</dt><dd>1</dd>" in page
    (obligation_id,) = re.findall(r"/console/ledger/([0-9a-f]+)/retry", page)

    console.client.post(f"/console/ledger/{obligation_id}/retry", data={"csrf": csrf})
    sent = console.call(console.adapter.wait_for_sent, 1)
    assert [s.text for s in sent] == ["Hi!"]
    page = console.client.get("/console/ledger").text
    assert "Nothing owed" in page

    console.adapter.connected_on_start = False
    console.call(console.adapter.stop)  # the next reply stays owed
    talk(console, "again", reply="owed")
    page = console.client.get("/console/ledger").text
    (owed,) = re.findall(r"/console/ledger/([0-9a-f]+)/abandon", page)
    console.client.post(
        f"/console/ledger/{owed}/abandon", data={"csrf": csrf, "reason": "operator said so"}
    )
    row = console.call(console.gateway.ledger.get, owed)
    assert row is not None and row.state == "abandoned" and row.last_error == "operator said so"


def test_pages_follow_the_key_set(console: ConsoleRig) -> None:
    for n in range(60):
        console.model.add(ScriptedModel.reply("ok"))
        text = "needle here" if n == 7 else f"message {n}"
        console.deliver(make_event(text, chat_id=f"chat-{n}"))
    console.sign_in()
    first = console.client.get("/console").text
    ids = re.findall(r'<a href="/console/c/([^"]+)">', first)
    assert len(ids) == 50
    older = re.search(r'<a href="/console\?([^"]+)" rel="next">', first)
    assert older is not None
    second = console.client.get("/console?" + older.group(1).replace("&amp;", "&")).text
    more = re.findall(r'<a href="/console/c/([^"]+)">', second)
    assert len(more) == 10 and not set(ids) & set(more)
    assert 'rel="next"' not in second
    found = console.client.get("/console", params={"q": "NEEDLE"}).text
    assert len(re.findall(r'<a href="/console/c/', found)) == 1
    other = console.client.get("/console", params={"platform": "fake", "q": "absent"}).text
    assert "No conversations match" in other


def test_static_files_are_served_by_name_only(console: ConsoleRig) -> None:
    script = console.client.get("/console/static/console.js")
    assert script.status_code == 200 and "EventSource" in script.text
    assert console.client.get("/console/static/").status_code == 404
    assert console.client.get("/console/static/base.html").status_code == 404
    assert console.client.get("/console/static/..%2Fauth.py").status_code == 404


def test_the_operator_reply_is_not_logged(
    console: ConsoleRig, caplog: pytest.LogCaptureFixture
) -> None:
    session_id = talk(console)
    csrf = console.sign_in()
    console.client.post(f"/console/c/{session_id}/takeover", data={"csrf": csrf})
    with caplog.at_level(logging.INFO):
        console.client.post(
            f"/console/c/{session_id}/reply",
            data={"csrf": csrf, "text": "private words", "nonce": "c" * 32},
        )
        console.call(console.adapter.wait_for_sent, 2)
    text = caplog.text
    assert "private words" not in text and TOKEN not in text and PHONE not in text
    assert "operator reply" in text


def test_login_never_redirects_off_the_console(console: ConsoleRig) -> None:
    response = console.client.post(
        "/console/login", data={"token": TOKEN, "next": "//evil.example/"}, follow_redirects=False
    )
    assert response.headers["location"] == "/console"
    assert csrf_of(console.client.get("/console").text)


def test_replying_takes_the_conversation_over(console: ConsoleRig) -> None:
    session_id = talk(console)
    csrf = console.sign_in()
    form = {"csrf": csrf, "text": "A person jumps in.", "nonce": "f" * 32}
    response = console.client.post(f"/console/c/{session_id}/reply", data=form)
    assert response.status_code == 200
    sent = console.call(console.adapter.wait_for_sent, 2)
    assert sent[1].text == "A person jumps in."
    assert console.call(console.gateway.turns.takeovers.is_taken_over, session_id)
    console.deliver(make_event("ok, thanks", chat_id=PHONE, sender_id=PHONE))
    assert len(console.model.requests) == 1  # the bot stayed quiet
    missing = console.client.post("/console/c/fake-0000000000000000/reply", data=form)
    assert missing.status_code == 404


def test_scripts_read_json_with_the_bearer_token(console: ConsoleRig) -> None:
    session_id = talk(console)
    assert console.client.get("/console/api/conversations").status_code == 401
    assert console.client.get("/console/api/ledger").status_code == 401
    headers = {"Authorization": f"Bearer {TOKEN}"}
    listing = console.client.get("/console/api/conversations", headers=headers).json()
    assert [c["session_id"] for c in listing["conversations"]] == [session_id]
    assert listing["conversations"][0]["agent"] == "Helper" and listing["next"] is None
    ledger = console.client.get("/console/api/ledger", headers=headers).json()
    assert ledger["counts"]["failed"] == 0 and ledger["undelivered"] == []
    assert ledger["metrics"]["replies delivered"] == 1
    assert PHONE not in str(listing) + str(ledger)
