"""``import bot`` stays light: the openai SDK loads only when a model client is built."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bot.core import models


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("import bot", id="bot"),
        pytest.param("import bot.testing", id="bot.testing"),
        pytest.param(
            "import bot; from bot import Agent, Runner; "
            "import asyncio; asyncio.run(Runner(Agent('A', '')).aclose())",
            id="offline-runner",
        ),
    ],
)
def test_the_openai_sdk_and_asyncpg_are_not_imported(code: str) -> None:
    check = "import sys; assert 'openai' not in sys.modules; assert 'asyncpg' not in sys.modules"
    result = subprocess.run(
        [sys.executable, "-c", f"{code}; {check}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_the_lazy_names_still_import() -> None:
    from bot.core.models import INVALID_JSON_ARGUMENTS, OpenAICompatibleModel
    from bot.core.models.openai_compat import OpenAICompatibleModel as direct

    assert OpenAICompatibleModel is direct
    assert INVALID_JSON_ARGUMENTS == "arguments were not valid JSON"
    assert {"OpenAICompatibleModel", "to_openai_messages"} <= set(dir(models))
    for name in models.__all__:
        assert getattr(models, name) is not None


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        models.no_such_name  # noqa: B018
