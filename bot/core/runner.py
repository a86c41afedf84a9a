"""The agent loop: one user message in, one committed turn (or nothing) out.

A turn runs under the store's per-session lock: load the session, take a
checkpoint, add the user message, then call the active agent's model until it
answers with text, running tools and handoffs in between. The turn is saved
once, in one transaction (with the caller's ``on_commit`` rows, e.g. the
gateway's inbox and ledger). Whatever fails on the way -- the model, a tool
round limit, the save, a cancellation -- the session is rolled back to the
checkpoint: no user message, no handoff, no metadata change survives.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Self

from bot.core.agent import HANDOFF_PREFIX, Agent, HandoffTool, check_tool_names, servers_of
from bot.core.approvals import (
    ApprovalDecision,
    PendingApproval,
    approval_buttons,
    approval_prompt,
    decision_result,
    hold_gated,
)
from bot.core.attachments import OutgoingPart, ToolFiles, ToolOutput
from bot.core.buttons import Button, offer_buttons
from bot.core.compaction import Compaction
from bot.core.compactor import CompactionOutcome, CompactionPlans, Compactor
from bot.core.ids import log_session_id
from bot.core.long_memory.block import system_prompt
from bot.core.mcp.lifecycle import close_servers, connect_servers
from bot.core.mcp.servers import MCPServer
from bot.core.messages import ImagePart, Message, MessagePart, Role, ToolCall, unique_call_ids
from bot.core.models.base import ChatModel, ModelResponse, Usage, current_agent_name
from bot.core.models.routing import (
    ModelRouter,
    ModelSettings,
    ModelSettingsSource,
    default_model_name,
)
from bot.core.parts import NO_VISION_NOTE, without_images
from bot.core.session import SessionCheckpoint, SessionContext
from bot.core.sql import Transaction
from bot.core.stores.base import BaseSessionStore, require_transactional
from bot.core.stores.in_memory import SessionStore
from bot.core.streaming import ReplyStream, ask_model
from bot.core.tools import FunctionTool, ToolContext, error_result
from bot.core.turn_gauges import CountedTurn
from bot.core.usage import CallUsage
from bot.errors import ChatflowError, EmptyAnswerError, MaxToolRoundsError, TurnError
from bot.tracing import genai, names, spans

__all__ = ["OnCommit", "RunResult", "Runner"]

logger = logging.getLogger(__name__)

_INBOUND_ID_KEY = "inbound_message_id"

# Set by resume_async around run_async, so both kinds of turn share one implementation
# of the lock, checkpoint, rollback and save (and run_async's signature stays the user's).
_resuming: contextvars.ContextVar[_Resume | None] = contextvars.ContextVar(
    "chatflow_resuming", default=None
)

OnToolRan = Callable[[Transaction, str], Awaitable[None]]
"""``async (transaction, result) -> None``: runs in the commit that records an approved
call and its result right after the tool returned (``Runner.resume_async(on_ran=...)``)."""


@dataclass(frozen=True, slots=True)
class _Resume:
    pending: PendingApproval
    decision: ApprovalDecision
    on_ran: OnToolRan | None = None


@dataclass(frozen=True)
class RunResult:
    """The outcome of one committed turn."""

    content: str
    """The final text answer."""
    agent: str
    """Name of the agent that answered (after any handoffs)."""
    session_id: str
    """The session the turn ran in."""
    new_messages: list[Message] = field(default_factory=list)
    """Messages this turn added: the user message, model answers, tool results."""
    usage: Usage = field(default_factory=Usage)
    """Tokens spent across every model call of the turn."""
    calls: list[CallUsage] = field(default_factory=list)
    """Each model call of the turn (agent, model, usage), in order: what the host records."""
    attachments: list[OutgoingPart] = field(default_factory=list)
    """Files the turn's tools returned (``ToolOutput``, bytes in the media store)."""
    effects: list[object] = field(default_factory=list)
    """Requests the turn's tools left for its commit (``ToolContext.effects``), in order."""
    buttons: tuple[Button, ...] = ()
    """Choices shown under the final reply: those of the turn's last tool output with any."""
    anyone_may_tap: bool = False
    """That tool output's ``anyone_may_tap``: any member of a group may tap ``buttons``."""
    pending_approval: PendingApproval | None = None
    """Set when the turn ended on a tool call that waits for approval (``content`` asks
    the person; ``buttons`` are Approve / Deny): decide with ``Runner.resume_async``."""


