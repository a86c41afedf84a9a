"""The compaction engine: summarise a session's older turns, in its own transaction.

``Compactor.compact(session_id)`` reads the committed session (no lock), and
if it is due (its estimated request passes ``Compaction.trigger_tokens``, or
its history reached ``max_turns``, where pruning would drop turns unread)
asks the model for a summary of every turn but the last
``keep_recent_turns``, merged with the earlier summary. The model call holds
no lock: a turn that arrives meanwhile runs on the uncompacted history.
Then, under the session's lock, it loads the session again and, if it is
still the one summarised (same incarnation, same summary, the kept turns'
first message still there), replaces the older turns and the old summary by
the new one and saves, in one transaction (with the call's usage,
``kind="compaction"``, on SQL stores, charged to the conversation's sender:
``session_sender_in``). Turns that committed in between are kept whole after
the summary. The call is billed whatever becomes of its summary: its usage goes
to ``on_usage`` (the gateway's ``/metrics``) as soon as it returns, and a summary
thrown away (empty, the session changed, the save failed) still records its row,
in a transaction of its own.

The replaced rows stay in the store marked compacted (``conversation()``
shows them; loads do not). A failure -- the model, an empty summary, the
save -- writes nothing: the session stays byte for byte as it was, and the
next turn's end tries again after a backoff (``BASE_DELAY`` doubling up to
``MAX_DELAY``) so a broken model is not asked after every turn. ``/compact``
(``force=True``) skips the trigger and the backoff.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Final, NamedTuple

from bot.core.agent import Agent
from bot.core.compaction import (
    SUMMARY_INSTRUCTIONS,
    Compaction,
    estimate_tokens,
    is_summary,
    summary_message,
    summary_request,
)
from bot.core.ids import log_session_id
from bot.core.messages import Message, Role
from bot.core.models.base import ChatModel, ModelResponse, ToolSpec, Usage, current_agent_name
from bot.core.session import SessionContext
from bot.core.sql import Transaction
from bot.core.stores.base import BaseSessionStore, TransactionalStore
from bot.core.usage import CallUsage, record_usage_in, session_sender_in
from bot.tracing import names, spans

__all__ = [
    "BASE_DELAY",
    "MAX_DELAY",
    "CompactionOutcome",
    "CompactionPlan",
    "CompactionPlans",
    "Compactor",
]

logger = logging.getLogger(__name__)

BASE_DELAY: Final = 60.0
"""Seconds before a failed compaction of a session is tried again (doubling per failure)."""
MAX_DELAY: Final = 3600.0
"""The longest wait between two automatic attempts on one failing session."""

_CALIBRATIONS: Final = 10_000  # sessions whose ratio (and failures) are remembered
_RATIO_BOUNDS: Final = (0.25, 4.0)


class CompactionOutcome(StrEnum):
    """What ``Compactor.compact`` did."""

    COMPACTED = "compacted"
    """The summary replaced the older turns."""
    NOTHING = "nothing"
    """Not due, or nothing older than the kept turns to summarise."""
    DEFERRED = "deferred"
    """Due, but waiting out the backoff of earlier failures."""
    FAILED = "failed"
    """The model or the save failed; the session is as it was."""


class CompactionPlan(NamedTuple):
    """How one agent's conversations are compacted (``Runner`` resolves it)."""

    compaction: Compaction
    model: ChatModel
    model_name: str
    system: str
    """The agent's instructions (part of the request the estimate measures)."""
    tools: Sequence[ToolSpec]
    """The agent's tools (idem)."""


UsageObserver = Callable[[CallUsage], None]
"""Told of every summary call's usage as it returns (the gateway counts it in ``/metrics``)."""

PlanOf = Callable[[Agent, bool], CompactionPlan | None]
"""``plan_of(agent, forced)``: how ``agent``'s sessions are compacted (``None``: not at all)."""

Resolve = Callable[[str], tuple[ChatModel, str]]
"""A model name to its client and the name to send (the Runner's router)."""


