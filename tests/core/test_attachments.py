"""Media out in the core: a tool returns files, the media store keeps them; the turn has them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot import Agent, Attachment, ImagePart, Role, Runner, ToolOutput, tool
from bot.core.attachments import ToolFiles
from bot.core.media_store import MediaStore
from bot.core.messages import DocumentPart
from bot.core.models.routing import ModelSettings
from bot.core.models.scripted import ScriptedModel
from bot.core.tools import ToolContext
from bot.gateway.keys import load_or_create_secret
from tests.fakes.media_files import jpeg_bytes, pdf_bytes


@pytest.fixture
def files(tmp_path: Path) -> ToolFiles:
    return ToolFiles(tmp_path / "data" / "media")


def test_an_attachment_needs_exactly_one_source() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Attachment()
    with pytest.raises(ValueError, match="exactly one"):
        Attachment(data=b"x", path="a.txt")
    with pytest.raises(TypeError):
        ToolOutput(text=42)  # type: ignore[arg-type]


async def test_bytes_go_to_the_media_store_and_the_model_reads_a_note(files: ToolFiles) -> None:
    text, parts = await files.keep(ToolOutput("chart ready", [Attachment.image(jpeg_bytes())]))
    (part,) = parts
    assert isinstance(part, ImagePart) and part.mime_type == "image/jpeg"
    assert part.file_name == "image.jpg" and part.size == len(jpeg_bytes())
    assert await files.store.read(part.sha256) == jpeg_bytes()
    assert text.startswith('chart ready\n[photo "image.jpg" (')
    assert "attached: the user receives it with your answer]" in text


async def test_a_plain_result_passes_through(files: ToolFiles) -> None:
    assert await files.keep('{"ok": true}') == ('{"ok": true}', [])


async def test_a_file_in_the_attachments_folder_is_read_by_path(files: ToolFiles) -> None:
    assert files.files_dir == files.data_dir / "outbox"  # the default ATTACHMENTS_DIR
    report = files.files_dir / "reports" / "q3.pdf"
    report.parent.mkdir(parents=True)
    report.write_bytes(pdf_bytes("Q3"))
    _, (by_relative,) = await files.keep(ToolOutput("", [Attachment.file(path="reports/q3.pdf")]))
    _, (by_absolute,) = await files.keep(ToolOutput("", [Attachment(path=report)]))
    assert isinstance(by_relative, DocumentPart) and by_relative == by_absolute
    assert by_relative.mime_type == "application/pdf" and by_relative.file_name == "q3.pdf"


@pytest.mark.parametrize(
    ("attachment", "reason"),
    [
        pytest.param(Attachment(path="../../secret.txt"), "outside", id="escapes-data-dir"),
        pytest.param(Attachment(path="/etc/hostname"), "outside", id="absolute-outside"),
        pytest.param(Attachment(path="missing.pdf"), "no such file", id="missing"),
        pytest.param(Attachment(data=b""), "empty", id="empty"),
        pytest.param(Attachment.image(b"%PDF-1.4 not an image"), "not a JPEG", id="lying-image"),
    ],
)
async def test_an_unusable_file_is_left_out_and_the_model_is_told(
    files: ToolFiles, attachment: Attachment, reason: str
) -> None:
    (files.data_dir.parent / "secret.txt").write_text("top secret")
    text, parts = await files.keep(ToolOutput("done", [attachment]))
    assert parts == []
    assert text.startswith("done\n[a file could not be attached: ") and reason in text


_OUTSIDE = "outside the attachments folder (ATTACHMENTS_DIR)"


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        pytest.param("secret.key", "no such file", id="secret-by-name"),
        pytest.param("chatflow.db", "no such file", id="database-by-name"),
        pytest.param("../secret.key", _OUTSIDE, id="secret-relative"),
        pytest.param("../chatflow.db", _OUTSIDE, id="database-relative"),
        pytest.param("DATA_DIR/secret.key", _OUTSIDE, id="secret-absolute"),
        pytest.param("DATA_DIR/media", _OUTSIDE, id="users-files"),
        pytest.param("link-to-secret", _OUTSIDE, id="symlink-in-the-folder"),
    ],
)
async def test_the_database_the_secret_and_the_rest_of_data_dir_are_never_attached(
    tmp_path: Path, path: str, reason: str
) -> None:
    # A tool that forwards a path the model chose: review 2026-12-01b, F10.
    data_dir = tmp_path / "data"
    files = ToolFiles(data_dir / "media")
    load_or_create_secret(data_dir)
    (data_dir / "chatflow.db").write_bytes(b"SQLite format 3\x00every user's history")
    kept = await files.store.put(b"another user's photo")
    outbox = data_dir / "outbox"  # the default ATTACHMENTS_DIR
    outbox.mkdir()
    (outbox / "link-to-secret").symlink_to(data_dir / "secret.key")
    target = path.replace("DATA_DIR", str(data_dir))
    if path == "DATA_DIR/media":
        target = str(next((data_dir / "media").rglob(kept)))
    text, parts = await files.keep(ToolOutput("here", [Attachment.file(path=target)]))
    assert parts == []
    assert text.startswith("here\n[a file could not be attached: ") and reason in text


async def test_a_named_attachments_folder_is_the_only_one(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "q3.pdf").write_bytes(pdf_bytes("Q3"))
    files = ToolFiles(tmp_path / "data" / "media", files_dir=reports)
    (files.data_dir / "outbox").mkdir(parents=True)
    (files.data_dir / "outbox" / "old.pdf").write_bytes(pdf_bytes("old"))
    _, (part,) = await files.keep(ToolOutput("", [Attachment.file(path="q3.pdf")]))
    assert part.file_name == "q3.pdf"
    text, parts = await files.keep(
        ToolOutput("", [Attachment.file(path=files.data_dir / "outbox" / "old.pdf")])
    )
    assert parts == [] and "outside the attachments folder" in text


async def test_a_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    small = ToolFiles(tmp_path / "media", max_bytes=100)
    text, parts = await small.keep(ToolOutput("", [Attachment.image(jpeg_bytes(padding=200))]))
    assert parts == [] and "over 100 B" in text


@tool
def make_chart(ctx: ToolContext, title: str) -> ToolOutput:
    """Draw a chart.

    Args:
        title: What it shows.
    """
    return ToolOutput(f"chart of {title}", [Attachment.image(jpeg_bytes(), file_name="c.jpg")])


async def test_invoke_still_answers_text_for_a_tool_output() -> None:
    ctx = ToolContext(session_id="s")
    assert await make_chart.invoke(ctx, {"title": "sales"}) == "chart of sales"
    output = await make_chart.run(ctx, {"title": "sales"})
    assert isinstance(output, ToolOutput) and len(output.attachments) == 1


async def test_a_turn_carries_the_files_its_tools_returned(tmp_path: Path) -> None:
    model = ScriptedModel(
        [ScriptedModel.call("make_chart", title="sales"), ScriptedModel.reply("Here it is.")]
    )
    agent = Agent(name="Charts", instructions="Draw.", tools=[make_chart])
    settings = ModelSettings(media_dir=str(tmp_path / "media"))
    async with Runner(agent, model=model, model_settings=settings) as runner:
        result = await runner.run_async("s-1", "chart my sales")
    (part,) = result.attachments
    assert isinstance(part, ImagePart) and part.file_name == "c.jpg"
    assert await MediaStore(tmp_path / "media").read(part.sha256) == jpeg_bytes()
    tool_message = next(m for m in result.new_messages if m.role is Role.TOOL)
    assert tool_message.parts == [part]  # a reference in the row, never the bytes
    second = model.requests[1].messages
    seen = next(m for m in second if m.role is Role.TOOL)
    assert seen.content is not None and 'chart of sales\n[photo "c.jpg"' in seen.content
    assert result.content == "Here it is."


async def test_max_media_bytes_from_the_environment_bounds_what_a_tool_attaches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MAX_MEDIA_BYTES", "100")  # the photo is larger
    model = ScriptedModel(
        [ScriptedModel.call("make_chart", title="sales"), ScriptedModel.reply("Sorry.")]
    )
    agent = Agent(name="Charts", instructions="Draw.", tools=[make_chart])
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s-1", "chart my sales")
    assert result.attachments == []
    seen = next(m for m in model.requests[1].messages if m.role is Role.TOOL)
    assert seen.content is not None and "over 100 B" in seen.content


@tool
def send_file(ctx: ToolContext, path: str) -> ToolOutput:
    """Send a file the model names.

    Args:
        path: The file.
    """
    return ToolOutput("sent", [Attachment.file(path=path)])


async def test_a_tool_forwarding_the_models_path_sends_only_from_the_outbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    load_or_create_secret(tmp_path)
    (tmp_path / "outbox").mkdir()
    (tmp_path / "outbox" / "q3.pdf").write_bytes(pdf_bytes("Q3"))
    model = ScriptedModel(
        [
            ScriptedModel.call("send_file", path=str(tmp_path / "secret.key")),
            ScriptedModel.call("send_file", path="q3.pdf"),
            ScriptedModel.reply("Done."),
        ]
    )
    agent = Agent(name="Files", instructions="Send files.", tools=[send_file])
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s-1", "mail me the secret key and the Q3 report")
    (part,) = result.attachments
    assert part.file_name == "q3.pdf"
    refused = [m for m in model.requests[1].messages if m.role is Role.TOOL][-1]
    assert refused.content is not None and "outside the attachments folder" in refused.content


async def test_attachments_dir_set_in_the_environment_is_the_folder_the_runner_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ATTACHMENTS_DIR", str(tmp_path / "reports"))
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "q3.pdf").write_bytes(pdf_bytes("Q3"))
    (tmp_path / "data" / "outbox").mkdir(parents=True)
    (tmp_path / "data" / "outbox" / "old.pdf").write_bytes(pdf_bytes("old"))
    model = ScriptedModel(
        [
            ScriptedModel.call("send_file", path="q3.pdf"),
            ScriptedModel.call("send_file", path=str(tmp_path / "data" / "outbox" / "old.pdf")),
            ScriptedModel.reply("Done."),
        ]
    )
    agent = Agent(name="Files", instructions="Send files.", tools=[send_file])
    async with Runner(agent, model=model) as runner:
        result = await runner.run_async("s-1", "the Q3 report, and the old one")
    assert [part.file_name for part in result.attachments] == ["q3.pdf"]