OnCommit = Callable[[RunResult, Transaction], Awaitable[None]]
"""Called with the result and the store's open transaction, inside the save.

It must only run SQL on that transaction: on SQLite the whole save runs in one
go on the database thread, and a hook that awaits anything else fails the turn."""


@dataclass
class _Turn:
    """What one turn gathers on its way to its ``RunResult``."""

    session: SessionContext
    calls_out: list[CallUsage] | None
    """The caller's list: each model call as it returns, also when the turn then fails."""
    new_messages: list[Message] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    calls: list[CallUsage] = field(default_factory=list)
    attachments: list[OutgoingPart] = field(default_factory=list)
    effects: list[object] = field(default_factory=list)
    buttons: tuple[Button, ...] = ()
    anyone_may_tap: bool = False

    def add(self, message: Message) -> None:
        self.session.add_message(message)
        self.new_messages.append(message)

    def called(self, call: CallUsage) -> None:
        self.usage = self.usage + call.usage
        self.calls.append(call)
        if self.calls_out is not None:
            self.calls_out.append(call)

    def result(
        self, content: str, agent: Agent, pending: PendingApproval | None = None
    ) -> RunResult:
        return RunResult(
            content=content,
            agent=agent.name,
            session_id=self.session.session_id,
            new_messages=self.new_messages,
            usage=self.usage,
            calls=self.calls,
            attachments=self.attachments,
            effects=self.effects,
            buttons=self.buttons if pending is None else approval_buttons(pending),
            anyone_may_tap=self.anyone_may_tap and pending is None,
            pending_approval=pending,
        )


