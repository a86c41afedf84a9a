"""Buttons in the console: a web test chat's reply shows its choices as buttons, a click
is a tap (the label reaches the model), and a used keyboard is shown, no longer clickable."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot import Agent, Button, ToolOutput, tool
from bot.core.messages import Role
from bot.core.models.scripted import ScriptedModel
from tests.console.conftest import ConsoleRig, running_console
from tests.console.test_web_channel import nonce_of


@tool
def pick_plan() -> ToolOutput:
    """Offer the plans."""
    return ToolOutput("offered", buttons=["Basic <b>", Button("Pro", value="plan:pro")])


@pytest.fixture
def console(tmp_path: Path) -> Iterator[ConsoleRig]:
    agent = Agent(name="Sales", instructions="Sell.", tools=[pick_plan])
    with running_console(tmp_path, agent=agent) as rig:
        yield rig


def test_a_click_on_a_choice_is_a_tap(console: ConsoleRig) -> None:
    csrf = console.sign_in()
    page = console.client.get("/console/web")
    console.model.add(ScriptedModel.call("pick_plan"), ScriptedModel.reply("Which plan?"))
    form = {"csrf": csrf, "nonce": nonce_of(page.text), "text": "plans?"}
    target = console.client.post("/console/web", data=form, follow_redirects=False).headers[
        "location"
    ]
    assert console.call(console.gateway._dispatcher.drain, 5.0)
    transcript = console.client.get(target).text
    tokens = re.findall(r'name="token" value="([^"]+)"', transcript)
    assert len(tokens) == 2
    assert "Basic &lt;b&gt;</button>" in transcript  # a label is data, escaped
    assert "plan:pro" not in transcript  # the value stays on the server

    console.model.add(ScriptedModel.reply("Pro it is."))
    tapped = console.client.post(
        target + "/tap", data={"csrf": csrf, "token": tokens[1]}, follow_redirects=False
    )
    assert tapped.headers["location"] == target
    assert console.call(console.gateway._dispatcher.drain, 5.0)
    said = console.model.requests[-1].messages[-1]
    assert said.role == Role.USER and said.content is not None and "Pro" in said.content
    after = console.client.get(target).text
    assert 'name="token"' not in after  # used: shown, not clickable
    assert '<span class="choice">Pro</span>' in after

    again = console.client.post(
        target + "/tap", data={"csrf": csrf, "token": tokens[0]}, follow_redirects=False
    )
    assert again.headers["location"] == target + "?error=expired"
    assert len(console.model.requests) == 3


def test_tap_needs_csrf_and_a_web_conversation(console: ConsoleRig) -> None:
    csrf = console.sign_in()
    assert console.client.post("/console/c/web-0123456789abcdef/tap", data={}).status_code == 403
    not_web = console.client.post(
        "/console/c/fake-0123456789abcdef/tap", data={"csrf": csrf, "token": "x"}
    )
    assert not_web.status_code == 404
