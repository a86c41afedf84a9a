"""Proof, hostile input: forged, malformed, oversized and odd requests get their documented answer.

Rejected requests (bad or missing signatures, a wrong verify token, bodies
that are not JSON, truncated, nested 100 000 deep, 10 MB, not UTF-8; Telegram
webhook calls without the secret) must get their status code and change
nothing: the table counts of the database and the replies on the fakes stay
as they were. Requests that are valid but odd (another phone number id,
unknown types, malformed items, statuses for unknown messages) are answered
200 and start no turn. Odd messages (100 000 characters, control characters,
RTL and emoji, a lone surrogate, ids shaped like paths) are answered with
their documented reply, replies longer than a platform's limit are split
without breaking a character, no file appears outside the data directory, and
the logs carry no raw phone number, user id or message text.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import re
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bot.core.paths import is_path_unsafe, is_session_key_unsafe
from bot.gateway.gateway import Replies
from bot.platforms.text import utf16_len
from tests.e2e import proof_report
from tests.e2e.botprocess import BotProcess
from tests.e2e.proof_world import (
    APP_SECRET,
    FULL,
    LONG_UNIT,
    VERIFY_TOKEN,
    Inbound,
    Reply,
    World,
    log_leaks,
    read_database,
    telegram_update,
)
from tests.fakes.whatsapp_webhook import sign

pytestmark = pytest.mark.e2e

TG_SECRET = "proof-telegram-webhook-secret"
BIG = 10 * 1024 * 1024
PADS = (0, 3, 5, 8, 11, 14, 17) if FULL else (0, 5, 11)
PATH_IDS = ("../../etc/passwd", "C:\\x", "..\\..\\boot.ini", "/etc/shadow", "a\x00b")
ODD_TEXT = {
    "control characters": "\x00\x01\x07\x1b[31m\x7f\u0085\u202e\u200b\ufeff end",
    "RTL and emoji": "שלום مرحبا 👨\u200d👩\u200d👧\u200d👦 🇪🇸 e\u0301 👍🏽 end",
    "lone surrogate": "before \ud800 after",
}
ALLOWED_FILES = {"chatflow.db", "chatflow.db-wal", "chatflow.db-shm", "chatflow.lock", "secret.key"}


class Tally:
    """What was tried, and whether it got its documented answer."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str, str]] = []
        self.failures: list[str] = []

    def check(self, platform: str, case: str, expected: str, got: str, kind: str) -> None:
        """Record one outcome; ``kind``: rejected, ignored, answered or delivery."""
        self.rows.append((platform, case, expected, got, kind))
        if expected != got:
            self.failures.append(f"{platform} {case}: expected {expected}, got {got}")


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _signed(body: bytes, secret: str = APP_SECRET) -> dict[str, str]:
    return {"Content-Type": "application/json", "X-Hub-Signature-256": sign(body, secret)}


async def _counts(bot: BotProcess) -> dict[str, int]:
    db = await asyncio.to_thread(read_database, bot.data_dir / "chatflow.db")
    return db.tables


class Rejections:
    """Posts requests that must change nothing and checks that they did not."""

    def __init__(self, world: World, bot: BotProcess, tally: Tally, platform: str) -> None:
        self.world, self.bot, self.tally, self.platform = world, bot, tally, platform

    async def expect(
        self,
        case: str,
        expected_status: int,
        send: Callable[[httpx.AsyncClient], Any],
        *,
        body_check: Callable[[httpx.Response], bool] | None = None,
    ) -> None:
        before = await _counts(self.bot)
        replies = len(self.world.replies())
        async with httpx.AsyncClient(timeout=30) as client:
            began = time.monotonic()
            response = await send(client)
            took = time.monotonic() - began
        got = str(response.status_code)
        if body_check is not None and not body_check(response):
            got += " (wrong body)"
        if took > 5:
            got += f" (after {took:.1f} s)"
        kind = "rejected" if expected_status >= 400 else "ignored"
        self.tally.check(self.platform, case, str(expected_status), got, kind)
        # tx 1 (dedup claim + inbox row) commits before any 200, so a request wrongly
        # accepted shows in the tables by now; a reply could only follow from it.
        if await _counts(self.bot) != before or len(self.world.replies()) != replies:
            self.tally.failures.append(f"{self.platform} {case}: something was stored or sent")