class Runner:
    """Runs turns for a graph of agents against a session store.

    Use it as ``async with Runner(agent) as runner:``: it connects the agents'
    MCP servers on the way in and closes them, its model clients (and its own
    in-memory store) on the way out; or call ``connect_mcp_servers()`` and
    ``aclose()``.
    """

    def __init__(
        self,
        starting_agent: Agent,
        session_store: BaseSessionStore | None = None,
        *,
        model: ChatModel | None = None,
        max_tool_rounds: int = 10,
        model_settings: ModelSettings | ModelSettingsSource | None = None,
        stream_replies: bool = True,
        compaction: Compaction | None = None,
    ) -> None:
        """Collect every agent reachable through handoffs and resolve their models.

        ``compaction`` is the default of agents that set none (``COMPACTION_*``);
        ``None``: only pruning, for them.

        ``model`` serves every agent (tests); without it each agent's ``model``
        name (or ``DEFAULT_MODEL``, or ``offline``) is routed. ``model_settings``
        is a ``ModelSettings`` or a settings object such as ``bot.config.Settings``;
        without it the keys and URLs are read from the environment
        (``ModelSettings.from_env()``), as the openai SDK does. Anything else
        (a dict, say) raises ``TypeError``. A model name that routes nowhere, or
        lacks its key, raises ``ConfigurationError`` here, before any message.
        Two agents with one name raise ``ValueError``. ``stream_replies=False``: no streaming.
        """
        if max_tool_rounds < 0:
            raise ValueError("max_tool_rounds must be >= 0")
        # Checked first: wrong settings must not leave a caller's store with our resolver.
        self._settings = (
            ModelSettings.from_settings(model_settings)
            if model_settings is not None
            else ModelSettings.from_env()
        )
        self.starting_agent = starting_agent
        self.max_tool_rounds = max_tool_rounds
        self.stream_replies = stream_replies
        self._agents = self._collect(starting_agent)
        self.turns_running = 0
        """Turns inside their session (model, tools, save): a gauge for ``/metrics``."""
        self.turns_waiting = 0
        """Turns waiting for their session: an earlier turn of it in this process, or
        (PostgreSQL) another process holding its lease. A gauge for ``/metrics``."""
        self._owns_store = session_store is None
        self.store: BaseSessionStore = (
            session_store if session_store is not None else SessionStore()
        )
        self.store.set_agent_resolver(self.get_agent)
        self._model_override = model
        self.tool_services: dict[str, object] = {}
        """Host settings handed to tools as ``ToolContext.services`` (the gateway sets them)."""
        self._router = ModelRouter(self._settings)
        self._models: dict[str, tuple[ChatModel, str]] = {}
        self._plans = CompactionPlans(compaction)
        self.compactor = Compactor(self.store, self._plans)
        """Compacts long sessions after their turns (``bot.core.compactor``)."""
        settings = self._settings
        self._tool_files = ToolFiles(
            settings.media_dir,
            max_bytes=settings.max_media_bytes,
            files_dir=settings.attachments_dir,
        )
        self.validate()

    @staticmethod
    def _collect(starting_agent: Agent) -> dict[str, Agent]:
        agents: dict[str, Agent] = {}
        for agent in starting_agent.reachable_agents():
            other = agents.get(agent.name)
            if other is not None and other is not agent:
                raise ValueError(f"two different agents are named {agent.name!r}")
            agent.validate()
            agents[agent.name] = agent
        return agents

    @property
    def agents(self) -> Mapping[str, Agent]:
        """Every agent this runner knows, by name."""
        return dict(self._agents)

    def get_agent(self, name: str) -> Agent | None:
        """The agent called ``name``, or ``None`` (the store's resolver)."""
        return self._agents.get(name)

    def validate(self) -> None:
        """Re-collect the agents and resolve every agent's model now.

        Called by the constructor; call it again after changing agents' handoffs
        or models. ``ConfigurationError`` names the missing or wrong setting.
        """
        self._agents = self._collect(self.starting_agent)
        default = default_model_name(self._settings)
        models: dict[str, tuple[ChatModel, str]] = {}
        warned = False
        for agent in self._agents.values():
            name = agent.model or default
            if self._model_override is not None:
                models[agent.name] = (self._model_override, name)
                continue
            if agent.model is None and name == "offline" and not warned:
                warned = True
                logger.warning(
                    "No DEFAULT_MODEL and no API key: using the offline demo model "
                    "(set OPENAI_API_KEY or GEMINI_API_KEY for real answers)"
                )
            models[agent.name] = self._router.resolve(name)
        self._models = models
        # A wrong COMPACTION_MODEL fails here too, before any message.
        self._plans.refresh(self._agents, models, self._model_override, self._router.resolve)

    async def compact(self, session_id: str) -> CompactionOutcome:
        """Compact ``session_id`` now (``/compact``, the console's button), due or not.

        An agent without a ``Compaction`` (and no ``COMPACTION_*`` default) is compacted
        with the defaults, by its own model. A failure leaves the session as it was
        (``FAILED``); ``NOTHING`` when no turn is older than the recent ones kept.
        """
        return await self.compactor.compact(session_id, force=True)

    @property
    def mcp_servers(self) -> list[MCPServer]:
        """Every distinct MCP server of the agents, in order of first use."""
        return servers_of(self._agents.values())

    async def connect_mcp_servers(self, within: float | None = None) -> None:
        """Start every agent's MCP servers and list their tools, before any turn.

        A required server that fails (or takes longer than ``within`` seconds, else its
        own ``connect_timeout_seconds``) raises ``MCPServerError`` naming it; an
        optional one is skipped with a warning. An MCP tool named like another
        tool of its agent raises ``ConfigurationError`` naming both.
        """
        servers = self.mcp_servers
        await connect_servers(servers, within)
        try:
            check_tool_names(self._agents.values())
        except BaseException:
            await close_servers(servers)
            raise

    async def close_mcp_servers(self) -> None:
        """Close every MCP server (child processes stop); safe to call twice."""
        await close_servers(self.mcp_servers)

    async def aclose(self) -> None:
        """Close the MCP servers and the model clients this runner made (and its own store)."""
        await self.compactor.aclose()
        await self.close_mcp_servers()
        await self._router.aclose()
        if self._owns_store:
            await self.store.close()

    async def __aenter__(self) -> Self:
        """Connect the MCP servers (``connect_mcp_servers``) and return the runner."""
        await self.connect_mcp_servers()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close it (``aclose``), whether the block raised or not."""
        await self.aclose()

    def _counted(self, session_id: str) -> CountedTurn:
        """``store.session_lock``, counted in ``turns_waiting`` then ``turns_running``."""
        return CountedTurn(self, self.store.session_lock(session_id))

    async def run_async(
        self,
        session_id: str,
        user_message: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        on_commit: OnCommit | None = None,
        inbound_message_id: str | None = None,
        parts: Sequence[MessagePart] = (),
        stream: ReplyStream | None = None,
        before_commit: Callable[[RunResult], Awaitable[RunResult]] | None = None,
        calls: list[CallUsage] | None = None,
    ) -> RunResult:
        """Run one turn and commit it, or roll it back and raise a ``ChatflowError``.

        ``before_commit(result)`` runs once the answer is final, before the save's
        transaction opens (so it may await a service, e.g. speech), and returns the
        result to commit; if it raises, the turn rolls back.

        ``stream`` is shown the answer as it is written (a preview, never a delivery).

        ``calls`` (a list of the caller's) gets each model call's usage as it
        returns, also when the turn then fails: the provider billed it anyway.

        ``parts`` (images, transcribed audio, documents...) join ``user_message``
        in the one USER message of the turn.

        ``metadata`` is merged into the session's metadata as part of the turn.
        ``on_commit(result, transaction)`` runs inside the save's transaction
        (SQL stores only: the in-memory store raises ``NotTransactionalError``
        before the model is called). ``inbound_message_id`` (or ``metadata
        ["inbound_message_id"]``) reaches tools through ``ToolContext``.
        Cancellation rolls back too and propagates as ``CancelledError``.
        """
        if inbound_message_id is None and metadata is not None:
            candidate = metadata.get(_INBOUND_ID_KEY)
            inbound_message_id = str(candidate) if candidate is not None else None
        try:
            async with self._counted(session_id):
                session = await self._load(session_id)
                if on_commit is not None:  # before the model runs, not at the save
                    require_transactional(self.store, "run_async(on_commit=...)")
                # The last committed state: the turn's start, or the approved call it
                # committed on the way (resume_async's on_ran).
                rollback = [session.checkpoint()]
                try:
                    agent = session.active_agent.name
                    with genai.agent_span(agent, metadata, session_id) as traced:
                        if metadata:
                            session.metadata.update(metadata)
                        spans.content(traced, "gen_ai.input.messages", user_message or None)
                        result = await self._run_turn(
                            session,
                            user_message,
                            inbound_message_id,
                            parts,
                            stream,
                            calls,
                            rollback,
                        )
                        if before_commit is not None:
                            result = await before_commit(result)
                        with spans.span(names.TX2):
                            cancelled_after_commit = await self._save(session, result, on_commit)
                        traced.set("chatflow.answered_by", result.agent)
                        spans.content(traced, "gen_ai.output.messages", result.content)
                except BaseException as exc:
                    session.rollback_to(rollback[-1])
                    logger.log(
                        logging.INFO
                        if isinstance(exc, asyncio.CancelledError)
                        else logging.WARNING,
                        "Turn in session %s rolled back: %s",
                        log_session_id(session_id),
                        type(exc).__name__,
                    )
                    raise
        except ChatflowError:
            raise
        except Exception as exc:
            raise TurnError(f"turn failed: {type(exc).__name__}: {exc}") from exc
        if cancelled_after_commit:
            raise asyncio.CancelledError
        # After the commit (the gateway's reply is already owed), never before it.
        self.compactor.schedule_if_planned(session.active_agent, session_id)
        return result

    async def resume_async(
        self,
        session_id: str,
        pending: PendingApproval,
        decision: ApprovalDecision,
        metadata: Mapping[str, Any] | None = None,
        *,
        on_ran: OnToolRan | None = None,
        **options: Any,
    ) -> RunResult:
        """Continue after a decision on ``pending``, as a turn of its own.

        The turn adds the model's call of the tool and its result (the tool runs only
        when ``decision`` is ``"approved"``; otherwise the model reads that the user
        declined, that no answer came in time, or that the outcome is unknown), then
        asks the model for its answer. ``options`` are ``run_async``'s (``on_commit``,
        ``inbound_message_id``, ``stream``...); the commit and rollback are the same.
        Whoever calls this makes sure a decision is resumed once.

        ``on_ran(transaction, result)`` (SQL stores): once an approved tool returned,
        its call and result are committed with the session right away, ``on_ran``
        in the same transaction, before the model is asked; if the model then
        fails, only its answer rolls back, and the history keeps what ran. A
        ``"ran"`` decision adds the kept ``pending.result`` (unless the history
        holds it) and asks the model again, running nothing.
        """
        token = _resuming.set(_Resume(pending, decision, on_ran))
        try:
            return await self.run_async(session_id, "", metadata, **options)
        finally:
            _resuming.reset(token)

    async def _load(self, session_id: str) -> SessionContext:
        session = await self.store.get_or_create(session_id, self.starting_agent)
        known = self._agents.get(session.active_agent.name)
        if known is None:
            # An operator who switched AGENTS_MODULE expects this: one INFO line (N11).
            logger.info(
                "conversation %s moved to %r: its agent %r is gone",
                log_session_id(session_id),
                self.starting_agent.name,
                session.active_agent.name,
            )
            # Not part of the rollback: the unknown agent cannot run anyway.
            session.active_agent = self.starting_agent
        elif known is not session.active_agent:
            session.active_agent = known
        return session

    async def _save(
        self, session: SessionContext, result: RunResult, on_commit: OnCommit | None
    ) -> bool:
        """Save the turn; return True if a cancellation arrived while it committed."""
        if on_commit is None:
            save = self.store.save(session)
        else:
            carried = spans.capture()  # tx 2's span: the store may run this in its own task

            async def also(transaction: Transaction) -> None:
                with spans.resume(carried):  # rows recorded here name the span that owes them
                    await on_commit(result, transaction)

            save = require_transactional(self.store, "on_commit").save(session, also=also)
        task = asyncio.ensure_future(save)
        cancelled = False
        # A commit in flight must settle before we decide: if it landed, the
        # turn is committed (memory must match disk); only a failure rolls back.
        while True:
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done():
                    raise
                cancelled = True
                continue
            except BaseException:
                if cancelled:
                    raise asyncio.CancelledError from None
                raise
            break
        if cancelled:
            logger.warning(
                "Turn in session %s committed while cancelled", log_session_id(session.session_id)
            )
        return cancelled

    async def _run_turn(
        self,
        session: SessionContext,
        user_message: str,
        inbound_message_id: str | None,
        parts: Sequence[MessagePart] = (),
        stream: ReplyStream | None = None,
        calls_out: list[CallUsage] | None = None,
        rollback: list[SessionCheckpoint] | None = None,
    ) -> RunResult:
        turn = _Turn(session, calls_out)
        resume = _resuming.get()
        _resuming.set(None)  # one turn only: a tool's own run_async starts a normal turn
        if resume is None:
            turn.add(
                Message(
                    role=Role.USER,
                    content=(user_message or None) if parts else user_message,
                    parts=list(parts),
                )
            )
        else:
            await self._decided_call(turn, resume, inbound_message_id)
            if resume.decision == "approved" and resume.on_ran is not None:
                await self._commit_ran(turn, resume.on_ran, rollback)
        has_image = any(isinstance(part, ImagePart) for part in parts)
        tool_rounds = 0
        prompts: dict[str, str] = {}  # per agent, read once: the same prefix every round
        while True:
            agent = session.active_agent
            if agent.name not in prompts:
                prompts[agent.name] = await system_prompt(agent, self.store, self.tool_services)
            response = await self._call_model(session, agent, stream, prompts[agent.name])
            turn.called(CallUsage("chat", self._models[agent.name][1], agent.name, response.usage))
            calls, invalid = unique_call_ids(response.tool_calls, response.invalid_tool_calls)
            if not calls and not (response.content or "").strip():
                # No adapter can send a blank reply: committing it would leave the
                # user in silence. As a model failure the turn rolls back instead.
                raise EmptyAnswerError(f"agent {agent.name!r} answered with no text")
            if calls and tool_rounds >= self.max_tool_rounds:
                raise MaxToolRoundsError(
                    f"agent {agent.name!r} still calling tools after {self.max_tool_rounds} rounds"
                )
            calls, pending = await hold_gated(
                agent,
                calls,
                invalid,
                functools.partial(
                    self._tool_context, session, agent, inbound_message_id, turn.effects
                ),
            )
            if calls or pending is None:
                turn.add(
                    Message(
                        role=Role.MODEL,
                        content=response.content,
                        tool_calls=calls,
                        agent=agent.name,
                    )
                )
            if not calls and pending is not None:
                return self._paused(turn, agent, pending)
            if not calls:
                content = response.content or ""
                if has_image and not agent.vision:
                    # Said plainly here, not left to a model that was never shown the image.
                    content = f"{NO_VISION_NOTE}\n\n{content}"
                return turn.result(content, agent)
            tool_rounds += 1
            handed_off = False
            for call in calls:
                output, target = await self._run_call(
                    session,
                    agent,
                    call,
                    invalid.get(call.id),
                    inbound_message_id,
                    handed_off,
                    turn.effects,
                )
                if target is not None:
                    handed_off = True
                    logger.info(
                        "Handoff in session %s: %s -> %s",
                        log_session_id(session.session_id),
                        agent.name,
                        target.name,
                    )
                    session.active_agent = target
                await self._add_result(turn, agent, call, output)
            if pending is not None:  # the other calls of that answer ran; now wait
                return self._paused(turn, agent, pending)

    async def _add_result(
        self, turn: _Turn, agent: Agent, call: ToolCall, output: str | ToolOutput
    ) -> None:
        """The call's result joins the history; its files and buttons join the turn's."""
        text, files = await self._tool_files.keep(output)  # bytes to the media store
        turn.attachments.extend(files)
        text, buttons = offer_buttons(output, text, turn.buttons)
        if buttons is not turn.buttons:  # this output's keyboard is the turn's now
            turn.buttons = buttons
            turn.anyone_may_tap = bool(getattr(output, "anyone_may_tap", False))
        turn.add(
            Message(
                role=Role.TOOL,
                content=text,
                tool_call_id=call.id,
                name=call.name,
                agent=agent.name,
                parts=list(files),
            )
        )

    def _tool_context(
        self,
        session: SessionContext,
        agent: Agent,
        inbound_message_id: str | None,
        effects: list[object],
    ) -> ToolContext:
        return ToolContext(
            session_id=session.session_id,
            metadata=dict(session.metadata),
            inbound_message_id=inbound_message_id,
            agent_name=agent.name,
            store=self.store,
            effects=effects,
            services=MappingProxyType(self.tool_services),
        )

    def _paused(self, turn: _Turn, agent: Agent, pending: PendingApproval) -> RunResult:
        """End the turn on ``pending``: the question joins the history as the agent's
        message; the call itself is added with its result once decided."""
        prompt = approval_prompt(pending)
        with spans.span(names.APPROVAL_PAUSE, {"gen_ai.tool.name": pending.tool_name}):
            pass  # the trace shows where the turn stopped to wait for a person
        turn.add(Message(role=Role.MODEL, content=prompt, agent=agent.name))
        logger.info(
            "Tool %s in session %s waits for approval %s",
            pending.tool_name,
            log_session_id(turn.session.session_id),
            pending.approval_id,
        )
        return turn.result(prompt, agent, pending)

    async def _commit_ran(
        self, turn: _Turn, on_ran: OnToolRan, rollback: list[SessionCheckpoint] | None
    ) -> None:
        """Commit the approved call and its result now, ``on_ran`` in the same transaction:
        what ran stays recorded whatever the model's answer does."""
        result = turn.new_messages[-1].content or ""
        agent = turn.session.active_agent

        async def also(ran: RunResult, transaction: Transaction) -> None:
            await on_ran(transaction, result)

        cancelled = await self._save(turn.session, turn.result("", agent), also)
        if rollback is not None:
            rollback.append(turn.session.checkpoint())
        if cancelled:
            raise asyncio.CancelledError

    async def _decided_call(
        self, turn: _Turn, resume: _Resume, inbound_message_id: str | None
    ) -> None:
        """Add the decided call and its result (run now if approved) to the turn."""
        pending, decision = resume.pending, resume.decision
        agent = self._agents.get(pending.agent) or turn.session.active_agent
        # "ran": committed with its result when it ran; a history that lost it (a reset
        # since) gets it back from the approval, so the model knows it ran.
        if decision == "ran" and any(
            m.tool_call_id == pending.call_id for m in turn.session.history
        ):
            return
        call = ToolCall(id=pending.call_id, name=pending.tool_name, arguments=pending.arguments)
        turn.add(Message(role=Role.MODEL, content=None, tool_calls=[call], agent=agent.name))
        output: str | ToolOutput
        if decision == "ran":
            output = pending.result or ""
        elif decision == "approved":
            output, _ = await self._run_call(
                turn.session, agent, call, None, inbound_message_id, True, turn.effects
            )
        else:
            output = decision_result(decision)
        await self._add_result(turn, agent, call, output)

    async def _call_model(
        self, session: SessionContext, agent: Agent, stream: ReplyStream | None, system: str
    ) -> ModelResponse:
        model, model_name = self._models[agent.name]
        messages = session.history if agent.vision else without_images(session.history)
        tools = agent.tool_specs()
        token = current_agent_name.set(agent.name)
        attributes = None
        if spans.enabled():  # (off: no attributes built for a span that records nothing)
            provider = getattr(model, "provider_name", "offline")
            attributes = genai.chat_attributes(model_name, provider, agent.name)
        try:
            with spans.span(f"chat {model_name}", attributes, kind="client") as traced:
                response = await ask_model(
                    model,
                    stream if agent.stream and self.stream_replies else None,
                    agent.name,
                    model=model_name,
                    system=system,
                    messages=messages,
                    tools=tools,
                )
                if attributes is not None:  # traced
                    genai.model_answered(traced, response)
        finally:
            current_agent_name.reset(token)
        self.compactor.observe_call(session.session_id, agent, messages, tools, response.usage)
        return response

    async def _run_call(
        self,
        session: SessionContext,
        agent: Agent,
        call: ToolCall,
        invalid_reason: str | None,
        inbound_message_id: str | None,
        handed_off: bool,
        effects: list[object],
    ) -> tuple[str | ToolOutput, Agent | None]:
        """Run one tool call; return its result (text or ``ToolOutput``) and handoff target."""
        if invalid_reason is not None:
            return error_result(invalid_reason), None
        handoff = agent.find_handoff(call.name)
        if handoff is not None:
            with spans.span(names.HANDOFF, {"gen_ai.agent.name": agent.name}) as traced:
                text, target = self._handoff(handoff, handed_off)
                traced.set("chatflow.handoff.to", target.name if target else "")
            return text, target
        attributes = genai.tool_attributes(call.name, call.id)
        with spans.span(f"execute_tool {call.name}", attributes) as traced:
            genai.tool_arguments(traced, call.arguments)
            output, target = await self._run_tool(session, agent, call, inbound_message_id, effects)
            if isinstance(output, str):
                spans.content(traced, "gen_ai.tool.call.result", output)
            return output, target

    async def _run_tool(
        self,
        session: SessionContext,
        agent: Agent,
        call: ToolCall,
        inbound_message_id: str | None,
        effects: list[object],
    ) -> tuple[str | ToolOutput, Agent | None]:
        """Run a function or MCP tool (not a handoff) by its name."""
        function_tool = agent.find_tool(call.name) or agent.find_mcp_tool(call.name)
        if function_tool is None:
            if call.name.startswith(HANDOFF_PREFIX):
                return error_result(f"no agent to transfer to for {call.name!r}"), None
            return error_result(f"unknown tool {call.name!r}"), None
        context = self._tool_context(session, agent, inbound_message_id, effects)
        try:
            if isinstance(function_tool, FunctionTool):
                return await function_tool.run(context, call.arguments), None
            # A tool of an MCP server: its call is a span of its own inside execute_tool.
            with spans.span(names.MCP_CALL, {"gen_ai.tool.name": call.name}, kind="client"):
                return await function_tool.invoke(context, call.arguments), None
        except Exception as exc:  # invoke reports tool failures itself; this is a bug guard
            logger.warning("Tool %s invocation failed: %s", call.name, type(exc).__name__)
            return error_result(f"tool {call.name!r} failed"), None

    def _handoff(self, handoff: HandoffTool, handed_off: bool) -> tuple[str, Agent | None]:
        if handed_off:
            return error_result("only one handoff per answer; this one was ignored"), None
        target = self._agents.get(handoff.target.name)
        if target is None:  # handoffs reassigned after the Runner was built
            logger.warning("Handoff to unregistered agent %r refused", handoff.target.name)
            return error_result(f"agent {handoff.target.name!r} is not available"), None
        return f"Transferred to {target.name}", target
