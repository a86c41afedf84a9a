"""The console's Compact button: the summary now; the whole conversation stays on the page."""

from __future__ import annotations

from bot.core.compaction import SUMMARY_INSTRUCTIONS
from bot.core.models.scripted import ScriptedModel
from bot.errors import ModelError
from tests.console.conftest import ConsoleRig
from tests.fakes.adapter import make_event

PHONE = "+15551234567"


def _talk(console: ConsoleRig, turns: int) -> str:
    for index in range(turns):
        console.model.add(ScriptedModel.reply(f"answer {index}"))
        console.deliver(make_event(f"question {index}", chat_id=PHONE, sender_id=PHONE))
    sessions = console.call(console.store.list_sessions)
    return str(sessions[0])


def test_the_compact_button_summarises_and_marks_the_summary(console: ConsoleRig) -> None:
    session_id = _talk(console, 8)
    csrf = console.sign_in()
    page = console.client.get(f"/console/c/{session_id}").text
    assert f'action="/console/c/{session_id}/compact"' in page
    console.model.add(ScriptedModel.reply("The user asked questions 0 to 1."))
    response = console.client.post(
        f"/console/c/{session_id}/compact", data={"csrf": csrf}, follow_redirects=False
    )
    assert response.status_code == 303 and "error" not in response.headers["location"]
    assert console.model.requests[-1].system == SUMMARY_INSTRUCTIONS
    page = console.client.get(f"/console/c/{session_id}").text
    assert "<b>Summary</b> of the earlier conversation (compaction)" in page
    assert "The user asked questions 0 to 1." in page
    # The compacted messages are still shown, marked; the kept ones are not.
    assert page.count(" compacted") >= 4
    assert "question 0" in page and "question 7" in page


def test_a_failed_compaction_says_so_and_changes_nothing(console: ConsoleRig) -> None:
    session_id = _talk(console, 7)
    csrf = console.sign_in()
    before = console.client.get(f"/console/c/{session_id}").text
    console.model.add(ModelError("down", retryable=True))
    response = console.client.post(f"/console/c/{session_id}/compact", data={"csrf": csrf})
    assert "The summary failed; the conversation is unchanged." in response.text
    assert "Summary</b>" not in response.text
    assert before.count(" compacted") == response.text.count(" compacted") == 0


def test_the_compact_button_needs_the_csrf_token(console: ConsoleRig) -> None:
    session_id = _talk(console, 7)
    console.sign_in()
    response = console.client.post(f"/console/c/{session_id}/compact", data={"csrf": "wrong"})
    assert response.status_code == 403
    assert len(console.model.requests) == 7
