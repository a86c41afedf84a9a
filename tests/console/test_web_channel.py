"""The web channel: an operator tries the agents from the console, through the real path."""

from __future__ import annotations

import re

from bot.core.models.scripted import ScriptedModel
from tests.console.conftest import ConsoleRig


def nonce_of(html: str) -> str:
    found = re.search(r'name="nonce" value="([0-9a-f]{32})"', html)
    assert found is not None
    return found.group(1)


def test_a_test_chat_runs_through_inbox_runner_and_ledger(console: ConsoleRig) -> None:
    csrf = console.sign_in()
    page = console.client.get("/console/web")
    assert page.status_code == 200 and "Try the agents" in page.text
    console.model.add(ScriptedModel.reply("Hello from <Helper>!"))
    form = {"csrf": csrf, "nonce": nonce_of(page.text), "text": "hi bot"}
    started = console.client.post("/console/web", data=form, follow_redirects=False)
    assert started.status_code == 303
    target = started.headers["location"]
    assert re.fullmatch(r"/console/c/web-[0-9a-f]{16}", target)
    assert console.call(console.gateway._dispatcher.drain, 5.0)
    # The same form again (a double click) is one message: dedup.
    again = console.client.post("/console/web", data=form, follow_redirects=False)
    assert again.headers["location"] == target
    assert console.call(console.gateway._dispatcher.drain, 5.0)
    assert len(console.model.requests) == 1

    console.call(console.gateway.ledger.flush)
    transcript = console.client.get(target).text
    assert "hi bot" in transcript and "Hello from &lt;Helper&gt;!" in transcript
    assert ">delivered</span>" in transcript
    assert "Say, as the user of this test chat" in transcript

    console.model.add(ScriptedModel.reply("Second answer"))
    said = console.client.post(
        target + "/say",
        data={"csrf": csrf, "nonce": nonce_of(transcript), "text": "and again"},
        follow_redirects=False,
    )
    assert said.headers["location"] == target
    assert console.call(console.gateway._dispatcher.drain, 5.0)
    assert [m.content for m in console.model.requests[-1].messages][-1] == "and again"
    listing = console.client.get("/console/web").text
    assert target.removeprefix("/console/c/") in listing


def test_say_needs_csrf_and_a_web_conversation(console: ConsoleRig) -> None:
    csrf = console.sign_in()
    refused = console.client.post("/console/web", data={"text": "hi"})
    assert refused.status_code == 403
    not_web = console.client.post(
        "/console/c/fake-0123456789abcdef/say", data={"csrf": csrf, "text": "hi"}
    )
    assert not_web.status_code == 404
    assert console.model.requests == []


def test_a_fresh_test_chat_page_shows_before_its_first_turn(console: ConsoleRig) -> None:
    console.sign_in()
    page = console.client.get("/console/c/web-0123456789abcdef")
    assert page.status_code == 200 and "No messages yet." in page.text


def test_a_taken_over_test_chat_keeps_both_boxes_and_the_user_can_still_speak(
    console: ConsoleRig,
) -> None:
    # N7: after "Take over" the Say box was gone, so the operator, who plays both people
    # in a test chat, could not try the take-over loop without a second channel.
    csrf = console.sign_in()
    page = console.client.get("/console/web")
    console.model.add(ScriptedModel.reply("Hello!"))
    form = {"csrf": csrf, "nonce": nonce_of(page.text), "text": "hi bot"}
    target = console.client.post("/console/web", data=form, follow_redirects=False)
    target_url = target.headers["location"]
    assert console.call(console.gateway._dispatcher.drain, 5.0)
    taken = console.client.post(target_url + "/takeover", data={"csrf": csrf})
    assert taken.status_code in (200, 303)
    transcript = console.client.get(target_url).text
    assert "Say, as the user of this test chat" in transcript
    assert "Reply as a person" in transcript
    nonces = re.findall(r'name="nonce" value="([0-9a-f]{32})"', transcript)
    assert len(nonces) == len(set(nonces)) == 2  # each box its own
    said = console.client.post(
        target_url + "/say",
        data={"csrf": csrf, "nonce": nonces[0], "text": "is anyone there?"},
        follow_redirects=False,
    )
    assert said.status_code == 303
    assert console.call(console.gateway._dispatcher.drain, 5.0)
    assert len(console.model.requests) == 1  # a person answers now, not the model
    assert "is anyone there?" in console.client.get(target_url).text
