"""``ModelSettings``: read from the environment or from a settings object, never leak a key."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from bot.config import Settings
from bot.core.models import ModelSettings, ModelSettingsSource
from bot.errors import ConfigurationError

ALL = {
    "OPENAI_API_KEY": "sk-env-0123456789",
    "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    "GEMINI_API_KEY": "g-env-0123456789",
    "OLLAMA_BASE_URL": "http://127.0.0.1:11434/v1",
    "DEFAULT_MODEL": "gpt-4o",
    "MODEL_TIMEOUT_SECONDS": "12.5",
}


def test_from_env_reads_every_model_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ALL.items():
        monkeypatch.setenv(name, value)
    assert ModelSettings.from_env() == ModelSettings(
        openai_api_key="sk-env-0123456789",
        openai_base_url="http://127.0.0.1:9/v1",
        gemini_api_key="g-env-0123456789",
        ollama_base_url="http://127.0.0.1:11434/v1",
        default_model="gpt-4o",
        model_timeout_seconds=12.5,
    )


def test_from_env_with_nothing_set_is_the_default() -> None:
    assert ModelSettings.from_env() == ModelSettings()


@pytest.mark.parametrize("blank", ["", "   "], ids=["empty", "spaces"])
def test_from_env_counts_empty_values_as_unset(blank: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ALL:
        monkeypatch.setenv(name, blank)
    assert ModelSettings.from_env() == ModelSettings()


def test_from_env_reads_a_given_mapping_instead_of_os_environ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEFAULT_MODEL", "gpt-4o")
    settings = ModelSettings.from_env({"DEFAULT_MODEL": "ollama/qwen"})
    assert settings.default_model == "ollama/qwen"


@pytest.mark.parametrize(
    "value", ["soon", "0", "-1", "inf", "nan"], ids=["word", "zero", "negative", "inf", "nan"]
)
def test_from_env_refuses_a_bad_timeout_naming_it(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ModelSettings.from_env({"MODEL_TIMEOUT_SECONDS": value})
    assert info.value.setting == "MODEL_TIMEOUT_SECONDS"


@pytest.mark.parametrize("value", ["big", "0", "-5"], ids=["word", "zero", "negative"])
def test_from_env_refuses_a_bad_media_limit_naming_it(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ModelSettings.from_env({"MAX_MEDIA_BYTES": value})
    assert info.value.setting == "MAX_MEDIA_BYTES"


def test_from_env_reads_the_media_limit() -> None:
    assert ModelSettings.from_env({"MAX_MEDIA_BYTES": "1000"}).max_media_bytes == 1000


def test_keys_never_appear_in_repr_or_str(caplog: pytest.LogCaptureFixture) -> None:
    settings = ModelSettings.from_env(ALL)
    logging.getLogger("test").warning("settings: %s", settings)
    for text in (repr(settings), str(settings), f"{settings}", caplog.text):
        assert "sk-env-0123456789" not in text
        assert "g-env-0123456789" not in text
    assert "openai_api_key=set" in repr(settings)


def test_from_settings_unwraps_the_app_settings_secrets() -> None:
    settings = Settings(openai_api_key="sk-app", gemini_api_key="g-app")
    assert isinstance(settings, ModelSettingsSource)
    model = ModelSettings.from_settings(settings)
    assert (model.openai_api_key, model.gemini_api_key) == ("sk-app", "g-app")
    assert model.ollama_base_url == "http://localhost:11434/v1"


def test_from_settings_accepts_a_duck_typed_settings_object() -> None:
    duck = SimpleNamespace(
        openai_api_key="k",
        openai_base_url=None,
        gemini_api_key=None,
        ollama_base_url=None,
        default_model="gpt-4o",
        model_timeout_seconds=5.0,
    )
    assert ModelSettings.from_settings(duck) == ModelSettings(
        openai_api_key="k", default_model="gpt-4o", model_timeout_seconds=5.0
    )


@pytest.mark.parametrize(
    "bad",
    [{"openai_api_key": "sk-x"}, SimpleNamespace(openai_api_key="sk-x"), None, 3],
    ids=["dict", "partial-object", "none", "int"],
)
def test_from_settings_refuses_other_objects(bad: object) -> None:
    with pytest.raises(TypeError):
        ModelSettings.from_settings(bad)  # type: ignore[arg-type]
