"""Hashing, session keys, path safety and the installation secret."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import stat
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bot.core import paths
from bot.errors import ConfigurationError
from bot.gateway import keys
from bot.gateway.events import SessionSource
from bot.gateway.keys import (
    build_session_key,
    hash_chat_id,
    hash_id,
    hash_sender_id,
    is_path_unsafe,
    is_session_key_unsafe,
    load_or_create_secret,
    log_ref,
    session_id_for,
)

SECRET = bytes(range(32))
HEX12 = re.compile(r"[0-9a-f]{12}")
ids = st.text(min_size=1, max_size=40)
secrets_ = st.binary(min_size=1, max_size=64)


# -- hashing ------------------------------------------------------------------


def test_hash_id_matches_the_seeds_formula() -> None:
    assert hash_id("12345") == hashlib.sha256(b"12345").hexdigest()[:12]
    assert hash_id("12345", SECRET) == hmac.new(SECRET, b"12345", "sha256").hexdigest()[:12]


@given(value=ids, secret=st.none() | secrets_)
def test_hash_id_is_stable_and_12_hex(value: str, secret: bytes | None) -> None:
    first = hash_id(value, secret)
    assert HEX12.fullmatch(first)
    assert hash_id(value, secret) == first


@given(value=ids, secret=secrets_)
def test_keyed_hash_differs_from_plain(value: str, secret: bytes) -> None:
    # 48 bits each: an accidental collision would take ~2**24 tries.
    assert hash_id(value, secret) != hash_id(value)


@given(value=ids, secret=st.none() | secrets_)
def test_sender_and_chat_prefixes(value: str, secret: bytes | None) -> None:
    assert hash_sender_id(value, secret) == f"user_{hash_id(value, secret)}"
    assert hash_chat_id(value, secret) == f"chat_{hash_id(value, secret)}"


def test_log_ref_is_prefixed_unkeyed_hash_without_the_raw_id() -> None:
    # Meta's documented sample wamid: base64 around the sender's number 16505076520.
    wamid = "wamid.HBgLMTY1MDUwNzY1MjAVAgARGBI5QTNDQTVCM0Q0Q0Q2RTY3RTcA"
    ref = log_ref(wamid)
    assert ref == f"msg_{hash_id(wamid)}"
    assert log_ref("16505076520", "user") == f"user_{hash_id('16505076520')}"
    for raw in (wamid, wamid.removeprefix("wamid."), "16505076520", "MTY1MDUwNzY1"):
        assert raw not in ref
    assert "log_ref" in keys.__all__


@given(value=ids)
def test_log_ref_is_stable_and_12_hex(value: str) -> None:
    prefix, _, digest = log_ref(value).partition("_")
    assert prefix == "msg"
    assert HEX12.fullmatch(digest)
    assert log_ref(value) == log_ref(value)


def test_keys_reexports_the_path_checks() -> None:
    assert keys.is_path_unsafe is paths.is_path_unsafe
    assert keys.is_session_key_unsafe is paths.is_session_key_unsafe
    assert {"is_path_unsafe", "is_session_key_unsafe"} <= set(keys.__all__)


# -- session keys ---------------------------------------------------------------


def _source(**kw: object) -> SessionSource:
    base: dict[str, object] = {
        "platform": "telegram",
        "chat_id": "-100123",
        "chat_type": "group",
        "sender_id": "42",
    }
    base.update(kw)
    return SessionSource(**base)  # type: ignore[arg-type]


CHAT = hash_chat_id("-100123", SECRET)
USER = hash_sender_id("42", SECRET)


@pytest.mark.parametrize(
    ("source", "per_user", "expected"),
    [
        pytest.param(
            _source(chat_type="dm", chat_id="42"),
            True,
            f"agent:main:telegram:dm:{hash_chat_id('42', SECRET)}",
            id="dm",
        ),
        pytest.param(
            _source(chat_type="dm", chat_id="42", thread_id="7"),
            True,
            f"agent:main:telegram:dm:{hash_chat_id('42', SECRET)}",
            id="dm-ignores-thread",
        ),
        pytest.param(_source(), True, f"agent:main:telegram:group:{CHAT}:user:{USER}", id="group"),
        pytest.param(_source(), False, f"agent:main:telegram:group:{CHAT}", id="group-shared"),
        pytest.param(
            _source(thread_id="77"),
            True,
            f"agent:main:telegram:group:{CHAT}:topic:77",
            id="topic-shared-even-per-user",
        ),
        pytest.param(
            _source(thread_id="77"),
            False,
            f"agent:main:telegram:group:{CHAT}:topic:77",
            id="topic-shared",
        ),
        pytest.param(
            _source(chat_type="channel"),
            True,
            f"agent:main:telegram:channel:{CHAT}:user:{USER}",
            id="channel",
        ),
        pytest.param(
            _source(platform="google_chat", thread_id="spaces/AAA/threads/BBB"),
            True,
            f"agent:main:google_chat:group:{CHAT}:topic:spaces/AAA/threads/BBB",
            id="google-chat-thread-keeps-slashes",
        ),
        pytest.param(
            _source(thread_id=""),
            True,
            f"agent:main:telegram:group:{CHAT}:user:{USER}",
            id="empty-thread-is-none",
        ),
    ],
)
def test_session_key_shapes(source: SessionSource, per_user: bool, expected: str) -> None:
    assert build_session_key(source, per_user, secret=SECRET) == expected


def test_session_key_holds_no_raw_id() -> None:
    key = build_session_key(
        _source(chat_id="+5511999998888", sender_id="5511999998888"), secret=SECRET
    )
    assert "5511999998888" not in key


def test_session_key_without_secret_uses_plain_hash() -> None:
    key = build_session_key(_source(chat_type="dm", chat_id="42"))
    assert key == f"agent:main:telegram:dm:chat_{hashlib.sha256(b'42').hexdigest()[:12]}"


@pytest.mark.parametrize(
    "thread",
    [
        pytest.param("../etc", id="dotdot-start"),
        pytest.param("spaces/x/../y", id="dotdot-segment"),
        pytest.param("/abs", id="leading-slash"),
        pytest.param("\\abs", id="leading-backslash"),
        pytest.param("C:\\x", id="drive"),
        pytest.param("a\x00b", id="nul"),
        pytest.param("a\nb", id="newline"),
    ],
)
def test_unsafe_thread_ids_are_refused(thread: str) -> None:
    with pytest.raises(ValueError):
        build_session_key(_source(thread_id=thread), secret=SECRET)


@pytest.mark.parametrize(
    "platform",
    [
        pytest.param("Tele:gram", id="colon"),
        pytest.param("a/b", id="slash"),
        pytest.param("UPPER", id="upper"),
    ],
)
def test_odd_platform_names_are_refused(platform: str) -> None:
    with pytest.raises(ValueError):
        build_session_key(_source(platform=platform), secret=SECRET)


@given(
    chat=ids,
    sender=ids,
    thread=st.none() | st.text(alphabet=string.ascii_letters + string.digits + "/_-.", min_size=1),
    chat_type=st.sampled_from(["dm", "group", "channel"]),
    per_user=st.booleans(),
)
def test_built_keys_are_safe_and_ids_path_safe(
    chat: str, sender: str, thread: str | None, chat_type: str, per_user: bool
) -> None:
    source = _source(chat_id=chat, sender_id=sender, thread_id=thread, chat_type=chat_type)
    try:
        key = build_session_key(source, per_user, secret=SECRET)
    except ValueError:
        assert thread is not None and is_session_key_unsafe(thread)
        return
    assert not is_session_key_unsafe(key)
    assert key.startswith(f"agent:main:telegram:{chat_type}:chat_")
    if thread and chat_type != "dm":
        assert key.endswith(f":topic:{thread}")
    assert not is_path_unsafe(session_id_for(key))


# -- session ids -------------------------------------------------------------------


def test_session_id_formula() -> None:
    key = "agent:main:whatsapp:dm:chat_0123456789ab"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    assert session_id_for(key) == f"whatsapp-{digest}"


def test_session_id_of_google_chat_thread_key_is_path_safe() -> None:
    key = "agent:main:google_chat:group:chat_0123456789ab:topic:spaces/AAA/threads/BBB"
    sid = session_id_for(key)
    assert sid.startswith("google_chat-")
    assert not is_path_unsafe(sid)


@given(key=st.text())
def test_session_id_is_path_safe_for_any_text(key: str) -> None:
    sid = session_id_for(key)
    assert not is_path_unsafe(sid)
    assert re.fullmatch(r"[a-z0-9_]+-[0-9a-f]{16}", sid)


@given(a=st.text(), b=st.text())
def test_session_ids_differ_for_different_keys(a: str, b: str) -> None:
    if a != b:
        assert session_id_for(a) != session_id_for(b)


# -- path checks on generated strings -------------------------------------------------

safe_chars = st.text(alphabet=string.ascii_letters + string.digits + "_-:", min_size=1)


@given(prefix=st.text(max_size=10), suffix=st.text(max_size=10))
def test_dotdot_anywhere_is_path_unsafe(prefix: str, suffix: str) -> None:
    assert is_path_unsafe(prefix + ".." + suffix)


@given(prefix=safe_chars, suffix=safe_chars, sep=st.sampled_from(["/", "\\"]))
def test_separators_are_path_unsafe_but_interior_slash_is_a_fine_key(
    prefix: str, suffix: str, sep: str
) -> None:
    assert is_path_unsafe(prefix + sep + suffix)
    if sep == "/" and not (len(prefix) >= 2 and prefix[0].isalpha() and prefix[1] == ":"):
        assert not is_session_key_unsafe(prefix + sep + suffix)


@given(
    value=st.text(max_size=20),
    control=st.characters(categories=["Cc"]),
    at=st.integers(min_value=0, max_value=20),
)
def test_control_characters_are_unsafe_for_both(value: str, control: str, at: int) -> None:
    text = value[:at] + control + value[at:]
    assert is_path_unsafe(text)
    assert is_session_key_unsafe(text)


@given(letter=st.sampled_from(string.ascii_letters), rest=st.text(max_size=10))
def test_drive_letters_are_unsafe_for_both(letter: str, rest: str) -> None:
    assert is_path_unsafe(f"{letter}:{rest}")
    assert is_session_key_unsafe(f"{letter}:{rest}")


@given(segments=st.lists(safe_chars, min_size=1, max_size=4), at=st.integers(0, 4))
def test_dotdot_segment_is_key_unsafe(segments: list[str], at: int) -> None:
    parts = [*segments[:at], "..", *segments[at:]]
    assert is_session_key_unsafe("/".join(parts))
    assert is_session_key_unsafe("x/" + "/".join(parts))


@given(rest=safe_chars, sep=st.sampled_from(["/", "\\"]))
def test_leading_separator_is_key_unsafe(rest: str, sep: str) -> None:
    assert is_session_key_unsafe(sep + rest)


def test_google_chat_style_key_is_a_safe_key() -> None:
    key = "agent:main:google_chat:group:spaces/AAAA/threads/BBBB"
    assert not is_session_key_unsafe(key)
    assert is_path_unsafe(key)


# -- the installation secret ------------------------------------------------------------


def test_secret_is_created_0600_and_reused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = load_or_create_secret(data)
    path = data / "secret.key"
    assert len(first) == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() == first.hex()
    assert load_or_create_secret(data) == first
    assert [p.name for p in data.iterdir()] == ["secret.key"]  # no temp file left


def test_two_installations_get_different_secrets(tmp_path: Path) -> None:
    assert load_or_create_secret(tmp_path / "a") != load_or_create_secret(tmp_path / "b")


def test_loose_permissions_are_tightened_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = load_or_create_secret(tmp_path)
    path = tmp_path / "secret.key"
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger="bot.gateway.keys"):
        assert load_or_create_secret(tmp_path) == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert any(r.levelno == logging.WARNING for r in caplog.records)
    assert secret.hex() not in caplog.text


def test_secret_value_is_never_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        secret = load_or_create_secret(tmp_path)
    assert secret.hex() not in caplog.text


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("", id="empty"),
        pytest.param("not hex at all", id="garbage"),
        pytest.param("abcd", id="too-short"),
    ],
)
def test_a_damaged_secret_file_stops_start_up(tmp_path: Path, content: str) -> None:
    path = tmp_path / "secret.key"
    path.write_text(content)
    os.chmod(path, 0o600)
    with pytest.raises(ConfigurationError) as info:
        load_or_create_secret(tmp_path)
    assert info.value.setting == "DATA_DIR"
    assert path.read_text() == content  # never overwritten


def test_losing_the_creation_race_uses_the_winners_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    winner = os.urandom(32)
    real_link = os.link

    def link_after_rival(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        Path(dst).write_text(winner.hex())
        os.chmod(dst, 0o600)
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link_after_rival)
    assert load_or_create_secret(tmp_path) == winner
    assert [p.name for p in tmp_path.iterdir()] == ["secret.key"]


def test_without_hard_links_the_secret_is_created_exclusively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(src: object, dst: object) -> None:
        raise OSError("operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    secret = load_or_create_secret(tmp_path)
    assert load_or_create_secret(tmp_path) == secret
    assert stat.S_IMODE((tmp_path / "secret.key").stat().st_mode) == 0o600
