"""The console's Memory page: the list, Forget, and forget-user behind its confirmation."""

from __future__ import annotations

from bot.core.long_memory import MemoryScope, RememberRequest, apply_memory_in
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.base import TransactionalStore
from bot.gateway.keys import hash_chat_id, hash_sender_id
from tests.console.conftest import SECRET, ConsoleRig
from tests.fakes.adapter import make_event


async def _remember(store: TransactionalStore, memory_id: str, text: str, who: str) -> None:
    scope = MemoryScope(
        "fake", hash_chat_id(who, SECRET), hash_sender_id(who, SECRET), private=True
    )
    async with store.transaction() as tx:
        await apply_memory_in(tx, [RememberRequest(memory_id, text, "me")], scope, "s", 1e9)


def test_memory_page_lists_forgets_and_erases_a_person_only_when_confirmed(
    console: ConsoleRig,
) -> None:
    console.model.add(ScriptedModel.reply("hello Ann"))
    console.deliver(make_event("ann-words-here", chat_id="ann", sender_id="ann"))
    console.call(_remember, console.store, "mem_0000000000a1", "Ann likes <b>tea</b>", "ann")
    console.call(_remember, console.store, "mem_0000000000b1", "Bob likes coffee", "bob")
    console.call(_remember, console.store, "mem_0000000000b2", "Bob cycles", "bob")
    assert console.client.get("/console/memory", follow_redirects=False).status_code == 303
    csrf = console.sign_in()
    page = console.client.get("/console/memory").text
    assert "Ann likes &lt;b&gt;tea&lt;/b&gt;" in page and "Bob likes coffee" in page

    console.client.post("/console/memory/mem_0000000000b2/forget", data={"csrf": csrf})
    assert "Bob cycles" not in console.client.get("/console/memory").text

    unconfirmed = console.client.post(
        "/console/memory/forget-user", data={"csrf": csrf, "person": "fake:ann"}
    )
    assert "Tick the confirmation" in unconfirmed.text and "Ann likes" in unconfirmed.text
    done = console.client.post(
        "/console/memory/forget-user", data={"csrf": csrf, "person": "fake:ann", "confirm": "yes"}
    )
    assert "Removed everything held about" in done.text
    assert "memories: 1" in done.text and "sessions: 1" in done.text
    assert "Ann likes" not in done.text and "Bob likes coffee" in done.text
    bad = console.client.post(
        "/console/memory/forget-user", data={"csrf": csrf, "person": "ann", "confirm": "yes"}
    )
    assert "PLATFORM:USER_ID" in bad.text
