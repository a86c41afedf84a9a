"""The console behind a TLS-terminating reverse proxy on another host, with the real bot.

The proxy's address is named in ``.env`` (``FORWARDED_ALLOW_IPS``), the way an
operator configures it. Clients bound to 127.0.0.2 stand for that proxy, and
clients bound to 127.0.0.3 for a peer that is not trusted (Linux routes all of
127/8 to the loopback interface).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from bot.console.auth import MAX_FAILURES
from tests.e2e.botprocess import BotProcess

pytestmark = pytest.mark.e2e

TOKEN = "proxy-test-console-token-0123456789"
PROXY, STRANGER = "127.0.0.2", "127.0.0.3"
OPERATOR, ATTACKER = "203.0.113.7", "198.51.100.9"


@asynccontextmanager
async def client_from(bot: BotProcess, address: str) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.AsyncHTTPTransport(local_address=address)
    async with httpx.AsyncClient(transport=transport, base_url=bot.url) as client:
        yield client


async def test_behind_a_trusted_proxy_the_console_sees_https_and_the_real_client(
    tmp_path: Path,
) -> None:
    (tmp_path / ".env").write_text(f"FORWARDED_ALLOW_IPS={PROXY}\n")
    bot = BotProcess(tmp_path / "data", {"CONSOLE_TOKEN": TOKEN})
    await bot.start()
    try:
        async with client_from(bot, PROXY) as proxy, client_from(bot, STRANGER) as stranger:
            via_tls = {"X-Forwarded-Proto": "https", "X-Forwarded-For": OPERATOR}
            signed_in = await proxy.post("/console/login", data={"token": TOKEN}, headers=via_tls)
            assert signed_in.status_code == 303
            assert signed_in.headers["set-cookie"].endswith("; Secure")
            # The same headers from a peer that is not the proxy are not believed.
            spoofed = await stranger.post("/console/login", data={"token": TOKEN}, headers=via_tls)
            assert spoofed.status_code == 303 and "Secure" not in spoofed.headers["set-cookie"]

            # Wrong tokens count against the client behind the proxy, not the proxy.
            for _ in range(MAX_FAILURES + 1):
                guess = await proxy.get(
                    "/console/api/ledger",
                    headers={"Authorization": "Bearer wrong", "X-Forwarded-For": ATTACKER},
                )
            assert guess.status_code == 429
            typo = await proxy.get(
                "/console/api/ledger",
                headers={"Authorization": "Bearer typo", "X-Forwarded-For": OPERATOR},
            )
            assert typo.status_code == 401
            right = await proxy.get(
                "/console/api/ledger",
                headers={"Authorization": f"Bearer {TOKEN}", "X-Forwarded-For": ATTACKER},
            )
            assert right.status_code == 200 and "counts" in right.json()
    finally:
        assert await bot.stop() == 0
    # N5: with the web chat on, the terminal prompt is gone: the banner says so.
    assert any(
        line.startswith("Terminal chat off") and "run --console" in line for line in bot.log
    ), bot.log
