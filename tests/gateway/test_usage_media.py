"""A turn's usage rows are part of its commit; a voice note's transcription is billed too,
its reported usage joining the turn's rows (or recorded apart when no turn commits)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from bot.core.models.base import Usage
from bot.core.models.scripted import ScriptedModel
from bot.core.models.transcription import Transcript
from bot.core.sql import Transaction
from bot.core.usage import CallUsage
from bot.errors import StorageError
from bot.gateway.contract import MediaAttachment
from tests.fakes.adapter import make_event
from tests.fakes.media_files import ogg_opus_bytes
from tests.gateway.conftest import Rig


class MeteredFake:
    """A transcriber that reports token usage (as ``gpt-4o-transcribe`` does), or none."""

    def __init__(self, usage: Usage | None) -> None:
        self.usage = usage
        self.meanwhile: Callable[[], Awaitable[object]] | None = None

    async def transcribe(self, data: bytes, *, file_name: str, mime_type: str) -> str:
        return (await self.transcribe_metered(data, file_name=file_name, mime_type=mime_type)).text

    async def transcribe_metered(
        self, data: bytes, *, file_name: str, mime_type: str
    ) -> Transcript:
        if self.meanwhile is not None:
            await self.meanwhile()
        return Transcript("where is order 1001", self.usage)


async def voice_turn(rig: Rig, usage: Usage | None) -> list[tuple[object, ...]]:
    media = rig.gateway.turns.media
    assert media is not None
    media.transcriber = MeteredFake(usage)
    media.transcription_model = "gpt-4o-transcribe"
    rig.adapter.files["voice-1"] = ogg_opus_bytes()
    rig.model.add(ScriptedModel.reply("It ships today.", usage=Usage(90, 9)))
    event = make_event(
        "", media=[MediaAttachment("voice", file_id="voice-1", mime_type="audio/ogg")]
    )
    assert await rig.adapter.deliver(event)
    await rig.adapter.wait_for_sent(1)
    async with rig.store.transaction() as tx:
        return await tx.fetchall(
            "SELECT agent, kind, model, prompt_tokens, completion_tokens FROM chatflow_usage "
            "ORDER BY id"
        )


async def test_a_transcription_with_reported_tokens_is_recorded_with_the_turn(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rows = await voice_turn(rig, Usage(53, 12))
    model = rig.gateway.runner._models["Helper"][1]
    assert rows == [
        ("Helper", "transcription", "gpt-4o-transcribe", 53, 12),
        ("Helper", "chat", model, 90, 9),
    ]
    metrics = rig.gateway.metrics.render().decode()
    assert 'chatflow_tokens_total{agent="Helper",call="transcription",kind="prompt"} 53.0' in (
        metrics
    )


async def test_a_transcription_without_reported_tokens_records_nothing_invented(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rows = await voice_turn(rig, None)
    assert [row[1] for row in rows] == ["chat"]


async def test_a_transcription_billed_before_a_takeover_is_still_recorded(
    rigs: Callable[..., object],
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("Hello!", usage=Usage(5, 1)))
    assert await rig.adapter.deliver(make_event("hi"))
    await rig.adapter.wait_for_sent(1)
    [session_id] = await rig.store.list_sessions()
    media = rig.gateway.turns.media
    assert media is not None
    transcriber = MeteredFake(Usage(40, 8))
    # A person takes the conversation over while the voice note is transcribed.
    transcriber.meanwhile = lambda: rig.gateway.turns.takeovers.take_over(session_id)
    media.transcriber = transcriber
    rig.adapter.files["voice-2"] = ogg_opus_bytes()
    event = make_event(
        "", media=[MediaAttachment("voice", file_id="voice-2", mime_type="audio/ogg")]
    )
    assert await rig.adapter.deliver(event)
    assert await rig.gateway._dispatcher.drain(5)
    assert len(rig.model.requests) == 1  # no turn for the voice note
    async with rig.store.transaction() as tx:
        rows = await tx.fetchall(
            "SELECT kind, prompt_tokens, completion_tokens FROM chatflow_usage ORDER BY id"
        )
    assert rows == [("chat", 5, 1), ("transcription", 40, 8)]


async def test_the_rows_of_a_commit_that_fails_roll_back_and_are_recorded_once(
    rigs: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    rig: Rig = await rigs()  # type: ignore[misc]
    inbox = rig.gateway.inbox
    real = inbox.mark_done_in
    failures = [StorageError("disk full")]

    async def fail_once(tx: Transaction, message_id: str, error: str | None = None) -> bool:
        if failures:
            raise failures.pop()  # tx 2 fails after the usage rows were written in it
        return await real(tx, message_id, error)

    monkeypatch.setattr(inbox, "mark_done_in", fail_once)
    rig.model.add(ScriptedModel.reply("Hello!", usage=Usage(70, 7)))
    assert await rig.adapter.deliver(make_event("hi"))
    await rig.adapter.wait_for_sent(1)  # the apology
    assert await rig.gateway._dispatcher.drain(5)
    async with rig.store.transaction() as tx:
        rows = await tx.fetchall("SELECT kind, prompt_tokens FROM chatflow_usage")
    assert rows == [("chat", 70)]  # once: tx 2's row rolled back, the call recorded apart


async def test_a_turn_cancelled_as_its_commit_landed_is_not_recorded_twice(
    rigs: Callable[..., object],
) -> None:
    """A shutdown's cancellation that arrives while tx 2 lands makes the turn look failed
    to its caller; the inbox says it committed, so its calls are not recorded again."""
    rig: Rig = await rigs()  # type: ignore[misc]
    rig.model.add(ScriptedModel.reply("Hello.", usage=Usage(40, 4)))
    event = make_event("hi")
    assert await rig.adapter.deliver(event)
    await rig.adapter.wait_for_sent(1)
    accounting, inbox = rig.gateway.accounting, rig.gateway.inbox
    (session_id,) = await rig.store.list_sessions()
    billed = [CallUsage("chat", "gpt-test", "Helper", Usage(40, 4))]

    async def rows() -> int:
        async with rig.store.transaction() as tx:
            (count,) = await tx.fetchone("SELECT count(*) FROM chatflow_usage") or (0,)
        return int(count)

    assert await rows() == 1  # the turn's own, from its tx 2
    await accounting.record_lost(session_id, event, billed, inbox=inbox)
    assert await rows() == 1
    never_committed = make_event("lost")
    await accounting.record_lost(session_id, never_committed, billed, inbox=inbox)
    assert await rows() == 2