class CompactionPlans:
    """The ``PlanOf`` of a ``Runner``: each agent's ``Compaction``, else the default.

    ``refresh`` (from ``Runner.validate``) resolves the summary models named by
    ``Compaction.model`` strings up front, so a wrong name fails at start-up.
    """

    def __init__(self, default: Compaction | None) -> None:
        self.default = default
        self._agents: Mapping[str, Agent] = {}
        self._models: Mapping[str, tuple[ChatModel, str]] = {}
        self._named: dict[str, tuple[ChatModel, str]] = {}

    def refresh(
        self,
        agents: Mapping[str, Agent],
        models: Mapping[str, tuple[ChatModel, str]],
        override: ChatModel | None,
        resolve: Resolve,
    ) -> None:
        """Take the Runner's agents and their models; resolve the summary models."""
        named: dict[str, tuple[ChatModel, str]] = {}
        for agent in agents.values():
            chosen = agent.compaction or self.default
            if chosen is not None and isinstance(chosen.model, str):
                named[agent.name] = (
                    (override, chosen.model) if override is not None else resolve(chosen.model)
                )
        self._agents, self._models, self._named = dict(agents), dict(models), named

    def __call__(self, agent: Agent, forced: bool = False) -> CompactionPlan | None:
        """How ``agent``'s sessions are compacted; ``None`` when they are not (``forced``:
        ``/compact`` asks, and an agent without a ``Compaction`` takes the defaults)."""
        known = self._agents.get(agent.name)
        if known is None:
            return None
        chosen = known.compaction or self.default
        if chosen is None:
            if not forced:
                return None
            chosen = Compaction(trigger_tokens=1)
        if isinstance(chosen.model, str):
            model, name = self._named[known.name]
        elif chosen.model is not None:
            model, name = chosen.model, self._models[known.name][1]
        else:
            model, name = self._models[known.name]
        return CompactionPlan(chosen, model, name, known.instructions, known.tool_specs())


class _Split(NamedTuple):
    keep_from: int | None  # seq of the first kept turn's USER message; None: none kept
    older: list[Message]
    previous: Message | None
    replaced: tuple[int, ...]


