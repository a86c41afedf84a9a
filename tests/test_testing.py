"""``bot.testing``: the helpers operators test their agents with, and the documented examples."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import bot.testing
import tests.fakes.adapter as project_fakes
from bot.core.models.scripted import ScriptedModel
from bot.errors import PlatformError
from bot.gateway.events import MessageEvent
from bot.platforms.base import PlatformAdapter
from bot.testing import FakeAdapter, make_event, transient

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "agents" / "README.md")
_TEST_BLOCK = re.compile(r"```python\n(# (tests/test_\w+\.py)[^\n]*\n.*?)```", re.S)


def test_scripted_model_is_the_core_one() -> None:
    assert bot.testing.ScriptedModel is ScriptedModel


def test_the_project_fakes_are_the_shipped_ones() -> None:
    for name in ("FakeAdapter", "Sent", "make_event", "transient"):
        assert getattr(project_fakes, name) is getattr(bot.testing, name)


def test_fake_adapter_is_a_platform_adapter() -> None:
    assert isinstance(FakeAdapter(), PlatformAdapter)


async def test_fake_adapter_records_sends_and_plays_queued_failures() -> None:
    adapter = FakeAdapter(fail_next=[transient("down", retry_after=2)])
    with pytest.raises(PlatformError) as info:
        await adapter.send("chat-1", "first")
    assert (info.value.retryable, info.value.retry_after) == (True, 2)
    result = await adapter.send("chat-1", "second", reply_to="7")
    assert result.message_ids and [s.text for s in adapter.sent] == ["second"]
    assert (await adapter.wait_for_sent(1))[0].reply_to == "7"


async def test_deliver_hands_the_event_to_the_gateway_entry_point() -> None:
    seen: list[str] = []

    async def on_event(event: MessageEvent) -> bool:
        seen.append(event.message_id)
        return True

    adapter = FakeAdapter()
    await adapter.start(on_event)
    event = make_event("hi", chat_type="group", mentions_bot=True)
    assert await adapter.deliver(event) and adapter.is_connected
    assert seen == [event.message_id]
    await adapter.stop()
    assert not adapter.is_connected


def test_make_event_gives_fresh_ids_unless_told() -> None:
    first, second = make_event(), make_event()
    assert first.message_id != second.message_id
    assert make_event(message_id="m-1").message_id == "m-1"
    assert first.source.platform == first.platform == "fake"


def doc_examples() -> list[tuple[str, str]]:
    found = [
        (match.group(2), match.group(1))
        for doc in DOCS
        for match in _TEST_BLOCK.finditer(doc.read_text(encoding="utf-8"))
    ]
    assert len(found) >= 2, "README.md and agents/README.md each show a test"
    return found


def test_the_documented_tests_pass(tmp_path: Path) -> None:
    # Run as an operator would: their own directory (no agents/ folder, so the
    # shipped examples load), plain pytest with pytest-asyncio, no repo config. Only
    # that plugin: the dev environment's others (hypothesis, xdist, playwright, ...)
    # are not the operator's, and loading them cost more than the tests themselves.
    files = []
    for name, code in doc_examples():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(code, encoding="utf-8")
        files.append(str(path))
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error"),
            *("-p", "pytest_asyncio.plugin"),
            *("-o", "asyncio_default_fixture_loop_scope=function", *files),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(files)} passed" in result.stdout
