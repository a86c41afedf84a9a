"""Media out through the gateway: a tool's file is part of the reply owed in the ledger."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot import Agent, Attachment, ImagePart, Runner, ToolOutput, tool
from bot.config import Settings
from bot.core.media_store import MediaStore
from bot.core.messages import DocumentPart
from bot.core.models.routing import ModelSettings
from bot.core.models.scripted import ScriptedModel
from bot.core.sql import ensure_schema
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.gateway.attachments import send_reply
from bot.gateway.contract import OutgoingFile, PlatformAdapter, SendResult
from bot.gateway.gateway import Gateway
from bot.gateway.ledger import DeliveryLedger
from bot.gateway.ledger.obligations import (
    MIGRATIONS,
    RECOVERED_MARKER,
    TABLE,
    Obligation,
    compute_obligation_id,
)
from tests.fakes.adapter import FakeAdapter, make_event, transient
from tests.fakes.media_files import jpeg_bytes
from tests.gateway.ledger.ledger_support import dead_owner

SECRET = b"k" * 32


@tool
def draw_chart(title: str) -> ToolOutput:
    """Draw a chart.

    Args:
        title: What it shows.
    """
    return ToolOutput(f"chart of {title}", [Attachment.image(jpeg_bytes(), file_name="chart.jpg")])


@dataclass
class MediaRig:
    gateway: Gateway
    adapter: FakeAdapter
    model: ScriptedModel
    store: SQLiteSessionStore

    async def obligation_ids(self) -> list[str]:
        async with self.store.transaction() as tx:
            rows = await tx.fetchall(f"SELECT obligation_id FROM {TABLE}")
        return [str(r[0]) for r in rows]


@pytest.fixture
async def rigs(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[MediaRig] = []

    async def make(adapter: FakeAdapter | None = None) -> MediaRig:
        store = SQLiteSessionStore(str(tmp_path / "chatflow.db"))
        model = ScriptedModel()
        agent = Agent(name="Charts", instructions="Draw.", tools=[draw_chart])
        settings = ModelSettings(media_dir=str(tmp_path / "media"))
        runner = Runner(agent, store, model=model, model_settings=settings)
        fake = adapter or FakeAdapter()
        gateway = Gateway(runner, store, [fake], Settings(data_dir=tmp_path), secret=SECRET)
        await gateway.start()
        await gateway.wait_ready()
        rig = MediaRig(gateway, fake, model, store)
        made.append(rig)
        return rig

    yield make
    for rig in made:
        await rig.gateway.stop(grace=1)
        await rig.store.close()


def script(model: ScriptedModel) -> None:
    model.add(ScriptedModel.call("draw_chart", title="sales"), ScriptedModel.reply("Here it is."))


async def test_a_tools_image_is_sent_after_the_text_and_owed_with_it(
    rigs: Callable[..., Any],
) -> None:
    rig: MediaRig = await rigs()
    script(rig.model)
    event = make_event("chart my sales")
    await rig.adapter.deliver(event)
    (sent,) = await rig.adapter.wait_for_sent(1)
    await rig.gateway._dispatcher.drain(5)
    assert sent.text == "Here it is."
    (file,) = rig.adapter.sent_files
    assert (file.kind, file.data, file.file_name) == ("image", jpeg_bytes(), "chart.jpg")
    assert file.path is not None and file.path.read_bytes() == jpeg_bytes()
    (oid,) = await rig.obligation_ids()
    row = await rig.gateway.ledger.get(oid)
    assert row is not None and row.state == "delivered"
    (part,) = row.attachments
    assert isinstance(part, ImagePart) and part.file_name == "chart.jpg"
    assert len(row.sent_ids) == 2  # the text and the photo
    # The id covers the file: the same text with another file is another reply.
    assert oid == compute_obligation_id(row.session_key, event.message_id, row.content, [part])
    assert oid != compute_obligation_id(row.session_key, event.message_id, row.content)


async def test_files_that_fail_after_the_text_resend_the_whole_reply_marked(
    rigs: Callable[..., Any],
) -> None:
    rig: MediaRig = await rigs()
    rig.adapter.fail_files.append(transient("upload failed", retry_after=0))
    script(rig.model)
    await rig.adapter.deliver(make_event("chart my sales"))
    await rig.adapter.wait_for_sent(1)
    await rig.gateway._dispatcher.drain(5)
    (oid,) = await rig.obligation_ids()
    failed = await rig.gateway.ledger.get(oid)
    assert failed is not None and failed.state == "failed" and failed.maybe_delivered
    assert rig.adapter.sent_files == []
    assert await rig.gateway.outbox.retry_due() == 1
    first, again = await rig.adapter.wait_for_sent(2)
    assert first.text == "Here it is."
    assert again.text == RECOVERED_MARKER + "Here it is."  # the user had part of it
    assert [f.data for f in rig.adapter.sent_files] == [jpeg_bytes()]


@dataclass(eq=False)
class TextOnlyAdapter(FakeAdapter):
    """An adapter written before attachments: the contract's default hook applies."""

    async def send_attachments(
        self,
        chat_id: str,
        files: Sequence[OutgoingFile],
        *,
        thread_id: str | None = None,
        reply_to: str | None = None,
    ) -> SendResult:
        return await PlatformAdapter.send_attachments(
            self, chat_id, files, thread_id=thread_id, reply_to=reply_to
        )


