"""The web channel adapter: messages in through the gateway, replies acknowledged."""

from __future__ import annotations

import pytest

from bot.errors import PlatformError
from bot.gateway.contract import MessageEvent
from bot.platforms.web import WEB_SENDER_ID, WebAdapter


async def test_say_hands_a_dm_event_to_the_gateway_and_send_acknowledges() -> None:
    adapter = WebAdapter()
    seen: list[MessageEvent] = []

    async def on_event(event: MessageEvent) -> bool:
        seen.append(event)
        return True

    with pytest.raises(PlatformError):
        await adapter.say("try-1", "hi", message_id="n1")
    await adapter.start(on_event)
    event, accepted = await adapter.say("try-1", "hi", message_id="n1")
    assert accepted and seen == [event]
    assert (event.platform, event.message_id, event.text) == ("web", "web:try-1:n1", "hi")
    assert (event.source.chat_type, event.source.sender_id) == ("dm", WEB_SENDER_ID)
    result = await adapter.send("try-1", "hello")
    assert len(result.message_ids) == 1
    await adapter.stop()
    with pytest.raises(PlatformError) as caught:
        await adapter.send("try-1", "later")
    assert caught.value.retryable
