"""The public names of DESIGN.md §3.0 stay importable from ``bot``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import bot

ROOT = Path(__file__).resolve().parents[1]

DESIGN_NAMES = {
    "Agent",
    "Runner",
    "RunResult",
    "tool",
    "Role",
    "Message",
    "ToolCall",
    "SessionContext",
    "BaseSessionStore",
    "SessionStore",
    "SQLiteSessionStore",
    "SessionDeletedError",
    "DEFAULT_DEDUP_TTL_HOURS",
    "ChatflowError",
}

# DESIGN.md §3.8 "Library": the settings the Runner reads, and the error family.
LIBRARY_NAMES = {
    "ToolContext",
    "DatabaseUnavailableError",
    "CommitOutcomeUnknownError",
    "SessionLeaseLostError",
    "ModelSettings",
    "AgentNotFoundError",
    "ConfigurationError",
    "EmptyAnswerError",
    "MaxToolRoundsError",
    "ModelError",
    "PlatformError",
    "SchemaVersionError",
    "StorageError",
    "TurnError",
    # DESIGN.md §3.8 "MCP": tool servers, spelled as in openai-agents.
    "MCPServer",
    "MCPServerStdio",
    "MCPServerStreamableHttp",
    "MCPServerError",
    # openai-agents' static MCP tool filter (``tool_filter=``), same shape.
    "ToolFilterStatic",
    "create_static_tool_filter",
    # DESIGN.md §3.8 "Media": message parts, and the error for an unusable attachment.
    "TextPart",
    "ImagePart",
    "AudioPart",
    "DocumentPart",
    "LocationPart",
    "ContactPart",
    "MessagePart",
    "MediaError",
    # Media out: what a tool returns to send the user a photo or a file.
    "Attachment",
    "ToolOutput",
    # Human takeover: the opt-in tool an agent offers to hand its chat to a person.
    "transfer_to_human",
    # Streaming: what Runner.run_async(stream=...) shows the answer to as it is written.
    "ReplyStream",
    # Reminders: the opt-in tools an agent schedules messages to its chat with.
    "schedule_message",
    "search_knowledge",
    "list_scheduled_messages",
    "cancel_scheduled_message",
    "scheduling_tools",
    # Long-term memory (issue #39): bot.memory_tools.
    "remember",
    "recall",
    "forget",
    # Buttons: choices a tool offers under the reply (issue #29), and a refused tap.
    "Button",
    "TapRefusedError",
    # Approvals: a gated tool call waits (RunResult.pending_approval, issue #29).
    "PendingApproval",
    "ApprovalError",
    "Decline",  # a needs_approval check refusing before asking (issue #36)
    # Voice replies: how an agent's replies are spoken (issue #31).
    "Voice",
    # Compaction: when an agent's long conversations are summarised (issue #30).
    "Compaction",
    # Accounting: each model call's usage on RunResult.calls (issue #30).
    "CallUsage",
}


def test_all_lists_exactly_the_public_names() -> None:
    assert set(bot.__all__) == DESIGN_NAMES | LIBRARY_NAMES
    for name in bot.__all__:
        assert getattr(bot, name) is not None


def test_testing_helpers_are_a_separate_module() -> None:
    from bot.core.models.scripted import ScriptedModel
    from bot.testing import FakeAdapter, make_event
    from bot.testing import ScriptedModel as exported

    assert exported is ScriptedModel
    assert callable(make_event) and FakeAdapter.__module__ == "bot.testing"
    assert "testing" not in bot.__all__


def test_seed_import_path_still_works() -> None:
    from bot.core.memory import (  # noqa: F401
        DEFAULT_DEDUP_TTL_HOURS,
        SessionContext,
        SessionDeletedError,
        SessionStore,
    )

    assert DEFAULT_DEDUP_TTL_HOURS == 192


def test_readme_example_runs_offline() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Write an agent\n\n```python\n(.*?)```", readme, re.S)
    assert block is not None
    result = subprocess.run(
        [sys.executable, "-c", block.group(1)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[Order Tracking]")


def test_agents_readme_library_example_runs_offline(tmp_path: Path) -> None:
    readme = (ROOT / "agents" / "README.md").read_text()
    block = re.search(r"## Run an agent from Python\n\n```python\n(.*?)```", readme, re.S)
    assert block is not None
    result = subprocess.run(
        [sys.executable, "-c", block.group(1)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # no agents/ folder here: the shipped examples answer
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[Order Tracking]")
    assert "DHL Express" in result.stdout


def test_no_public_name_is_also_a_submodule_of_bot() -> None:
    """Importing a submodule sets it as an attribute of its package, so a public name
    shared with ``bot/<name>.py`` would turn into that module once anything imported
    it (``from bot import memory_tools`` gave the module, and ``*memory_tools`` failed
    in the agents, depending on what the process had imported before)."""
    import bot

    package = Path(bot.__file__).parent
    submodules = {p.stem for p in package.glob("*.py")} | {
        p.name for p in package.iterdir() if (p / "__init__.py").exists()
    }
    assert sorted(set(bot.__all__) & submodules) == []