class Compactor:
    """Compacts sessions of ``store``; ``plan_of(agent, forced)`` says how (``None``: never)."""

    def __init__(
        self,
        store: BaseSessionStore,
        plan_of: PlanOf,
        *,
        clock: Callable[[], float] = time.monotonic,
        base_delay: float = BASE_DELAY,
        max_delay: float = MAX_DELAY,
    ) -> None:
        self.store = store
        self._plan_of = plan_of
        self.clock = clock
        """Seconds, for the backoff (``time.monotonic``; tests move their own)."""
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._failures: dict[str, tuple[int, float]] = {}  # session -> (count, retry at)
        self._ratios: OrderedDict[str, float] = OrderedDict()
        self._tasks: dict[str, asyncio.Task[CompactionOutcome]] = {}
        self.on_usage: UsageObserver | None = None
        """Told of each summary call's usage (``None``: nobody counts them)."""

    # -- estimate -------------------------------------------------------------------

    def observe(self, session_id: str, estimated: int, reported: int) -> None:
        """Calibrate the session's estimate: the provider reported ``reported`` prompt
        tokens for a request estimated at ``estimated``."""
        if estimated <= 0 or reported <= 0:
            return
        low, high = _RATIO_BOUNDS
        self._ratios[session_id] = min(high, max(low, reported / estimated))
        self._ratios.move_to_end(session_id)
        while len(self._ratios) > _CALIBRATIONS:
            self._ratios.popitem(last=False)

    def observe_call(
        self,
        session_id: str,
        agent: Agent,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec],
        usage: Usage,
    ) -> None:
        """Calibrate with a turn's model call, if ``agent``'s sessions are compacted."""
        if usage.input_tokens and self._plan_of(agent, False) is not None:
            estimated = estimate_tokens(agent.instructions, messages, tools)
            self.observe(session_id, estimated, usage.input_tokens)

    def estimate(self, session: SessionContext, plan: CompactionPlan) -> int:
        """The session's next request, in tokens: the byte estimate, calibrated."""
        raw = estimate_tokens(plan.system, session.history, plan.tools)
        return round(raw * self._ratios.get(session.session_id, 1.0))

    def is_due(self, session: SessionContext, plan: CompactionPlan) -> bool:
        """Past the trigger, or at ``max_turns`` (the next turn would prune unread turns)."""
        turns = sum(1 for message in session.history if message.role is Role.USER)
        if turns <= plan.compaction.keep_recent_turns:
            return False
        if turns >= session.max_turns:
            return True
        return self.estimate(session, plan) >= plan.compaction.trigger_tokens

    # -- running --------------------------------------------------------------------

    def schedule_if_planned(self, agent: Agent, session_id: str) -> None:
        """``schedule`` if ``agent``'s sessions are compacted at all."""
        if self._plan_of(agent, False) is not None:
            self.schedule(session_id)

    def schedule(self, session_id: str) -> None:
        """Compact ``session_id`` in the background if due (one attempt at a time)."""
        running = self._tasks.get(session_id)
        if running is not None and not running.done():
            return
        task = asyncio.get_running_loop().create_task(
            self.compact(session_id), name=f"chatflow-compaction-{log_session_id(session_id)}"
        )
        self._tasks[session_id] = task
        task.add_done_callback(lambda done: self._forget(session_id, done))

    def _forget(self, session_id: str, task: asyncio.Task[CompactionOutcome]) -> None:
        if self._tasks.get(session_id) is task:
            del self._tasks[session_id]
        if not task.cancelled() and task.exception() is not None:
            logger.error("compaction task failed: %r", task.exception())

    async def wait_idle(self) -> None:
        """Wait until the background compactions running now have ended."""
        while self._tasks:
            await asyncio.wait(list(self._tasks.values()))

    async def aclose(self) -> None:
        """Stop the background compactions (nothing half-written: each is one transaction)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def compact(self, session_id: str, *, force: bool = False) -> CompactionOutcome:
        """Compact ``session_id`` now if due (``force``: if it has older turns at all)."""
        if not force:
            failed = self._failures.get(session_id)
            if failed is not None and self.clock() < failed[1]:
                return CompactionOutcome.DEFERRED
        try:
            with spans.span(names.COMPACTION, {"chatflow.compaction.forced": force}) as span:
                outcome = await self._compact(session_id, force)
                span.set("chatflow.compaction.outcome", str(outcome))
        except Exception as exc:
            self._failed(session_id, exc)
            return CompactionOutcome.FAILED
        if outcome is CompactionOutcome.COMPACTED:
            self._failures.pop(session_id, None)
        return outcome

    def _failed(self, session_id: str, exc: Exception) -> None:
        count = self._failures.get(session_id, (0, 0.0))[0] + 1
        delay = min(self._max_delay, self._base_delay * 2 ** (count - 1))
        self._failures[session_id] = (count, self.clock() + delay)
        if len(self._failures) > _CALIBRATIONS:  # bounded: the oldest failure is forgotten
            del self._failures[next(iter(self._failures))]
        logger.warning(
            "compaction of session %s failed (%s); the history is unchanged, next try in %.0f s",
            log_session_id(session_id),
            type(exc).__name__,
            delay,
        )

    async def _compact(self, session_id: str, force: bool) -> CompactionOutcome:
        session = await self.store.get(session_id)
        if session is None:
            return CompactionOutcome.NOTHING
        agent = session.active_agent
        plan = self._plan_of(agent, force)
        if plan is None:
            return CompactionOutcome.NOTHING
        if not force and not self.is_due(session, plan):
            return CompactionOutcome.NOTHING
        split = _split(session, plan.compaction.keep_recent_turns)
        if split is None:
            return CompactionOutcome.NOTHING
        # No lock while the model writes: a turn arriving now runs on the committed,
        # uncompacted history, and is kept whole after the summary below.
        response = await self._summarise(plan, agent, split)
        call = CallUsage("compaction", plan.model_name, agent.name, response.usage)
        if self.on_usage is not None:
            self.on_usage(call)
        saved = False
        try:
            text = (response.content or "").strip()
            if not text:
                raise ValueError("the model answered the compaction request with no text")
            async with self.store.session_lock(session_id):
                fresh = await self.store.get(session_id)
                if fresh is None or not _still_matches(session, fresh, split):
                    logger.info(
                        "session %s changed during its compaction; left as it is",
                        log_session_id(session_id),
                    )
                    return CompactionOutcome.NOTHING
                fresh._compact(split.keep_from, split.replaced, summary_message(text))
                await self._save(fresh, call)
                saved = True
        finally:
            if not saved:  # billed all the same: the row goes in on its own
                await self._record_alone(session_id, call)
        logger.info(
            "session %s compacted: %d messages summarised",
            log_session_id(session_id),
            len(split.older),
        )
        return CompactionOutcome.COMPACTED

    async def _summarise(self, plan: CompactionPlan, agent: Agent, split: _Split) -> ModelResponse:
        token = current_agent_name.set(agent.name)
        try:
            return await plan.model.complete(
                model=plan.model_name,
                system=SUMMARY_INSTRUCTIONS,
                messages=summary_request(split.previous, split.older),
                tools=(),
            )
        finally:
            current_agent_name.reset(token)

    async def _save(self, session: SessionContext, call: CallUsage) -> None:
        store = self.store
        if not isinstance(store, TransactionalStore):
            await store.save(session)
            return

        async def also(tx: Transaction) -> None:
            await _record_in(tx, session.session_id, call)

        await store.save(session, also=also)

    async def _record_alone(self, session_id: str, call: CallUsage) -> None:
        """Record a thrown-away summary's call in a transaction of its own; best effort."""
        store = self.store
        if not isinstance(store, TransactionalStore):
            return

        async def body(tx: Transaction) -> None:
            await _record_in(tx, session_id, call)

        try:
            await store.run(body)
        except Exception as exc:
            logger.warning(
                "usage of a discarded summary of session %s not recorded (%s)",
                log_session_id(session_id),
                type(exc).__name__,
            )


