"""``CONSOLE_TOKEN``: optional, and refused at start-up when too short to be a secret;
``FORWARDED_ALLOW_IPS``: the trusted proxies, refused when an entry could never match."""

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


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        pytest.param(None, "127.0.0.1,::1", id="default-this-host"),
        pytest.param("10.0.0.5, 10.1.0.0/16,::1", "10.0.0.5,10.1.0.0/16,::1", id="list"),
        pytest.param("*", "*", id="any"),
        pytest.param("10.0.0.5, *", "*", id="any-in-a-list"),
        pytest.param("10.0.0.5,", "10.0.0.5", id="trailing-comma"),
    ],
)
def test_forwarded_allow_ips_names_the_trusted_proxies(
    monkeypatch: pytest.MonkeyPatch, value: str | None, kept: str
) -> None:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    if value is not None:
        monkeypatch.setenv("FORWARDED_ALLOW_IPS", value)
    assert load_settings(_env_file=None).forwarded_allow_ips == kept


@pytest.mark.parametrize("value", ["proxy.internal", "10.0.0.5/8", "::1,10.0.0.300"])
def test_a_proxy_entry_that_could_never_match_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings(_env_file=None)
    assert str(caught.value).startswith("FORWARDED_ALLOW_IPS: ")
    assert caught.value.setting == "FORWARDED_ALLOW_IPS"
