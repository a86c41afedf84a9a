"""The console's "Knowledge" page: the sources, signed in only."""

from __future__ import annotations

from pathlib import Path

from bot.core.knowledge.ingest import Ingestion
from bot.core.knowledge.service import KnowledgeBase
from bot.core.stores.base import TransactionalStore
from tests.console.conftest import ConsoleRig


async def _add(store: TransactionalStore, folder: Path) -> None:
    await Ingestion(KnowledgeBase(store)).add([folder])


def test_knowledge_page_lists_each_source_with_its_passages(
    console: ConsoleRig, tmp_path: Path
) -> None:
    assert console.client.get("/console/knowledge", follow_redirects=False).status_code == 303
    console.sign_in()
    assert "The knowledge base is empty" in console.client.get("/console/knowledge").text

    folder = tmp_path / "kb"
    (folder / "faq").mkdir(parents=True)
    (folder / "faq" / "<i>returns.md").write_text(
        "# Returns\n\nThirty days.\n\n# Refunds\n\nFive days."
    )
    console.call(_add, console.store, folder)

    html = console.client.get("/console/knowledge").text
    assert 'href="/console/knowledge" aria-current="page"' in html
    assert "<code>faq/&lt;i&gt;returns.md</code></td><td>2</td>" in html
    assert "Thirty days" not in html  # sources, not their text
