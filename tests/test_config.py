from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import Settings, load_settings
from bot.errors import ConfigurationError


def test_defaults_run_offline_on_sqlite_in_data() -> None:
    settings = load_settings()
    assert settings.database_path == Path("data/chatflow.db")
    assert not settings.telegram_enabled
    assert not settings.whatsapp_enabled


def test_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:abc")
    monkeypatch.setenv("ALLOWED_USERS", "1, 2,,3")
    monkeypatch.setenv("LOG_LEVEL", "debug")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    settings = load_settings()
    assert settings.telegram_enabled
    assert settings.allowed_users == frozenset({"1", "2", "3"})
    assert settings.log_level == "DEBUG"


def test_reads_dotenv_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = tmp_path / ".env"
    env.write_text("HTTP_PORT=9001\nDEFAULT_MODEL=ollama/llama3.1\n")
    settings = Settings(_env_file=env)
    assert settings.http_port == 9001
    assert settings.default_model == "ollama/llama3.1"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        pytest.param({"HTTP_PORT": "eighty"}, "HTTP_PORT", id="port-not-int"),
        pytest.param({"HTTP_PORT": "70000"}, "HTTP_PORT", id="port-range"),
        pytest.param({"MAX_TURNS": "0"}, "MAX_TURNS", id="max-turns-zero"),
        pytest.param({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL", id="log-level"),
        pytest.param({"DATABASE_URL": "mysql://x"}, "DATABASE_URL", id="db-url"),
        pytest.param({"WHATSAPP_PHONE_ID": "123"}, "WHATSAPP_TOKEN", id="wa-missing-token"),
        pytest.param({"TELEGRAM_BOT_TOKEN": "not-a-token"}, "TELEGRAM_BOT_TOKEN", id="tg-shape"),
        pytest.param(
            {"TELEGRAM_WEBHOOK_URL": "https://x/webhooks/telegram"},
            "TELEGRAM_WEBHOOK_SECRET",
            id="tg-webhook-without-secret",
        ),
    ],
)
def test_wrong_setting_is_named_in_one_line(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    message = str(info.value)
    assert named in message
    assert "\n" not in message


def test_secrets_never_print(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:supersecret")
    monkeypatch.setenv("WHATSAPP_PHONE_ID", "123")
    monkeypatch.setenv("WHATSAPP_TOKEN", "tok")
    monkeypatch.setenv("WHATSAPP_VERIFY_TOKEN", "verify")
    monkeypatch.setenv("WHATSAPP_APP_SECRET", "appsecret-xyz")
    settings = load_settings()
    shown = repr(settings) + str(settings) + settings.model_dump_json()
    assert "supersecret" not in shown
    assert "appsecret-xyz" not in shown


def test_an_empty_value_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # .env.example leaves `TELEGRAM_BOT_TOKEN=` empty: that is "no Telegram", not a token "".
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "")
    monkeypatch.setenv("WHATSAPP_PHONE_ID", "")
    settings = load_settings()
    assert not settings.telegram_enabled
    assert not settings.whatsapp_enabled


WHATSAPP_SET = {
    "WHATSAPP_PHONE_ID": "123",
    "WHATSAPP_TOKEN": "tok",
    "WHATSAPP_VERIFY_TOKEN": "verify",
    "WHATSAPP_APP_SECRET": "secret",
}


@pytest.mark.parametrize(
    "left_out",
    [
        ["WHATSAPP_PHONE_ID"],  # Meta calls it "phone number ID": the rest set, WhatsApp wanted
        ["WHATSAPP_TOKEN", "WHATSAPP_VERIFY_TOKEN", "WHATSAPP_APP_SECRET"],
        ["WHATSAPP_APP_SECRET"],
    ],
)
def test_a_half_set_up_whatsapp_names_every_missing_setting_at_once(
    monkeypatch: pytest.MonkeyPatch, left_out: list[str]
) -> None:
    for key, value in WHATSAPP_SET.items():
        if key not in left_out:
            monkeypatch.setenv(key, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    missing = str(info.value).split(" missing", 1)[0]
    assert [name for name in WHATSAPP_SET if name in missing] == left_out


def test_whatsapp_without_app_secret_only_in_insecure_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in WHATSAPP_SET.items():
        if key != "WHATSAPP_APP_SECRET":
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("WHATSAPP_INSECURE_DEV", "1")
    assert load_settings().whatsapp_enabled


def test_a_malformed_telegram_token_is_refused_without_showing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "my secret token")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.setting == "TELEGRAM_BOT_TOKEN"
    assert "my secret token" not in str(info.value)
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw")
    assert load_settings().telegram_enabled


def test_the_attachments_folder_defaults_to_the_outbox_and_never_holds_data_dir(
    tmp_path: Path,
) -> None:
    assert load_settings(data_dir=tmp_path).outbox_dir == tmp_path / "outbox"
    assert load_settings(data_dir=tmp_path, attachments_dir=tmp_path / "files").outbox_dir == (
        tmp_path / "files"
    )
    for folder in (tmp_path, tmp_path.parent):
        with pytest.raises(ConfigurationError, match="ATTACHMENTS_DIR must not be DATA_DIR"):
            load_settings(data_dir=tmp_path, attachments_dir=folder)
    with pytest.raises(ConfigurationError, match="SQLite database"):
        load_settings(
            data_dir=tmp_path / "data",
            attachments_dir=tmp_path / "shared",
            database_url=f"sqlite:///{tmp_path}/shared/chatflow.db",
        )


def test_media_settings_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCUMENT_TIMEOUT_SECONDS", "7.5")
    monkeypatch.setenv("WHATSAPP_MEDIA_HOSTS", "media.example.com, http://127.0.0.1:8081")
    settings = load_settings()
    assert settings.document_timeout_seconds == 7.5
    assert settings.whatsapp_media_hosts == frozenset(
        {"media.example.com", "http://127.0.0.1:8081"}
    )
    monkeypatch.setenv("DOCUMENT_TIMEOUT_SECONDS", "0")
    with pytest.raises(ConfigurationError, match="DOCUMENT_TIMEOUT_SECONDS"):
        load_settings()