async def test_an_adapter_without_files_names_them_in_a_line(rigs: Callable[..., Any]) -> None:
    rig: MediaRig = await rigs(TextOnlyAdapter())
    script(rig.model)
    await rig.adapter.deliver(make_event("chart my sales"))
    text, note = await rig.adapter.wait_for_sent(2)
    assert text.text == "Here it is."
    assert note.text == '(Attached: photo "chart.jpg". This channel cannot show files.)'


async def test_ledger_rows_made_before_attachments_still_load(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "old.db"))
    await store.open()
    try:
        async with store.transaction() as tx:  # the ledger as version 1 left it
            await ensure_schema(tx, "delivery_ledger", {1: MIGRATIONS[1]})
            await tx.execute(
                f"INSERT INTO {TABLE} (obligation_id, session_key, session_id, platform, "
                "chat_id, message_ref, content, state, owner_pid, owner_instance, created_at, "
                "fresh_since, updated_at) VALUES ('o-old', 'k', 's', 'fake', 'c', 'm', 'hi', "
                "'pending', 1, 'gone', 1.0, 1.0, 1.0)"
            )
        ledger = DeliveryLedger(store)
        await ledger.open()
        old = await ledger.get("o-old")
        assert old is not None and old.content == "hi" and old.attachments == ()
    finally:
        await store.close()


_sha = st.text("0123456789abcdef", min_size=64, max_size=64)
_name = st.none() | st.text(st.characters(codec="utf-8"), max_size=30)
_FILES = st.lists(
    st.one_of(
        st.builds(
            ImagePart,
            sha256=_sha,
            mime_type=st.just("image/png"),
            size=st.integers(1, 10**7),
            file_name=_name,
        ),
        st.builds(
            DocumentPart,
            sha256=_sha,
            mime_type=st.just("application/pdf"),
            size=st.integers(1, 10**7),
            file_name=_name,
        ),
    ),
    max_size=4,
)


async def _ledger_round_trip(files: list[ImagePart | DocumentPart]) -> None:
    store = SQLiteSessionStore(":memory:")
    try:
        ledger = DeliveryLedger(store, owner=dead_owner())  # a process that died
        await ledger.open()
        oid = compute_obligation_id("k", "m", "hi", files)
        owed = Obligation.owed(
            obligation_id=oid,
            session_key="k",
            session_id="s",
            platform="fake",
            chat_id="c",
            thread_id=None,
            reply_to=None,
            content="hi",
            message_ref="m",
            attachments=tuple(files),
        )
        async with store.transaction() as tx:
            assert await ledger.record_in(tx, owed, claimed=True)
        loaded = await ledger.get(oid)
        assert loaded is not None and loaded.attachments == tuple(files)
        (swept,) = await DeliveryLedger(store).sweep_recoverable()  # what a restart resends
        assert swept.attachments == tuple(files) and swept.needs_marker
    finally:
        await store.close()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=_FILES)
def test_attachments_round_trip_through_the_ledger_and_its_sweep(
    files: list[ImagePart | DocumentPart],
) -> None:
    asyncio.run(_ledger_round_trip(files))


async def test_a_file_gone_from_the_store_is_said_and_the_rest_is_sent(tmp_path: Path) -> None:
    store = MediaStore(tmp_path / "media")
    kept = await store.put(jpeg_bytes())
    parts = (
        ImagePart(sha256=kept, mime_type="image/jpeg", size=9, file_name="kept.jpg"),
        DocumentPart(sha256="f" * 64, mime_type="application/pdf", size=9, file_name="gone.pdf"),
    )
    owed = Obligation.owed(
        obligation_id="o",
        session_key="k",
        session_id="s",
        platform="fake",
        chat_id="c",
        thread_id=None,
        reply_to=None,
        content="Your files.",
        message_ref="m",
        attachments=parts,
    )
    adapter = FakeAdapter()
    result = await send_reply(adapter, owed.claimed(), store)
    (sent,) = adapter.sent
    assert (
        sent.text == "Your files.\n\n(1 attached file(s) could not be sent: no longer available.)"
    )
    assert [f.file_name for f in adapter.sent_files] == ["kept.jpg"]
    assert len(result.message_ids) == 2
