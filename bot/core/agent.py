"""Agents: instructions, a model, tools and handoffs."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.core.compaction import Compaction
from bot.core.mcp.servers import MCPServer
from bot.core.mcp.tools import MCPTool
from bot.core.models.base import ToolSpec
from bot.core.tools import FunctionTool, ToolContext, tool
from bot.core.voice import Voice
from bot.errors import ConfigurationError

__all__ = [
    "HANDOFF_PREFIX",
    "Agent",
    "FunctionTool",
    "HandoffTool",
    "ToolContext",
    "check_tool_names",
    "handoff_tool_name",
    "servers_of",
    "snake_case",
    "tool",
]

HANDOFF_PREFIX = "transfer_to_"
"""Prefix of every handoff tool name."""

_MAX_TOOL_NAME = 64


def snake_case(name: str) -> str:
    """``"OrderTracking"`` -> ``"order_tracking"``, ``"Billing Agent"`` -> ``"billing_agent"``.

    Accents are folded to ASCII (provider tool names allow ``[A-Za-z0-9_-]`` only);
    a name with no usable character becomes ``agent_<hash>``.
    """
    folded = unicodedata.normalize("NFKD", name)
    folded = "".join(ch for ch in folded if not unicodedata.combining(ch))
    folded = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", folded)
    folded = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", folded)
    snake = re.sub(r"[^A-Za-z0-9]+", "_", folded).strip("_").lower()
    if not snake:
        snake = "agent_" + hashlib.sha256(name.encode()).hexdigest()[:8]
    return snake


def handoff_tool_name(agent_name: str) -> str:
    """Name of the tool that hands the conversation to ``agent_name``: ``transfer_to_<snake>``."""
    name = HANDOFF_PREFIX + snake_case(agent_name)
    if len(name) > _MAX_TOOL_NAME:
        digest = hashlib.sha256(agent_name.encode()).hexdigest()[:8]
        name = name[: _MAX_TOOL_NAME - 9] + "_" + digest
    return name


def _empty_object_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}, "required": [], "additionalProperties": False}


@dataclass(frozen=True, eq=False)
class HandoffTool:
    """The tool that transfers the conversation to another agent."""

    name: str
    """``transfer_to_<snake_case(target.name)>``."""
    target: Agent
    """The agent that takes over."""

    @property
    def description(self) -> str:
        """What the model reads: who the target is and what it handles."""
        text = f"Hand the conversation over to the {self.target.name} agent."
        if self.target.handoff_description:
            text += f" {self.target.handoff_description}"
        return text

    def spec(self) -> ToolSpec:
        """This handoff as offered to the model (takes no arguments)."""
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=_empty_object_schema(),
            handoff_target=self.target.name,
        )


@dataclass(eq=False)
class Agent:
    """A persona the model plays: what it is told, what it may call, whom it may hand to."""

    name: str
    """Unique name within a Runner; stored in sessions as the active agent."""
    instructions: str
    """System prompt for this agent."""
    model: str | None = None
    """Model name (``"gpt-4o"``, ``"gemini-2.5-flash"``, ``"ollama/llama3"``,
    ``"offline"``); ``None`` uses the Runner's default."""
    tools: Sequence[FunctionTool | Callable[..., Any]] = field(default_factory=tuple)
    """Tools this agent may call (``@tool`` functions; plain functions are wrapped)."""
    handoffs: Sequence[Agent] = field(default_factory=tuple)
    """Agents this one may transfer the conversation to."""
    handoff_description: str | None = None
    """What this agent is for, shown to agents that may hand off to it."""
    mcp_servers: Sequence[MCPServer] = field(default_factory=tuple)
    """MCP servers whose tools this agent offers beside its own (``MCPServerStdio``,
    ``MCPServerStreamableHttp``); ``optional=True`` on a server lets the bot start
    without it."""
    vision: bool = True
    """Whether this agent's model sees images. With ``False`` an image reaches it as a
    line saying it cannot be seen, and the user is told so plainly."""
    stream: bool = True
    """Whether this agent's answers are shown as they are written (``STREAM_REPLIES``);
    ``False`` waits for the whole answer (typing only), e.g. for a model that is
    billed differently when streaming or an answer that must not be seen half-done."""
    voice: Voice | None = None
    """How this agent's replies are spoken (``Voice(mode=..., voice=..., model=...)``);
    ``None``, or a field left ``None``, takes ``VOICE_REPLIES``/``TTS_VOICE``/``TTS_MODEL``."""
    compaction: Compaction | None = None
    """When this agent's long conversations are summarised (``Compaction(trigger_tokens=...)``);
    ``None`` takes ``COMPACTION_TRIGGER_TOKENS`` & co., and without those only pruning runs."""
    memory: bool | int | None = None
    """The remembered facts shown after the instructions (``bot.core.long_memory``):
    ``None`` shows them (``MEMORY_PROMPT_CHARS`` at most) if the agent has a memory tool,
    ``False`` never, ``True`` always, a number of characters sets the bound."""

    def __post_init__(self) -> None:
        if not self.name or not self.name.strip():
            raise ValueError("Agent name must be non-empty")
        self.tools = tuple(
            item if isinstance(item, FunctionTool) else tool(item) for item in self.tools
        )
        self.handoffs = tuple(self.handoffs)
        self.mcp_servers = tuple(self.mcp_servers)
        self.validate()

    def validate(self) -> None:
        """Check tools and handoffs: right types, no two tools with one name.

        Runs at construction, and again in the Runner (handoffs may be assigned
        after construction to build cycles such as triage <-> billing).
        """
        for item in self.tools:
            if not isinstance(item, FunctionTool):
                raise TypeError(
                    f"Agent {self.name!r}: tools must be @tool functions, got {type(item).__name__}"
                )
        for target in self.handoffs:
            if not isinstance(target, Agent):
                raise TypeError(
                    f"Agent {self.name!r}: handoffs must be Agent objects, "
                    f"got {type(target).__name__}"
                )
        for server in self.mcp_servers:
            if not isinstance(server, MCPServer):
                raise TypeError(
                    f"Agent {self.name!r}: mcp_servers must be MCPServerStdio or "
                    f"MCPServerStreamableHttp objects, got {type(server).__name__}"
                )
        if self.voice is not None and not isinstance(self.voice, Voice):
            raise TypeError(f"Agent {self.name!r}: voice must be a Voice, not {self.voice!r}")
        if self.compaction is not None and not isinstance(self.compaction, Compaction):
            raise TypeError(
                f"Agent {self.name!r}: compaction must be a Compaction, not {self.compaction!r}"
            )
        if self.memory is not None and (not isinstance(self.memory, bool | int) or self.memory < 0):
            raise ValueError(
                f"Agent {self.name!r}: memory must be True, False, None or a number of "
                f"characters >= 0, not {self.memory!r}"
            )
        names: dict[str, str] = {}
        for item in self.function_tools:
            if item.name in names:
                raise ValueError(f"Agent {self.name!r} has two tools named {item.name!r}")
            names[item.name] = "tool"
        for handoff in self.handoff_tools:
            if handoff.name in names:
                raise ValueError(
                    f"Agent {self.name!r}: handoff tool {handoff.name!r} "
                    f"(to {handoff.target.name!r}) clashes with another tool or handoff"
                )
            names[handoff.name] = "handoff"

    @property
    def function_tools(self) -> tuple[FunctionTool, ...]:
        """This agent's function tools (``tools`` after wrapping)."""
        return tuple(item for item in self.tools if isinstance(item, FunctionTool))

    @property
    def handoff_tools(self) -> tuple[HandoffTool, ...]:
        """One ``transfer_to_<name>`` tool per agent in ``handoffs``."""
        return tuple(HandoffTool(handoff_tool_name(t.name), t) for t in self.handoffs)

    def find_tool(self, name: str) -> FunctionTool | None:
        """The function tool called ``name``, if this agent has it."""
        for item in self.function_tools:
            if item.name == name:
                return item
        return None

    @property
    def mcp_tools(self) -> tuple[MCPTool, ...]:
        """The tools of this agent's MCP servers, as last listed.

        A name already taken (a function tool, a handoff, an earlier server's
        tool) is left out: at start-up that clash is an error (``bot.core.
        mcp_lifecycle``), and a server that changes its tools later must not
        shadow one the agent already has.
        """
        if not self.mcp_servers:
            return ()  # the common case, on every model call
        taken = {t.name for t in self.function_tools} | {h.name for h in self.handoff_tools}
        tools: list[MCPTool] = []
        for server in self.mcp_servers:
            for item in server.tools:
                if item.name not in taken:
                    taken.add(item.name)
                    tools.append(item)
        return tuple(tools)

    def find_mcp_tool(self, name: str) -> MCPTool | None:
        """The MCP tool the model calls ``name``, if this agent's servers offer it."""
        for item in self.mcp_tools:
            if item.name == name:
                return item
        return None

    def find_handoff(self, name: str) -> HandoffTool | None:
        """The handoff tool called ``name``, if this agent has it."""
        for handoff in self.handoff_tools:
            if handoff.name == name:
                return handoff
        return None

    def tool_specs(self) -> list[ToolSpec]:
        """Every tool offered to the model for this agent: function tools, MCP tools, handoffs."""
        specs = [
            ToolSpec(name=t.name, description=t.description, parameters=t.params_json_schema)
            for t in self.function_tools
        ]
        # By name: a server may list its tools in another order after a reconnect, and
        # the tool list is part of the prompt prefix the provider caches.
        specs.extend(t.spec() for t in sorted(self.mcp_tools, key=lambda t: t.name))
        specs.extend(handoff.spec() for handoff in self.handoff_tools)
        return specs

    def reachable_agents(self) -> list[Agent]:
        """This agent and every agent reachable through handoffs, breadth first."""
        found: list[Agent] = [self]
        seen_ids = {id(self)}
        index = 0
        while index < len(found):
            for target in found[index].handoffs:
                if id(target) not in seen_ids:
                    seen_ids.add(id(target))
                    found.append(target)
            index += 1
        return found


def servers_of(agents: Iterable[Agent]) -> list[MCPServer]:
    """Every distinct MCP server the agents use, in order of first use."""
    found: list[MCPServer] = []
    seen: set[int] = set()
    for agent in agents:
        for server in agent.mcp_servers:
            if id(server) not in seen:
                seen.add(id(server))
                found.append(server)
    return found


def check_tool_names(agents: Iterable[Agent]) -> None:
    """Raise ``ConfigurationError`` for an MCP tool whose name an agent already uses.

    The message names both tools and where each comes from.
    """
    for agent in agents:
        owners: dict[str, str] = {t.name: f"function tool {t.name!r}" for t in agent.function_tools}
        for handoff in agent.handoff_tools:
            owners[handoff.name] = f"handoff {handoff.name!r} (to {handoff.target.name!r})"
        for server in agent.mcp_servers:
            for item in server.tools:
                here = f"MCP server {server.name!r} tool {item.mcp_name!r}"
                other = owners.get(item.name)
                if other is not None:
                    raise ConfigurationError(
                        f"Agent {agent.name!r}: {here} is offered as {item.name!r}, "
                        f"which clashes with {other}"
                    )
                owners[item.name] = here
