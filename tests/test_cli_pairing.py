"""``python -m bot pairing ...`` and the access settings, as an operator uses them."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.config import load_settings
from bot.core.stores.sqlite import SQLiteSessionStore
from bot.errors import ConfigurationError
from bot.gateway.access.pairing import Pairing
from bot.gateway.keys import load_or_create_secret
from tests.cli_inprocess import cli as _bot


async def _ask(data: Path, sender: str, *, age: timedelta = timedelta(0)) -> str:
    """A pending code for ``sender``, as the bot would have stored it ``age`` ago."""
    secret = await asyncio.to_thread(load_or_create_secret, data)
    store = SQLiteSessionStore(data / "chatflow.db")
    past = datetime.now(UTC) - age
    try:
        pairing = Pairing(store, secret=secret, ttl_seconds=3600, clock=lambda: past)
        await pairing.open()
        async with store.transaction() as tx:
            code, _ = await pairing.request_in(tx, "telegram", sender)
        return code
    finally:
        await store.close()


async def test_approve_list_and_revoke(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    code = await _ask(data, "123456789")
    listed = _bot(tmp_path, "pairing", "list")
    assert listed.returncode == 0 and code in listed.stdout and "pending" in listed.stdout
    approved = _bot(tmp_path, "pairing", "approve", code.lower())
    assert approved.returncode == 0, approved.stderr
    assert "approved telegram:user_" in approved.stdout
    again = _bot(tmp_path, "pairing", "approve", code)
    assert again.returncode == 2 and "unknown" in again.stderr  # single use
    listed = _bot(tmp_path, "pairing", "list")
    assert "approved  telegram:user_" in listed.stdout and "123456789" not in listed.stdout
    revoked = _bot(tmp_path, "pairing", "revoke", "telegram:123456789")
    assert revoked.returncode == 0
    assert _bot(tmp_path, "pairing", "revoke", "telegram:123456789").returncode == 2


async def test_an_expired_or_unknown_code_exits_non_zero(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    code = await _ask(data, "42", age=timedelta(hours=2))
    expired = _bot(tmp_path, "pairing", "approve", code)
    assert expired.returncode == 2 and "expired" in expired.stderr
    unknown = _bot(tmp_path, "pairing", "approve", "ZZZZ2222")
    assert unknown.returncode == 2 and "unknown" in unknown.stderr


def test_doctor_shows_the_access_mode(tmp_path: Path) -> None:
    result = _bot(
        tmp_path, "doctor", ACCESS_MODE="pairing", RATE_LIMIT_MESSAGES="20", ALLOWED_USERS="1"
    )
    assert "ok   access: mode pairing (codes valid 86400 s), 1 allowed users" in result.stdout
    assert "rate limit 20 messages / 60 s" in result.stdout


@pytest.mark.parametrize(
    ("env", "named"),
    [
        pytest.param({"ACCESS_MODE": "closed"}, "ACCESS_MODE", id="unknown-mode"),
        pytest.param({"ACCESS_MODE": "allowlist"}, "ACCESS_MODE", id="allowlist-without-list"),
        pytest.param(
            {"ACCESS_MODE": "open", "ALLOWED_USERS": "1"}, "ACCESS_MODE", id="open-with-a-list"
        ),
        pytest.param({"RATE_LIMIT_MESSAGES": "0"}, "RATE_LIMIT_MESSAGES", id="limit-zero"),
        pytest.param(
            {"RATE_LIMIT_WINDOW_SECONDS": "-5"}, "RATE_LIMIT_WINDOW_SECONDS", id="window-negative"
        ),
        pytest.param({"PAIRING_CODE_TTL_SECONDS": "1"}, "PAIRING_CODE_TTL_SECONDS", id="ttl-short"),
    ],
)
def test_a_wrong_access_setting_is_named(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert named in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("env", "mode"),
    [
        pytest.param({}, "open", id="default"),
        pytest.param({"ALLOWED_CHATS": "-100"}, "allowlist", id="lists-mean-allowlist"),
        pytest.param({"ACCESS_MODE": "Pairing"}, "pairing", id="pairing-any-case"),
    ],
)
def test_the_effective_mode(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], mode: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert load_settings().effective_access_mode == mode
