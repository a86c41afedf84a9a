"""Finding the operator's agents: ``AGENTS_MODULE``, the project's ``agents/``, or the examples.

The engine claims no import name but ``bot``: a top-level ``agents`` package is
openai-agents' name. So the project's ``agents/`` folder is loaded by its path
(under a private module name, so ``import agents`` keeps meaning whatever it
means in that environment), and the example agents ship as
``bot.example_agents`` for a bot started anywhere else.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from bot.core.agent import Agent
from bot.errors import ConfigurationError

__all__ = [
    "EXAMPLE_AGENTS_MODULE",
    "PROJECT_AGENTS_MODULE",
    "LoadedAgents",
    "check_agent_graph",
    "load_agents",
]

logger = logging.getLogger(__name__)

EXAMPLE_AGENTS_MODULE = "bot.example_agents"
"""The example agents shipped inside the engine (the repository's ``agents/`` folder)."""
PROJECT_AGENTS_MODULE = "chatflow_project_agents"
"""The module name a project's ``agents/`` folder is loaded under."""


@dataclass(frozen=True)
class LoadedAgents:
    """The starting agent and where it came from."""

    starting_agent: Agent
    source: str
    """A module name or a folder, for start-up lines and ``doctor``."""


def load_agents(module_name: str | None = None, project_dir: Path | None = None) -> LoadedAgents:
    """``starting_agent`` of ``module_name``, else of ``<project_dir>/agents``, else the examples.

    ``project_dir`` defaults to the working directory, which is also put first on
    the import path for a named module (as ``python -m`` would), so
    ``AGENTS_MODULE=my_agents`` works from the ``chatflow`` script too.
    ``ConfigurationError`` (naming ``AGENTS_MODULE``) when nothing usable is found.
    """
    root = (project_dir or Path.cwd()).resolve()
    if module_name and _looks_like_a_path(module_name):
        # `AGENTS_MODULE=./agents`: what the operator means is that folder.
        folder = (root / module_name).resolve()
        if not (folder / "__init__.py").is_file():
            raise ConfigurationError(
                f"AGENTS_MODULE: {module_name!r} is a path, and {folder} is no package "
                "(no __init__.py); name a folder with one, or an importable module",
                setting="AGENTS_MODULE",
            )
        return _from_module(_import_folder(folder), str(folder))
    if module_name:
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        return _from_module(_import(module_name), module_name)
    folder = root / "agents"
    if (folder / "__init__.py").is_file():
        try:
            return _from_module(_import_folder(folder), str(folder))
        except ConfigurationError as exc:
            # AGENTS_MODULE is unset: the agents/ folder itself is to blame (N14).
            raise ConfigurationError(
                str(exc).removeprefix("AGENTS_MODULE: "), setting=None
            ) from exc.__cause__
    if importlib.util.find_spec(EXAMPLE_AGENTS_MODULE) is not None:
        return _from_module(_import(EXAMPLE_AGENTS_MODULE), EXAMPLE_AGENTS_MODULE)
    # A source checkout run without installing: the examples are the agents/
    # folder beside bot/.
    checkout = Path(__file__).resolve().parent.parent / "agents"
    if (checkout / "__init__.py").is_file():
        return _from_module(_import_folder(checkout), str(checkout))
    raise ConfigurationError(
        f"AGENTS_MODULE: not set, and no agents/ folder in {root}", setting="AGENTS_MODULE"
    )


def _looks_like_a_path(name: str) -> bool:
    return "/" in name or "\\" in name or name.startswith(".") or name.endswith(".py")


def _import(module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name is not None and module_name.split(".")[0] == exc.name.split(".")[0]:
            raise ConfigurationError(
                f"AGENTS_MODULE: cannot import {module_name!r} ({exc})", setting="AGENTS_MODULE"
            ) from exc
        raise _broken(module_name, exc) from exc  # the module itself imports something missing
    except Exception as exc:
        raise _broken(module_name, exc) from exc


def _import_folder(folder: Path) -> ModuleType:
    """Import ``folder`` as a package named ``PROJECT_AGENTS_MODULE`` (relative imports work)."""
    loaded = sys.modules.get(PROJECT_AGENTS_MODULE)
    if loaded is not None and Path(loaded.__file__ or "").parent == folder:
        return loaded
    spec = importlib.util.spec_from_file_location(
        PROJECT_AGENTS_MODULE, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if spec is None or spec.loader is None:  # pragma: no cover - a folder with __init__.py
        raise ConfigurationError(f"AGENTS_MODULE: cannot load {folder}", setting="AGENTS_MODULE")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PROJECT_AGENTS_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        _forget(PROJECT_AGENTS_MODULE)
        raise _broken(str(folder), exc) from exc
    except BaseException:
        _forget(PROJECT_AGENTS_MODULE)
        raise
    return module


def _forget(package: str) -> None:
    """Drop a half-imported package and its submodules, so a retry imports them afresh."""
    for name in [n for n in sys.modules if n == package or n.startswith(package + ".")]:
        del sys.modules[name]


def _broken(source: str, exc: BaseException) -> ConfigurationError:
    """One line for an error raised by the operator's agents code: where, what and why.

    ``orders.py:53: SyntaxError: invalid syntax`` rather than a traceback: the place
    is the innermost frame outside the import machinery (for a syntax error, the
    file and line the parser names).
    """
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}:{exc.lineno}: "
    else:
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename
        ]
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}: "
    reason = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    return ConfigurationError(
        f"AGENTS_MODULE: the agents in {source} failed to load: "
        f"{where}{type(exc).__name__}: {reason}".replace("\n", " "),
        setting="AGENTS_MODULE",
    )


def _from_module(module: ModuleType, source: str) -> LoadedAgents:
    agent = getattr(module, "starting_agent", None)
    if not isinstance(agent, Agent):
        where = getattr(module, "__file__", None) or source
        raise ConfigurationError(
            f"AGENTS_MODULE: {source!r} ({where}) has no `starting_agent` Agent",
            setting="AGENTS_MODULE",
        )
    check_agent_graph(agent, source)
    logger.debug("Agents from %s", source)
    return LoadedAgents(agent, source)


def check_agent_graph(starting_agent: Agent, source: str) -> None:
    """Every agent reachable from ``starting_agent`` is valid and has a name of its own.

    Handoffs may be assigned after construction (to build cycles), so this is
    checked once the module has run: a ``ConfigurationError`` names the agent and
    what is wrong (two agents called "Billing", a handoff to something that is
    not an ``Agent``, two tools with one name).
    """
    agents: list[Agent] = []
    pending: list[object] = [starting_agent]
    while pending:
        item = pending.pop()
        if not isinstance(item, Agent) or any(item is known for known in agents):
            continue  # a handoff that is no Agent: validate() below names it
        agents.append(item)
        pending.extend(item.handoffs)
    names: dict[str, Agent] = {}
    for agent in agents:
        if agent.name in names:
            raise ConfigurationError(
                f"AGENTS_MODULE: two different agents in {source} are named {agent.name!r}; "
                "agent names must be unique (they are stored with each conversation)",
                setting="AGENTS_MODULE",
            )
        names[agent.name] = agent
    for agent in agents:
        try:
            agent.validate()
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"AGENTS_MODULE: {source}: {exc}", setting="AGENTS_MODULE"
            ) from exc
