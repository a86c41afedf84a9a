"""Buttons in the core: ``Button``, ``ToolOutput(buttons=...)`` and ``RunResult.buttons``."""

from __future__ import annotations

import pytest

from bot import Agent, Button, Runner, ToolOutput, tool
from bot.core.buttons import MAX_BUTTONS, normalise_buttons, offer_buttons
from bot.core.messages import Role
from bot.core.models.base import ModelResponse
from bot.core.models.scripted import ScriptedModel
from bot.core.runner import RunResult
from bot.core.stores.in_memory import SessionStore

SID = "test-0123456789abcdef"


def test_a_button_needs_a_label_and_its_value_defaults_to_it() -> None:
    assert Button("Yes").effective_value == "Yes"
    assert Button("Yes", value="confirm:1").effective_value == "confirm:1"
    for bad in ("", "   "):
        with pytest.raises(ValueError):
            Button(bad)
    with pytest.raises(ValueError):
        Button("x" * 201)
    with pytest.raises(TypeError):
        Button("Yes", value=1)  # type: ignore[arg-type]


def test_tool_output_normalises_strings_and_buttons() -> None:
    output = ToolOutput("pick", buttons=["Small", Button("Large", value="L")])
    assert output.buttons == (Button("Small"), Button("Large", "L"))
    assert ToolOutput("plain").buttons == ()
    with pytest.raises(ValueError):
        ToolOutput("pick", buttons=[""])
    with pytest.raises(TypeError):
        normalise_buttons([3])  # type: ignore[list-item]


def test_offer_buttons_tells_the_model_and_refuses_more_than_ten() -> None:
    two = ToolOutput("pick", buttons=["A", "B"])
    text, buttons = offer_buttons(two, "pick", ())
    assert buttons == (Button("A"), Button("B"))
    assert "2 button(s) will be shown under your reply" in text and "'A', 'B'" in text
    many = ToolOutput("pick", buttons=[f"o{i}" for i in range(MAX_BUTTONS + 1)])
    text, kept = offer_buttons(many, "pick", buttons)
    assert kept == buttons  # the earlier offer stands
    assert "error" in text and "at most 10" in text
    assert offer_buttons("plain text", "plain text", buttons) == ("plain text", buttons)


@tool
def first_choice() -> ToolOutput:
    """Offer two choices."""
    return ToolOutput("first", buttons=["A", "B"])


@tool
def second_choice() -> ToolOutput:
    """Offer three choices."""
    return ToolOutput("second", buttons=["X", Button("Y", value="why"), "Z"])


@tool
def too_many() -> ToolOutput:
    """Offer eleven choices."""
    return ToolOutput("many", buttons=[f"c{i}" for i in range(11)])


async def run(*steps: ModelResponse) -> tuple[RunResult, ScriptedModel]:
    model = ScriptedModel()
    model.add(*steps)
    agent = Agent(name="Shop", instructions="x", tools=[first_choice, second_choice, too_many])
    runner = Runner(agent, SessionStore(), model=model)
    return await runner.run_async(SID, "hi"), model


async def test_the_last_tool_output_with_buttons_gives_the_turns_buttons() -> None:
    result, model = await run(
        ScriptedModel.call("first_choice"),
        ScriptedModel.call("second_choice"),
        ScriptedModel.reply("Pick one."),
    )
    assert result.buttons == (Button("X"), Button("Y", "why"), Button("Z"))
    tool_results = [m for m in model.requests[-1].messages if m.role == Role.TOOL]
    assert all("will be shown under your reply" in (m.content or "") for m in tool_results)


async def test_more_than_ten_buttons_is_an_error_result_and_shows_none() -> None:
    result, model = await run(ScriptedModel.call("too_many"), ScriptedModel.reply("Sorry."))
    assert result.buttons == ()
    (tool_result,) = [m for m in model.requests[-1].messages if m.role == Role.TOOL]
    assert "at most 10 can be shown" in (tool_result.content or "")


async def test_a_turn_without_buttons_has_none() -> None:
    result, _ = await run(ScriptedModel.reply("Hello."))
    assert result.buttons == ()
