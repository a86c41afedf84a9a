"""Access control after tx 1: per-sender rate limits and pairing answers, before any model call.

The gateway journals a message first (tx 1), so a platform's redelivery is a
duplicate whatever happens next. Then ``screen`` decides, in one transaction,
whether it starts a turn: it counts the message against its sender
(``RateLimits``) and, for a message over the limit or from a stranger in
``ACCESS_MODE=pairing``, closes the inbox row and records the answer owed (the
once-per-window notice, or the pairing code) in the delivery ledger. That
answer goes out through the sender's lane like any owed reply, and is resent
after a crash like any owed reply. A message that is screened out never
occupies a worker or a queue slot, so a flood cannot crowd out other senders.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final

from bot.config import Settings
from bot.core.sql import Transaction
from bot.errors import ChatflowError
from bot.gateway.access.gate import Admission
from bot.gateway.access.pairing import Pairing
from bot.gateway.access.rate_limits import RateLimits
from bot.gateway.contract import MessageEvent
from bot.gateway.inbox import InboxEntry
from bot.gateway.ledger.obligations import Obligation
from bot.gateway.turns import Turns

if TYPE_CHECKING:
    from bot.gateway.accounting import TokenAccounting

__all__ = [
    "NOT_ADMITTED_ERROR",
    "OVER_BUDGET_ERROR",
    "PAIRING_ERROR",
    "RATE_LIMITED_ERROR",
    "AccessControl",
    "budget_notice",
    "pairing_reply",
    "rate_limit_notice",
]

logger = logging.getLogger(__name__)

RATE_LIMITED_ERROR: Final = "rate limited"
"""The ``error`` of an inbox row closed because its sender was over the limit."""
NOT_ADMITTED_ERROR: Final = "not admitted"
"""The ``error`` of a recovered inbox row whose sender the access mode no longer admits."""
PAIRING_ERROR: Final = "pairing requested"
"""The ``error`` of an inbox row answered with a pairing code instead of a turn."""
OVER_BUDGET_ERROR: Final = "over token budget"
"""The ``error`` of an inbox row closed because its sender was over
``MAX_TOKENS_PER_SENDER_PER_DAY`` (``bot.gateway.accounting``)."""
_NO_BUDGET_COMMANDS: Final = frozenset({"start", "help", "reset"})
"""Commands that call no model: answered over the budget too."""


def budget_notice() -> str:
    """The one notice per UTC day a sender over the token budget gets."""
    return (
        "You have reached today's usage limit for this assistant. I will answer again "
        "after midnight UTC; messages sent until then will not be answered."
    )


def rate_limit_notice(retry_in: float) -> str:
    """The one notice per window a sender over the limit gets (it never quotes the message)."""
    if retry_in >= 90:
        wait = f"{math.ceil(retry_in / 60)} minutes"
    else:
        wait = f"{max(1, math.ceil(retry_in))} seconds"
    return (
        "You are sending messages faster than I can answer. "
        f"I will read new messages again in about {wait}; the ones sent until then "
        "will not be answered."
    )


def pairing_reply(code: str, ttl_seconds: float) -> str:
    """The answer to a stranger in pairing mode: the code is one word of its own."""
    hours = ttl_seconds / 3600
    valid = f"{hours:.0f} hours" if hours >= 2 else f"{max(1, round(ttl_seconds / 60))} minutes"
    return (
        "This assistant is private. To get access, send this pairing code to its "
        f"operator:\n\n{code}\n\nThe code is valid for {valid}."
    )


class AccessControl:
    """Rate limits and pairing for accepted messages (``screen``), in the store's database."""

    def __init__(
        self,
        settings: Settings,
        turns: Turns,
        secret: bytes,
        queue_sends: Callable[[list[Obligation]], None],
    ) -> None:
        """``turns`` closes inbox rows and records answers; ``queue_sends`` hands those
        answers to the senders' lanes (``Gateway._queue_sends``)."""
        self._turns = turns
        self._store = store = turns.store
        self._metrics = turns.metrics
        self._queue_sends = queue_sends
        self.pairing: Pairing | None = None
        if settings.effective_access_mode == "pairing":
            self.pairing = Pairing(
                store, secret=secret, ttl_seconds=settings.pairing_code_ttl_seconds
            )
        self.budget: TokenAccounting | None = None
        """The daily token budget, judged after the rate limit (the gateway sets it)."""
        self.limits: RateLimits | None = None
        if settings.rate_limit_messages is not None:
            self.limits = RateLimits(
                store,
                limit=settings.rate_limit_messages,
                window_seconds=settings.rate_limit_window_seconds,
                secret=secret,
            )

    async def open(self) -> None:
        """Create the tables of what is switched on."""
        if self.pairing is not None:
            await self.pairing.open()
        if self.limits is not None:
            await self.limits.open()

    async def screen(self, entry: InboxEntry, admission: Admission, *, count: bool = True) -> bool:
        """Whether the accepted ``entry`` starts a turn; if not, its row is closed here.

        ``count=False`` judges without counting (a message recovered after a crash
        may have been counted already). A storage failure is logged: a message
        to serve then runs (limits are best effort), a pairing one waits in the
        inbox for the next start.
        """
        counting = count and self.limits is not None
        event = entry.event
        budget = self.budget if self.budget is not None and self.budget.budgeted else None
        if event.scheduled or event.command in _NO_BUDGET_COMMANDS:
            budget = None
        if not counting and budget is None and admission == "serve":
            return True

        # One body on the database thread (it joins the group commit of tx 1s and
        # turns); it awaits only the transaction.
        async def body(tx: Transaction) -> tuple[bool, bool, Obligation | None, bool]:
            limited = notice = over = False
            answer: Obligation | None = None
            if counting:
                assert self.limits is not None
                verdict = await self.limits.hit_in(tx, event.platform, event.source.sender_id)
                limited, notice = not verdict.allowed, verdict.notice
                if limited:
                    text = rate_limit_notice(verdict.retry_in) if notice else None
                    answer = await self._turns.close_in(tx, entry, text, error=RATE_LIMITED_ERROR)
            if admission == "ignore" and not limited:
                # Recovered, and no longer admitted (an approval revoked meanwhile).
                await self._turns.close_in(tx, entry, None, error=NOT_ADMITTED_ERROR)
            if admission == "pair" and not limited:
                assert self.pairing is not None
                code, issued = await self.pairing.request_in(
                    tx, event.platform, event.source.sender_id
                )
                # One answer per code: a stranger who keeps writing (or many who do)
                # must not spend the bot's send budget; they were told already.
                text = pairing_reply(code, self.pairing.ttl_seconds) if issued else None
                answer = await self._turns.close_in(tx, entry, text, error=PAIRING_ERROR)
            if budget is not None and admission == "serve" and not limited:
                # Like a rate-limited message: journaled and closed, not in the history.
                judged = await budget.budget_in(tx, event)
                if judged.over:
                    over = True
                    text = budget_notice() if judged.notice else None
                    answer = await self._turns.close_in(tx, entry, text, error=OVER_BUDGET_ERROR)
            return limited, notice, answer, over

        try:
            limited, notice, answer, over = await self._store.run(body)
        except ChatflowError as exc:
            logger.warning(
                "access check failed for session %s (%s)", entry.session_id, type(exc).__name__
            )
            return admission == "serve"
        if limited:
            self._metrics.rate_limited.labels(event.platform).inc()
            if notice:
                assert self.limits is not None
                logger.info(
                    "%s sender over %d messages in %.0f s (session %s): told once, "
                    "the rest of the window starts no turn",
                    event.platform,
                    self.limits.limit,
                    self.limits.window_seconds,
                    entry.session_id,
                )
        elif admission == "pair":
            self._metrics.pairing_requests.labels(event.platform).inc()
        elif over:
            self._metrics.over_budget.labels(event.platform).inc()
            if answer is not None:
                logger.info(
                    "%s sender over the daily token budget (session %s): told once, "
                    "no turn until the UTC day ends",
                    event.platform,
                    entry.session_id,
                )
        if answer is not None:
            self._queue_sends([answer])
        return admission == "serve" and not limited and not over

    async def rescreen(
        self, entries: list[InboxEntry], admit: Callable[[MessageEvent], Awaitable[Admission]]
    ) -> list[InboxEntry]:
        """The recovered ``entries`` that may still run (pairing mode judges them again:
        a crash right after tx 1 must not let a stranger's message reach the model)."""
        if self.pairing is None:
            return entries
        kept = []
        for entry in entries:
            if entry.event.scheduled:  # a run_agent job's turn: no person to screen
                kept.append(entry)
                continue
            if await self.screen(entry, await admit(entry.event), count=False):
                kept.append(entry)
        return kept
