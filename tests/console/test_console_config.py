"""``CONSOLE_TOKEN``: optional, and refused at start-up when too short to be a secret."""

from __future__ import annotations

import pytest

from bot.config import CONSOLE_TOKEN_MIN_LENGTH, load_settings
from bot.errors import ConfigurationError


def test_a_short_token_stops_start_up_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONSOLE_TOKEN", "x" * (CONSOLE_TOKEN_MIN_LENGTH - 1))
    with pytest.raises(ConfigurationError) as caught:
        load_settings(_env_file=None)
    message = str(caught.value)
    assert message.startswith("CONSOLE_TOKEN: must be at least 24 characters")
    assert "\n" not in message and "x" * 10 not in message
    assert caught.value.setting == "CONSOLE_TOKEN"


def test_unset_means_no_console_and_a_long_token_is_kept_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CONSOLE_TOKEN", raising=False)
    assert load_settings(_env_file=None).console_token is None
    monkeypatch.setenv("CONSOLE_TOKEN", "y" * CONSOLE_TOKEN_MIN_LENGTH)
    settings = load_settings(_env_file=None)
    assert settings.console_token is not None
    assert "y" * CONSOLE_TOKEN_MIN_LENGTH not in repr(settings)
