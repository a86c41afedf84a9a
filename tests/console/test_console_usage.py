"""A conversation's page shows its token totals, and its cost where the operator priced
the model (``MODEL_PRICES``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.core.models.base import Usage
from bot.core.models.scripted import ScriptedModel
from tests.console.conftest import ConsoleRig, running_console
from tests.fakes.adapter import make_event


def talk(console: ConsoleRig) -> str:
    console.model.add(
        ScriptedModel.reply("Hi!", usage=Usage(2_000, 100, cached_input_tokens=1_024))
    )
    console.deliver(make_event("hello", chat_id="c1", sender_id="c1"))
    return console.session_id()


def test_the_conversation_page_shows_its_totals(console: ConsoleRig) -> None:
    session_id = talk(console)
    console.sign_in()
    line = "tokens: 2100 over 1 model call (prompt 2000, cached 1024, completion 100, reasoning 0)"
    for path in (f"/console/c/{session_id}", f"/console/c/{session_id}/live"):
        html = console.client.get(path).text
        assert line in html
        assert "cost" not in html


@pytest.mark.parametrize(
    ("priced", "shown"),
    [
        pytest.param(True, "; cost: $0.0009", id="priced"),
        pytest.param(False, "; cost: no price", id="model-not-in-the-file"),
    ],
)
def test_with_model_prices_the_page_shows_the_cost_or_no_price(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, priced: bool, shown: str
) -> None:
    prices = tmp_path / "prices.json"
    # The scripted model's calls are recorded under the runner's model name.
    entry = {"input": 0.5, "cached_input": 0.25, "output": 2.0}
    prices.write_text(json.dumps({"offline" if priced else "gpt-x": entry}), encoding="utf-8")
    monkeypatch.setenv("MODEL_PRICES", str(prices))
    with running_console(tmp_path) as console:
        assert console.gateway.runner._models["Helper"][1] == "offline"
        session_id = talk(console)
        console.sign_in()
        html = console.client.get(f"/console/c/{session_id}").text
    # (2000 - 1024) * 0.5 + 1024 * 0.25 + 100 * 2.0 per million = $0.000944
    assert shown in html
