"""The per-message work of the inbound path (``Gateway._on_event`` through tx 1): what it
counts and journals stays as it was, with its fixed costs paid once instead of per message."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from bot.core.models.scripted import ScriptedModel
from bot.gateway.events import encodable, event_from_dict, event_to_dict
from tests.fakes.adapter import make_event
from tests.gateway.conftest import Rig


async def test_accepted_messages_are_counted_binding_the_platform_counter_once(
    rigs: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    counter = rig.gateway.metrics.messages_in
    bound: list[tuple[Any, ...]] = []
    labels = counter.labels

    def counting_labels(*values: Any) -> Any:
        bound.append(values)
        return labels(*values)

    monkeypatch.setattr(counter, "labels", counting_labels)
    events = [make_event(f"message {i}") for i in range(5)]
    for i, event in enumerate(events):
        rig.model.add(ScriptedModel.reply(f"answer {i}"))
        assert await rig.adapter.deliver(event)
    await rig.adapter.wait_for_sent(5)
    assert not await rig.adapter.deliver(events[0])  # a redelivery is not counted in
    metrics = rig.gateway.metrics.render().decode()
    assert 'chatflow_messages_in_total{platform="fake"} 5.0' in metrics
    assert 'chatflow_dedup_hits_total{platform="fake"} 1.0' in metrics
    assert bound == [("fake",)]  # one child per platform, not a labels() call per message


async def test_the_journal_row_is_the_event_as_compact_json(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("ok"))
    event = make_event("Привет, où est ma commande? 😀", sender_name="Zoë")
    assert await rig.adapter.deliver(event)
    await rig.adapter.wait_for_sent(1)
    async with rig.store.transaction() as tx:
        row = await tx.fetchone(
            "SELECT event_json FROM chatflow_inbox WHERE message_id = ?", (event.message_id,)
        )
    assert row is not None
    expected = json.dumps(event_to_dict(event), ensure_ascii=False, separators=(",", ":"))
    assert row[0] == expected
    assert event_from_dict(json.loads(row[0])) == dataclasses.replace(event, raw={})


def test_a_clean_non_ascii_event_comes_back_as_the_same_object() -> None:
    event = make_event("Привет 😀 مرحبا", sender_name="Zoë", chat_id="чат-1")
    assert encodable(event) is event


def test_surrogate_halves_in_neighbouring_fields_are_both_cleaned() -> None:
    # Joined for the check, the halves sit side by side: still two lone surrogates.
    event = dataclasses.replace(make_event("ends \ud83d"), platform_message_id="\ude00 starts")
    cleaned = encodable(event)
    assert cleaned.text == "ends \ufffd"
    assert cleaned.platform_message_id == "\ufffd starts"
