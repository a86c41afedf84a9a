"""Live views: a Server-Sent Events stream that says when a transcript changed.

The stream sends ``event: changed`` when the session's version (every save
bumps it), its takeover state or one of its ledger rows moved; the page then
fetches the rendered messages again (``console.js``). It polls the database
with read-only queries, so it works whichever process wrote the change, and
adds nothing to a message's path. A stream ends after ``STREAM_SECONDS``; the
browser reconnects by itself (``retry``), which also bounds a shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

from starlette.responses import StreamingResponse

from bot.console.queries import recent_changes
from bot.core.stores.base import TransactionalStore
from bot.errors import ChatflowError

__all__ = ["CHANGED", "POLL_SECONDS", "STREAM_SECONDS", "transcript_stream"]

logger = logging.getLogger(__name__)

POLL_SECONDS: Final = 1.0
"""How often an open transcript looks for changes."""
STREAM_SECONDS: Final = 55.0
"""How long one stream lasts before the browser reconnects."""
_KEEPALIVE_SECONDS: Final = 15.0
CHANGED: Final = "event: changed\ndata: {}\n\n"
"""The event that tells the page to fetch the messages again."""


async def _changes(
    store: TransactionalStore, session_id: str, *, poll: float, lifetime: float
) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    end = loop.time() + lifetime
    since = time.time() - 1.0
    newest: Any = None

    async def fingerprint() -> tuple[Any, ...]:
        nonlocal since, newest
        started = time.time()
        version, taken, owed = await recent_changes(store, session_id, since)
        if owed[0]:
            newest = owed[1]
        # A little overlap: a row updated in the same instant as the read is seen next time.
        since = started - 1.0
        return (version, taken, newest)

    last = await fingerprint()
    # The page may have been rendered a moment before this stream began: catch up once.
    yield "retry: 1000\n\n" + CHANGED
    quiet_since = loop.time()
    while loop.time() < end:
        await asyncio.sleep(poll)
        try:
            state = await fingerprint()
        except ChatflowError as exc:
            # The database is away: end the stream; the browser reconnects.
            logger.warning("live transcript stream ended: %s", type(exc).__name__)
            return
        if state != last:
            yield CHANGED
            quiet_since = loop.time()
        elif loop.time() - quiet_since >= _KEEPALIVE_SECONDS:
            yield ": keep-alive\n\n"
            quiet_since = loop.time()
        last = state


def transcript_stream(
    store: TransactionalStore,
    session_id: str,
    *,
    poll: float = POLL_SECONDS,
    lifetime: float = STREAM_SECONDS,
) -> StreamingResponse:
    """The live stream of one transcript."""
    return StreamingResponse(
        _changes(store, session_id, poll=poll, lifetime=lifetime),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
