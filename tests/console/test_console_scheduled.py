"""The console's "Scheduled" page (cancel) and the send box of a conversation."""

from __future__ import annotations

import re
import time

import pytest

from bot.core.models.scripted import ScriptedModel
from bot.core.scheduling import JobRoute, ScheduleRequest, apply_in
from bot.core.stores.base import TransactionalStore
from tests.console.conftest import ConsoleRig
from tests.console.test_console_routes import PHONE, talk
from tests.fakes.adapter import make_event


async def _add_jobs(store: TransactionalStore, session_id: str) -> None:
    route = JobRoute("agent:main:fake:dm:k", session_id, "fake", PHONE, None)
    soon = time.time() + 3600
    async with store.transaction() as tx:
        await apply_in(
            tx,
            [
                ScheduleRequest("job_b", "Second <i>reminder</i>", soon + 60),
                ScheduleRequest("job_a", "First reminder", soon, "0 9 * * 1"),
            ],
            route,
            time.time(),
        )


async def _state(store: TransactionalStore, job_id: str) -> str:
    async with store.transaction() as tx:
        row = await tx.fetchone("SELECT state FROM chatflow_scheduled_jobs WHERE id = ?", (job_id,))
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        pytest.param("GET", "/console/scheduled", 303, id="page-redirects"),
        pytest.param("POST", "/console/scheduled/job_a/cancel", 401, id="cancel-401"),
        pytest.param("POST", "/console/c/SID/send", 401, id="send-401"),
    ],
)
def test_signed_out_gets_nothing(
    console: ConsoleRig, method: str, path: str, expected: int
) -> None:
    session_id = talk(console)
    console.call(_add_jobs, console.store, session_id)
    response = console.client.request(
        method, path.replace("SID", session_id), data={"text": "x"}, follow_redirects=False
    )
    assert response.status_code == expected
    assert "reminder" not in response.text
    assert console.call(_state, console.store, "job_a") == "scheduled"
    assert len(console.adapter.sent) == 1


def test_scheduled_page_lists_jobs_and_cancels_with_csrf(console: ConsoleRig) -> None:
    session_id = talk(console)
    console.call(_add_jobs, console.store, session_id)
    csrf = console.sign_in()
    page = console.client.get("/console/scheduled")
    assert page.status_code == 200
    html = page.text
    assert 'href="/console/scheduled" aria-current="page"' in html
    assert html.index("First reminder") < html.index("Second &lt;i&gt;reminder&lt;/i&gt;")
    assert "<i>reminder" not in html and PHONE not in html
    assert "0 9 * * 1" in html and f"/console/c/{session_id}" in html

    refused = console.client.post("/console/scheduled/job_a/cancel", data={"csrf": "0" * 64})
    assert refused.status_code == 403
    assert console.call(_state, console.store, "job_a") == "scheduled"

    done = console.client.post(
        "/console/scheduled/job_a/cancel", data={"csrf": csrf}, follow_redirects=False
    )
    assert (done.status_code, done.headers["location"]) == (303, "/console/scheduled")
    assert console.call(_state, console.store, "job_a") == "cancelled"
    html = console.client.get("/console/scheduled").text
    assert "First reminder" not in html and "Second &lt;i&gt;" in html
    assert "Scheduled</a>" in console.client.get("/console").text


def test_scheduled_page_empty(console: ConsoleRig) -> None:
    console.sign_in()
    assert "No scheduled messages." in console.client.get("/console/scheduled").text


def test_send_box_owes_one_message_without_taking_over(console: ConsoleRig) -> None:
    session_id = talk(console)
    csrf = console.sign_in()
    page = console.client.get(f"/console/c/{session_id}").text
    assert "Send a message (the bot keeps answering)</label>" in page
    found = re.search(
        r'/send" class="reply">\s*<input[^>]*>\s*<input[^>]*value="([0-9a-f]{32})"', page
    )
    assert found is not None
    form = {"text": "Your parcel shipped.", "nonce": found.group(1)}

    refused = console.client.post(f"/console/c/{session_id}/send", data=form)
    assert refused.status_code == 403
    form["csrf"] = csrf
    console.client.post(f"/console/c/{session_id}/send", data=form)
    console.client.post(f"/console/c/{session_id}/send", data=form)  # resubmitted: once
    sent = console.call(console.adapter.wait_for_sent, 2)
    assert [(s.chat_id, s.text) for s in sent] == [(PHONE, "Hi!"), (PHONE, "Your parcel shipped.")]
    console.call(console.gateway.ledger.flush)
    owed = console.call(console.gateway.ledger.list_obligations)
    assert sorted(o.content for o in owed) == ["Hi!", "Your parcel shipped."]
    assert not console.call(console.gateway.turns.takeovers.is_taken_over, session_id)
    page = console.client.get(f"/console/c/{session_id}").text
    assert "Your parcel shipped." in page and "operator (person)" in page

    console.model.add(ScriptedModel.reply("Still here."))
    console.deliver(make_event("thanks", chat_id=PHONE, sender_id=PHONE))
    assert len(console.model.requests) == 2  # the bot kept answering
    missing = console.client.post("/console/c/fake-0000000000000000/send", data=form)
    assert missing.status_code == 404
