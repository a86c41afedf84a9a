"""``python -m bot knowledge``: what ``add --help`` promises, and progress only on a terminal."""

from __future__ import annotations

import io

import pytest

from bot.cli import main
from bot.core.knowledge.ingest import FileOutcome
from bot.knowledge_cli import _Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_add_help_states_the_exit_status_when_some_files_failed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["knowledge", "add", "--help"])

    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "Exit status: 0 when every file was added or found unchanged; 1 when some file failed"
        in text
    )


def test_search_refuses_a_limit_out_of_range(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert main(["knowledge", "search", "refunds", "--limit", "0"]) == 2
    assert "--limit must be 1 to 20" in capsys.readouterr().err


def _feed(progress: _Progress) -> None:
    progress.total = 3
    progress(FileOutcome("a.md", "added", 4))
    progress(FileOutcome("b.md", "unchanged"))
    progress(FileOutcome("c.pdf", "failed", reason="no text found in it"))


def test_progress_is_drawn_on_a_terminal_only() -> None:
    out, err = _Terminal(), io.StringIO()
    _feed(_Progress(out, err))
    assert "\r3/3 files, 4 passages" in out.getvalue()
    assert err.getvalue() == "failed: c.pdf: no text found in it\n"

    piped, err = io.StringIO(), io.StringIO()
    progress = _Progress(piped, err)
    _feed(progress)
    assert piped.getvalue() == "added a.md (4 passages)\n"  # one line per file written, no \r
    assert progress.summary() == (
        "knowledge: 1 added, 0 replaced, 1 unchanged, 1 failed (4 passages written)"
    )


def test_the_embedder_comes_from_the_settings_with_its_fallbacks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from bot.config import load_settings
    from bot.knowledge_cli import knowledge_settings_from

    for name in ("EMBEDDING_MODEL", "EMBEDDING_BASE_URL", "OPENAI_BASE_URL", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    assert knowledge_settings_from(load_settings()).embedder is None
    monkeypatch.setenv("EMBEDDING_MODEL", "nomic-embed-text")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    embedder = knowledge_settings_from(load_settings()).embedder
    assert embedder is not None
    assert (embedder.model, embedder.base_url, embedder.api_key) == (
        "nomic-embed-text",
        "https://api.openai.com/v1",
        "sk-x",
    )

    def base_url() -> str | None:
        found = knowledge_settings_from(load_settings()).embedder
        return None if found is None else found.base_url

    monkeypatch.setenv("OPENAI_BASE_URL", "http://vllm:8000/v1")
    assert base_url() == "http://vllm:8000/v1"
    monkeypatch.setenv("EMBEDDING_BASE_URL", "http://ollama:11434/v1")
    assert base_url() == "http://ollama:11434/v1"
