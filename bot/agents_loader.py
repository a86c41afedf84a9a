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
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from bot.core.agent import Agent
from bot.errors import ConfigurationError

__all__ = ["EXAMPLE_AGENTS_MODULE", "PROJECT_AGENTS_MODULE", "LoadedAgents", "load_agents"]

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
    if module_name:
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        return _from_module(_import(module_name), module_name)
    folder = root / "agents"
    if (folder / "__init__.py").is_file():
        return _from_module(_import_folder(folder), str(folder))
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


def _import(module_name: str) -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"AGENTS_MODULE: cannot import {module_name!r} ({exc})", setting="AGENTS_MODULE"
        ) from exc


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
    except ImportError as exc:
        del sys.modules[PROJECT_AGENTS_MODULE]
        raise ConfigurationError(
            f"AGENTS_MODULE: cannot import {folder} ({exc})", setting="AGENTS_MODULE"
        ) from exc
    except BaseException:
        del sys.modules[PROJECT_AGENTS_MODULE]
        raise
    return module


def _from_module(module: ModuleType, source: str) -> LoadedAgents:
    agent = getattr(module, "starting_agent", None)
    if not isinstance(agent, Agent):
        raise ConfigurationError(
            f"AGENTS_MODULE: {source!r} has no `starting_agent` Agent", setting="AGENTS_MODULE"
        )
    logger.info("Agents from %s", source)
    return LoadedAgents(agent, source)
