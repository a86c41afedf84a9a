"""The console's "Approvals" page: tool calls waiting for a yes, decided once with CSRF."""

from __future__ import annotations

import json
import time

import pytest

from bot.core.models.scripted import ScriptedModel
from bot.core.stores.base import TransactionalStore
from bot.gateway.approvals import TABLE, ensure_approvals_schema_in
from tests.console.conftest import ConsoleRig
from tests.console.test_console_routes import PHONE, talk

APPROVAL = "a1b2c3d4e5f6"


async def _pending(
    store: TransactionalStore,
    session_id: str,
    arguments: str = '{"note": "<b>now</b>", "order_id": "1001"}',
) -> None:
    now = time.time()
    async with store.transaction() as tx:
        await ensure_approvals_schema_in(tx)
        await tx.execute(
            f"INSERT INTO {TABLE} (id, session_key, session_id, platform, chat_id, thread_id, "
            "sender_ref, agent, tool_name, call_id, arguments_json, state, created_at, "
            "expires_at) VALUES (?, 'agent:main:fake:dm:k', ?, 'fake', ?, NULL, "
            "'user_0123456789ab', 'Helper', 'refund', 'call_1', ?, 'pending', ?, ?)",
            (
                APPROVAL,
                session_id,
                PHONE,
                arguments,
                now,
                now + 600,
            ),
        )


async def _state(store: TransactionalStore) -> str:
    async with store.transaction() as tx:
        row = await tx.fetchone(f"SELECT state, decided_by FROM {TABLE} WHERE id = ?", (APPROVAL,))
    assert row is not None
    return f"{row[0]} by {row[1]}"


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        pytest.param("GET", "/console/approvals", 303, id="page-redirects"),
        pytest.param("POST", f"/console/approvals/{APPROVAL}/approve", 401, id="approve-401"),
    ],
)
def test_signed_out_gets_nothing(
    console: ConsoleRig, method: str, path: str, expected: int
) -> None:
    session_id = talk(console)
    console.call(_pending, console.store, session_id)
    response = console.client.request(method, path, follow_redirects=False)
    assert response.status_code == expected
    assert "refund" not in response.text
    assert console.call(_state, console.store) == "pending by None"


def test_approvals_page_lists_and_decides_once_with_csrf(console: ConsoleRig) -> None:
    session_id = talk(console)
    console.call(_pending, console.store, session_id)
    csrf = console.sign_in()
    html = console.client.get("/console/approvals").text
    assert 'href="/console/approvals" aria-current="page"' in html
    assert "Helper wants to run <code>refund</code>" in html
    assert "&lt;b&gt;now&lt;/b&gt;" in html and "<b>now" not in html and PHONE not in html
    assert f"/console/c/{session_id}" in html

    refused = console.client.post(f"/console/approvals/{APPROVAL}/approve", data={"csrf": "0" * 64})
    assert refused.status_code == 403
    assert console.call(_state, console.store) == "pending by None"

    console.model.add(ScriptedModel.reply("Done, refunded."))
    done = console.client.post(
        f"/console/approvals/{APPROVAL}/approve", data={"csrf": csrf}, follow_redirects=False
    )
    assert (done.status_code, done.headers["location"]) == (303, "/console/approvals")
    # A second operator's click (or a resubmitted form) decides nothing more.
    console.client.post(f"/console/approvals/{APPROVAL}/deny", data={"csrf": csrf})
    sent = console.call(console.adapter.wait_for_sent, 2)
    assert sent[-1].text.endswith("Done, refunded.")
    assert console.call(_state, console.store) in ("done by operator", "approved by operator")
    assert "No tool call is waiting for approval." in console.client.get("/console/approvals").text


def test_the_page_shows_the_whole_call(console: ConsoleRig) -> None:
    """G5: an argument past the short form's cut is on the page whole."""
    session_id = talk(console)
    to = "anna@example-customer.com,billing@example-customer.com,exfil@evil.example"
    arguments = json.dumps({"to": to, "body": "Hello " + "x" * 400})
    console.call(_pending, console.store, session_id, arguments)
    console.sign_in()
    html = console.client.get("/console/approvals").text
    assert "exfil@evil.example" in html and "x" * 400 in html