async def _whatsapp_rejections(world: World, bot: BotProcess, tally: Tally) -> int:
    sender = world.sender(bot)
    url = sender.url
    r = Rejections(world, bot, tally, "whatsapp")
    body = sender.encode(sender.text("Qhx000N000 forged", wa_id="4915557000000"))
    other = sender.encode(sender.text("Qhx000N001 other", wa_id="4915557000000"))

    def post(data: bytes, headers: dict[str, str]) -> Callable[[httpx.AsyncClient], Any]:
        return lambda client: client.post(url, content=data, headers=headers)

    plain = {"Content-Type": "application/json"}
    sha1 = "sha1=" + hmac.new(APP_SECRET.encode(), body, hashlib.sha1).hexdigest()
    await r.expect("no signature", 401, post(body, plain))
    await r.expect("signature with another secret", 403, post(body, _signed(body, "wrong")))
    await r.expect("signature of another body", 403, post(body, _signed(other)))
    await r.expect("sha1 signature", 403, post(body, {**plain, "X-Hub-Signature-256": sha1}))
    await r.expect("empty signature", 403, post(body, {**plain, "X-Hub-Signature-256": "sha256="}))
    await r.expect(
        "signature not hex", 403, post(body, {**plain, "X-Hub-Signature-256": "sha256=" + "z" * 64})
    )
    for case, data in (
        ("body not JSON", b"hello"),
        ("truncated JSON", body[: len(body) // 2]),
        ("JSON array", b"[]"),
        ("JSON string", b'"whatsapp_business_account"'),
        ("body not UTF-8", b'{"object": "\xff\xfe"}'),
        ("JSON nested 100000 deep", b"[" * 100_000 + b"]" * 100_000),
        ("empty body", b""),
    ):
        await r.expect(case, 400, post(data, _signed(data)))
    big_junk = b"x" * BIG
    await r.expect("10 MB body, unsigned", 413, post(big_junk, plain))
    big_json = sender.encode(sender.text("Qhx000N002 " + "y" * BIG, wa_id="4915557000000"))
    await r.expect("10 MB body, signed", 413, post(big_json, _signed(big_json)))

    # Valid requests that must start nothing.
    ignored: list[tuple[str, Any]] = []
    page = sender.text("Qhx000N003 page", wa_id="4915557000000")
    page["object"] = "page"
    ignored.append(("object is not whatsapp_business_account", page))
    ignored.append(
        (
            "update for another phone number id",
            sender.envelope(
                [
                    [
                        sender.value(
                            [sender.message("text", {"body": "Qhx000N004"}, wa_id="4915557000001")],
                            phone_number_id="999999999999999",
                        )
                    ]
                ]
            ),
        )
    )
    ignored.append(("entry is null", {"object": "whatsapp_business_account", "entry": None}))
    ignored.append(
        (
            "changes is a string",
            {"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": "x"}]},
        )
    )
    base = sender.text("Qhx000N005 odd", wa_id="4915557000002")
    for case, mutate in (
        ("messages is an object", lambda v: v.update(messages={"id": "x"})),
        ("message without id", lambda v: v["messages"][0].pop("id")),
        ("message without sender", lambda v: (v["messages"][0].pop("from"), v.pop("contacts"))),
        ("text body is an object", lambda v: v["messages"][0].update(text={"body": {"x": 1}})),
        ("text is a list", lambda v: v["messages"][0].update(text=["Qhx000N007"])),
        ("field is not messages", lambda v: None),
    ):
        payload = json.loads(json.dumps(base))
        payload["entry"][0]["changes"][0]["value"]["messages"][0]["id"] = world.next_wamid()
        mutate(payload["entry"][0]["changes"][0]["value"])
        if case == "field is not messages":
            payload["entry"][0]["changes"][0]["field"] = "account_update"
        ignored.append((case, payload))
    ignored.append(("status for an unknown message", sender.status("wamid.unknown", "failed")))
    ignored.append(("status delivered", sender.status("wamid.unknown2", "delivered")))
    ignored.append(("reaction", sender.reaction("wamid.unknown3")))
    ignored.append(("edit", sender.edit("wamid.unknown4", "Qhx000N006 edited")))
    ignored.append(("revoke", sender.revoke("wamid.unknown5")))
    for case, payload in ignored:
        data = sender.encode(payload)
        await r.expect(case, 200, post(data, _signed(data)))

    # The verification handshake.
    def get(**params: str) -> Callable[[httpx.AsyncClient], Any]:
        return lambda client: client.get(url, params=params)

    await r.expect(
        "verify: wrong token",
        403,
        get(**{"hub.mode": "subscribe", "hub.verify_token": "nope", "hub.challenge": "1"}),
    )
    await r.expect(
        "verify: wrong mode",
        403,
        get(**{"hub.mode": "unsubscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "1"}),
    )
    await r.expect("verify: no token", 403, get(**{"hub.mode": "subscribe", "hub.challenge": "1"}))
    await r.expect(
        "verify: no challenge",
        400,
        get(**{"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN}),
    )
    await r.expect(
        "verify: right token",
        200,
        get(**{"hub.mode": "subscribe", "hub.verify_token": VERIFY_TOKEN, "hub.challenge": "8c1"}),
        body_check=lambda response: response.text == "8c1",
    )
    return len(tally.rows)


def _is_regional(ch: str) -> bool:
    return "\U0001f1e6" <= ch <= "\U0001f1ff"


def _broken_at(left: str, right: str) -> bool:
    """Whether cutting between ``left`` and ``right`` splits a character the user sees."""
    if left.endswith("\u200d") or not right:
        return True
    first = right[0]
    if first == "\u200d" or "\ufe00" <= first <= "\ufe0f" or "\U0001f3fb" <= first <= "\U0001f3ff":
        return True
    if unicodedata.category(first) in ("Mn", "Mc", "Me"):
        return True
    run = len(left) - len(left.rstrip("".join(map(chr, range(0x1F1E6, 0x1F200)))))
    return _is_regional(first) and run % 2 == 1


def _long_parts_ok(parts: list[Reply], pad: int, limit_len: Callable[[str], int]) -> str:
    """'ok' when the parts fit, keep every character whole and add up to the reply."""
    texts = [p.text for p in parts]
    if len(texts) < 2:
        return f"{len(texts)} part(s)"
    if any(limit_len(t) > 4096 for t in texts):
        return "a part over the limit"
    if any(_broken_at(left, right) for left, right in itertools.pairwise(texts)):
        return "a character broken at a cut"
    joined = re.sub(r"\s", "", "".join(texts))
    if not joined.endswith("x" * pad + LONG_UNIT * 400):
        return "parts do not add up to the reply"
    return "ok"


@pytest.mark.timeout(300 if FULL else 120)
async def test_proof_hostile_input_gets_documented_answers(tmp_path: Path) -> None:
    started = time.monotonic()
    tally = Tally()
    replies = Replies()
    async with World(tmp_path) as world:
        bot = world.bot()
        await bot.start()
        files_before = _files(tmp_path)
        await _whatsapp_rejections(world, bot, tally)

        # -- odd but valid WhatsApp messages: each in its own conversation -----------
        sender = world.sender(bot)
        expected: dict[str, tuple[Inbound, str]] = {}

        async def wa(case: str, text: str, **kwargs: Any) -> Inbound:
            payload = sender.text(text, **kwargs)
            message = payload["entry"][0]["changes"][0]["value"]["messages"][0]
            inbound = Inbound(
                "whatsapp",
                str(message.get("group_id") or message["from"]),
                str(message["id"]),
                str(message["id"]),
                text,
                case,
            )
            world.inbound.append(inbound)
            response = await sender.post_one(payload)
            tally.check("whatsapp", case, "200", str(response.status_code), "delivery")
            return inbound

        n = 100
        huge = "Qhx100N000 " + "z" * 100_000
        expected["whatsapp 100 000 characters"] = (
            await wa("100 000 characters", huge, wa_id=f"49155571{n:05d}"),
            replies.too_long,
        )
        for case, odd in ODD_TEXT.items():
            n += 1
            text = f"Qhx{n}N000 {odd}"
            expected[f"whatsapp {case}"] = (
                await wa(case, text, wa_id=f"49155571{n:05d}"),
                "normal",
            )
        for value in PATH_IDS:
            n += 1
            expected[f"whatsapp sender id {value!r}"] = (
                await wa(f"sender id {value!r}", f"Qhx{n}N000 path sender", wa_id=value),
                "normal",
            )
            n += 1
            expected[f"whatsapp message id {value!r}"] = (
                await wa(
                    f"message id {value!r}",
                    f"Qhx{n}N000 path wamid",
                    wa_id=f"49155571{n:05d}",
                    wamid=value,
                ),
                "normal",
            )
        n += 1
        group = await wa(
            "group id '../../etc/passwd'",
            f"Qhx{n}N000 @{sender.display_phone_number} path group",
            wa_id=f"49155571{n:05d}",
            group_id="../../etc/group",
        )
        expected["whatsapp group id"] = (group, "normal")
        n += 1
        unsupported = sender.unsupported()
        unsupported["entry"][0]["changes"][0]["value"]["messages"][0]["from"] = f"49155571{n:05d}"
        msg = unsupported["entry"][0]["changes"][0]["value"]["messages"][0]
        world.inbound.append(
            Inbound("whatsapp", msg["from"], msg["id"], msg["id"], "", "unsupported")
        )
        response = await sender.post_one(unsupported)
        tally.check(
            "whatsapp", "unsupported message type", "200", str(response.status_code), "delivery"
        )
        expected["whatsapp unsupported type"] = (world.inbound[-1], replies.media_only)
        long_chats: dict[tuple[str, str], int] = {}
        for pad in PADS:
            n += 1
            wa_id = f"49155571{n:05d}"
            await wa(f"reply cut at offset {pad}", f"Qhx{n}N000 !long:{pad}", wa_id=wa_id)
            long_chats[("whatsapp", wa_id)] = pad

        # -- Telegram updates, odd ones between ordinary ones ---------------------------
        chat = 4646000000
        odd_updates: list[tuple[str, dict[str, Any]]] = [
            ("callback query", {"callback_query": {"id": "1", "from": {"id": 1}}}),
            ("edited message", {"edited_message": telegram_update(chat, 1, "edit")["message"]}),
            ("chat member update", {"my_chat_member": {"chat": {"id": chat}}}),
            ("update type from the future", {"future_update": {"x": 1}}),
            ("message without chat", {"message": {"message_id": 5, "text": "Qhx900N000 x"}}),
            ("message is a string", {"message": "Qhx900N001"}),
            (
                "mention entity out of range",
                telegram_update(
                    chat + 1,
                    7,
                    "Qhx901N000 entity",
                    entities=[{"type": "mention", "offset": 500, "length": 30}],
                ),
            ),
        ]
        tg_expected: dict[str, tuple[Inbound, str]] = {}
        for index, (case, update) in enumerate(odd_updates):
            world.telegram.push_update(update)
            ordinary = world.telegram_text(
                chat + 10 + index, f"Qhx91{index}N000 after {case}", f"after {case}"
            )
            tg_expected[f"telegram ordinary message after: {case}"] = (ordinary, "normal")
        entity_inbound = Inbound(
            "telegram", str(chat + 1), f"telegram:{chat + 1}:7", "7", "Qhx901N000 entity", "entity"
        )
        world.inbound.append(entity_inbound)
        tg_expected["telegram mention entity out of range"] = (entity_inbound, "normal")
        tg_expected["telegram 100 000 characters"] = (
            world.telegram_text(chat + 50, "Qhx950N000 " + "z" * 100_000, "huge"),
            replies.too_long,
        )
        for index, (case, odd) in enumerate(ODD_TEXT.items()):
            tg_expected[f"telegram {case}"] = (
                world.telegram_text(chat + 60 + index, f"Qhx96{index}N000 {odd}", case),
                "normal",
            )
        for index, pad in enumerate(PADS):
            world.telegram_text(chat + 70 + index, f"Qhx97{index}N000 !long:{pad}", "long")
            long_chats[("telegram", str(chat + 70 + index))] = pad

        checked = {**expected, **tg_expected}
        missing = await world.wait_answered([i for i, _ in checked.values()], within=60, settle=bot)
        assert missing == [], [i.session for i in missing]
        # Long replies are sent in parts, one second apart on WhatsApp.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            parts = [r for r in world.replies() if (r.platform, r.chat_id) in long_chats]
            if len(parts) >= 2 * len(long_chats) and await asyncio.to_thread(
                lambda: _settled_now(bot)
            ):
                break
            await asyncio.sleep(0.2)
        async with httpx.AsyncClient(timeout=10) as client:
            health = (await client.get(f"{bot.url}/healthz")).status_code
        assert await bot.stop() == 0
        grouped = world.replies_to(world.inbound)
        all_replies = world.replies()
        db = read_database(bot.data_dir / "chatflow.db")
        model_calls = dict(world.model.calls)
        files_after = _files(tmp_path)

        # -- Telegram in webhook mode --------------------------------------------------
        hook_bot = world.bot(
            "hook",
            TELEGRAM_WEBHOOK_URL="https://bot.example.invalid/webhooks/telegram",
            TELEGRAM_WEBHOOK_SECRET=TG_SECRET,
            # WhatsApp off: all four unset (one left set would be "half set up").
            WHATSAPP_PHONE_ID="",
            WHATSAPP_TOKEN="",
            WHATSAPP_VERIFY_TOKEN="",
            WHATSAPP_APP_SECRET="",
        )
        await hook_bot.start()
        hook_url = f"{hook_bot.url}/webhooks/telegram"
        r = Rejections(world, hook_bot, tally, "telegram webhook")
        good = json.dumps({"update_id": 1, **telegram_update(chat + 99, 1, "Qhx999N000 hi")})
        secret = {"X-Telegram-Bot-Api-Secret-Token": TG_SECRET}

        def tg_post(
            data: bytes | str, headers: dict[str, str]
        ) -> Callable[[httpx.AsyncClient], Any]:
            return lambda client: client.post(hook_url, content=data, headers=headers)

        await r.expect("no secret token", 403, tg_post(good, {}))
        await r.expect(
            "wrong secret token", 403, tg_post(good, {"X-Telegram-Bot-Api-Secret-Token": "x"})
        )
        await r.expect("10 MB body, no secret", 403, tg_post(b"x" * BIG, {}))
        for case, data in (
            ("body not JSON", b"hello"),
            ("JSON array", b"[]"),
            ("no update_id", b'{"message": {}}'),
            ("update_id is a string", b'{"update_id": "1"}'),
            ("JSON nested 100000 deep", b"[" * 100_000 + b"]" * 100_000),
            ("body not UTF-8", b'{"update_id": 1, "x": "\xff"}'),
        ):
            await r.expect(case, 400, tg_post(data, secret))
        await r.expect(
            "unknown update type",
            200,
            tg_post(json.dumps({"update_id": 2, "future_update": {"x": 1}}), secret),
        )
        async with httpx.AsyncClient(timeout=10) as client:
            accepted = await client.post(hook_url, content=good, headers=secret)
        tally.check(
            "telegram webhook", "valid update", "200", str(accepted.status_code), "delivery"
        )
        await world.telegram.wait_for_sent(len(world.telegram.sent) + 1, within=20)
        assert await hook_bot.stop() == 0
        logs = [*bot.log, *hook_bot.log]

    # -- verdicts ------------------------------------------------------------------------
    for case, (inbound, want) in checked.items():
        platform, what = case.split(" ", 1)
        got = grouped[inbound]
        if len(got) != 1:
            tally.check(platform, what, f"1 reply ({want})", f"{len(got)} replies", "answered")
            continue
        content = got[0].content
        if want == "normal":
            ok = content.startswith(f"R{inbound.token} ")
            got_text = "normal answer" if ok else content[:40]
            tally.check(platform, what, "normal answer", got_text, "answered")
        else:
            tally.check(
                platform, what, f"reply {want[:30]!r}", f"reply {content[:30]!r}", "answered"
            )
            if want == replies.too_long and model_calls.get(inbound.token or "", 0):
                tally.failures.append(f"{case}: the 100 000 characters reached the model")
    for (platform, chat_id), pad in long_chats.items():
        parts = [r for r in all_replies if r.platform == platform and r.chat_id == chat_id]
        measure = utf16_len if platform == "telegram" else len
        verdict = _long_parts_ok(parts, pad, measure)
        tally.check(
            platform, f"reply of 7 200 characters cut at offset {pad}", "ok", verdict, "answered"
        )
    for session_id, key in db.session_keys.items():
        if is_path_unsafe(session_id) or is_session_key_unsafe(key):
            tally.failures.append(f"unsafe session id or key: {session_id!r} / {key!r}")
    odd_chat_replies = [r for r in all_replies if r.chat_id == str(chat)]
    if odd_chat_replies:
        tally.failures.append(f"odd Telegram updates were answered: {odd_chat_replies}")
    new_files = {f for f in files_after - files_before if Path(f).name not in ALLOWED_FILES}
    if new_files:
        tally.failures.append(f"files appeared: {sorted(new_files)}")
    if health != 200:
        tally.failures.append(f"/healthz answered {health} after the hostile input")
    secrets = {i.chat_id for i in world.inbound if i.chat_id} | {
        i.text[:40] for i in world.inbound if i.text
    }
    secrets |= {"4915557000000", "Qhx999N000", "z" * 50, *(t for t in ODD_TEXT.values())}
    leaks = log_leaks(logs, secrets)
    assert tally.failures == [], "\n".join(tally.failures)
    assert leaks == [], leaks

    def count(kind: str) -> int:
        return sum(1 for row in tally.rows if row[4] == kind)

    shown = [row for row in tally.rows if row[4] != "delivery"]
    proof_report.record(
        "hostile",
        {
            "hostile inputs tried": len(shown),
            "rejected with their status code (400/401/403/413), nothing stored": count("rejected"),
            "accepted and ignored (200, no turn, nothing stored)": count("ignored"),
            "odd messages and long replies handled as documented": count("answered"),
            "files created outside the data directory": 0,
            "unsafe session ids or keys": 0,
            "crashes (SIGTERM exit code 0, /healthz 200 afterwards)": 0,
            "log lines with raw ids or message text": len(leaks),
        },
        details=[
            "Every odd message was accepted with 200 before its answer was checked.",
            "",
            "| platform | input | documented answer | got |",
            "|---|---|---|---|",
            *(f"| {p} | {c.replace('|', '/')} | {e} | {g} |" for p, c, e, g, _ in shown),
        ],
        seconds=time.monotonic() - started,
        about=__doc__,
    )


def _settled_now(bot: BotProcess) -> bool:
    db = read_database(bot.data_dir / "chatflow.db")
    return not any(
        state in ("pending", "attempting", "failed")
        for rows in db.obligations.values()
        for _, state, _ in rows
    )