async def _record_in(tx: Transaction, session_id: str, call: CallUsage) -> None:
    """``call``'s usage row, charged to the conversation's sender."""
    await record_usage_in(
        tx,
        session_id=session_id,
        agent=call.agent,
        kind=call.kind,
        model=call.model,
        usage=call.usage,
        sender=await session_sender_in(tx, session_id),
    )


def _split(session: SessionContext, keep: int) -> _Split | None:
    """The older turns to summarise and what to keep; ``None`` if there are none."""
    entries = session._entries
    users = [entry.seq for entry in entries if entry.message.role is Role.USER]
    if len(users) <= keep:
        return None
    keep_from = users[-keep]
    summaries = [entry for entry in entries if is_summary(entry.message)]
    older = [
        entry.message
        for entry in entries
        if entry.message.role is not Role.SYSTEM and entry.seq < keep_from
    ]
    return _Split(
        keep_from,
        older,
        summaries[-1].message if summaries else None,
        tuple(entry.seq for entry in summaries),
    )


def _still_matches(before: SessionContext, after: SessionContext, split: _Split) -> bool:
    """Whether ``after`` (loaded under the lock) is the session ``split`` was made from."""
    if after._incarnation != before._incarnation:
        return False  # deleted (/reset) and begun again
    entries = after._entries
    summaries = tuple(entry.seq for entry in entries if is_summary(entry.message))
    if summaries != split.replaced:
        return False  # compacted by someone else meanwhile
    return any(entry.seq == split.keep_from for entry in entries)
