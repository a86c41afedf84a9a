"""A spoken reply with buttons: the voice note goes uncaptioned, the text carries the keyboard."""

from __future__ import annotations

from pathlib import Path

from bot import Agent, Runner, ToolOutput, tool
from bot.config import Settings
from bot.core.models.routing import ModelSettings
from bot.core.models.scripted import ScriptedModel
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.gateway import Gateway
from tests.fakes.adapter import FakeAdapter
from tests.fakes.media_files import ogg_opus_bytes
from tests.gateway.test_voice_replies import Transcript, voice_event

SECRET = b"v" * 32


@tool
def offer_slots() -> ToolOutput:
    """Offer two delivery slots."""
    return ToolOutput("offered", buttons=["Morning", "Evening"])


async def test_the_keyboard_goes_with_the_text_after_the_voice_note(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
    model = ScriptedModel()
    agent = Agent(name="Helper", instructions="Help.", tools=[offer_slots])
    runner = Runner(
        agent, store, model=model, model_settings=ModelSettings(media_dir=str(tmp_path / "m"))
    )
    adapter = FakeAdapter()
    adapter.files["voice-1"] = ogg_opus_bytes()
    settings = Settings(data_dir=tmp_path, voice_replies="auto")
    gateway = Gateway(runner, store, [adapter], settings, secret=SECRET)
    assert gateway.turns.media is not None
    gateway.turns.media.transcriber = Transcript()
    await gateway.start()
    await gateway.wait_ready()
    try:
        model.add(ScriptedModel.call("offer_slots"), ScriptedModel.reply("Which slot suits you?"))
        await adapter.deliver(voice_event())
        (sent,) = await adapter.wait_for_sent(1)
        ((message, note),) = adapter.voices
    finally:
        await gateway.stop(grace=1)
        await store.close()
    assert message.text in (None, "")  # no caption: the keyboard needs the text message
    assert note.kind == "voice"
    # FakeAdapter shows no buttons: the contract's default lists them under the text.
    assert sent.text == "Which slot suits you?\n\n1. Morning\n2. Evening"
