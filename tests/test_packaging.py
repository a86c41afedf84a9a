"""The installed distribution, met the way an operator meets it (issue 13, item 2).

A real, non-editable install of this repository is built once (offline, into a
temporary ``site`` folder) and the bot is run from it as subprocesses, beside
openai-agents: ``python -m bot chat`` with piped input must be answered by the
operator's own ``agents/`` folder, by ``AGENTS_MODULE``, or by the shipped
examples, must exit at the end of input, and ``import agents`` must stay
openai-agents' package (bug B2 of the 2026-12-01 review).

Isolation. The dev venv holds an *editable* install of this very repository:
a ``.pth`` file in its site-packages puts a meta-path finder that maps ``bot``
(and ``bot.example_agents``) to the checkout. That finder sits after the
ordinary path finder, so ``bot`` itself would come from the temporary site,
but any module or package the install forgot would then be filled in from the
checkout without a sound (``bot.<missing>`` is looked up in the finder's
mapping after the install's ``bot`` has no such file). So the subprocesses run
``python -S -P``: ``-S`` skips ``site`` and with it every ``.pth`` file (the
editable finder is never installed), ``-P`` keeps the working directory (and a
script's folder) off ``sys.path``, and ``PYTHONPATH`` is exactly the temporary
site followed by the dev venv's site-packages (the dependencies, openai-agents
among them). The first test checks that this holds: every ``bot`` module comes
from the temporary site and no editable finder is loaded. The environment is
built from scratch, so no API key, ``AGENTS_MODULE`` or ``PYTHONPATH`` of the
caller leaks in, and the bot answers with its offline demo model.

The build runs from a copy of the working tree (runtime and build leftovers
left out), so it never writes ``build/`` or ``*.egg-info`` into the checkout
and a stale ``build/lib`` can never supply a file the configuration forgot.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parent.parent
EXIT_TIMEOUT = 30.0
"""Seconds a piped chat (or a probe) may take before it counts as hanging."""
BUILD_TIMEOUT = 180.0
OFFLINE_LABEL = "[offline demo] "
"""What every reply of the offline demo model starts with (bot.core.models.offline)."""

_LEFT_OUT_AT_TOP = frozenset({"build", "dist", "data"})
"""Top-level build output and the runtime ``data/`` folder (not ``agents/data``)."""


@dataclass(frozen=True)
class Install:
    """A non-editable install of the repository and how to run Python against it."""

    site: Path
    pythonpath: str
    """The temporary site, then the dev venv's site-packages."""
    venv_site_packages: tuple[Path, ...]
    home: Path


def _copy_ignore(directory: str, names: list[str]) -> set[str]:
    left_out = {
        name
        for name in names
        if name.startswith(".") or name == "__pycache__" or name.endswith((".egg-info", ".pyc"))
    }
    if Path(directory).resolve() == REPO_ROOT:
        left_out |= _LEFT_OUT_AT_TOP.intersection(names)
    return left_out


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """``pip install --no-deps --no-build-isolation --no-index --target <tmp>/site <repo>``."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "source"
    shutil.copytree(REPO_ROOT, source, ignore=_copy_ignore)
    site = root / "site"
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "--disable-pip-version-check",
        "--no-cache-dir",
        "--target",
        str(site),
        str(source),
    ]
    env = {**os.environ, "PIP_NO_INPUT": "1", "PIP_CONFIG_FILE": os.devnull}
    try:
        built = subprocess.run(
            command, capture_output=True, text=True, timeout=BUILD_TIMEOUT, env=env, check=False
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"pip install --target did not finish in {BUILD_TIMEOUT:.0f} s: {exc}")
    assert built.returncode == 0, f"the install failed:\n{built.stdout}\n{built.stderr}"
    site_packages = tuple(
        dict.fromkeys(Path(sysconfig.get_path(key)).resolve() for key in ("purelib", "platlib"))
    )
    _compile_probe_dependencies()
    home = root / "home"
    home.mkdir()
    return Install(
        site=site.resolve(),
        pythonpath=os.pathsep.join([str(site.resolve()), *map(str, site_packages)]),
        venv_site_packages=site_packages,
        home=home,
    )


_PROBE_DEPENDENCIES = ("agents", "griffe")
"""Top-level packages the probe imports from the dev venv that nothing else in the suite
imports (so, with the venv installed ``--no-compile``, nothing wrote their bytecode)."""


def _compile_probe_dependencies() -> None:
    """Byte-compile the probe's venv-only dependencies once, as a compiled install would.

    The subprocesses run with ``PYTHONDONTWRITEBYTECODE``, so without this every run of
    the probe compiles openai-agents from source again (seconds of CPU). Up-to-date files
    are skipped; the code imported is the same.
    """
    providers = metadata.packages_distributions()
    for top in _PROBE_DEPENDENCIES:
        for name in providers.get(top, []):
            folder = Path(str(metadata.distribution(name).locate_file(top)))
            if (folder / "__init__.py").is_file():
                compileall.compile_dir(folder, quiet=1, workers=1)


def _environment(install: Install, data_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """A from-scratch environment: no API key, no AGENTS_MODULE unless given, offline."""
    env = {
        "PATH": os.environ.get("PATH", os.defpath),
        "HOME": str(install.home),
        "PYTHONPATH": install.pythonpath,
        "PYTHONUTF8": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "DATA_DIR": str(data_dir),
    }
    env.update(extra)
    return env


def _python(
    install: Install,
    args: Sequence[str],
    *,
    cwd: Path,
    data_dir: Path,
    stdin: str = "",
    extra_env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -S -P <args>`` against the install; fail if it has not exited in time.

    ``input=`` makes standard input a pipe that is closed after ``stdin``:
    the bot sees the end of input exactly as from ``echo hi | python -m bot chat``.
    """
    command = [sys.executable, "-S", "-P", *args]
    try:
        return subprocess.run(
            command,
            input=stdin,
            capture_output=True,
            text=True,
            cwd=cwd,
            env=_environment(install, data_dir, extra_env or {}),
            timeout=EXIT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{' '.join(args)} did not exit within {EXIT_TIMEOUT:.0f} s of the end of its "
            f"piped input (it idles at EOF)\nstdout:\n{exc.stdout!r}\nstderr:\n{exc.stderr!r}"
        )


def _under(path: str | Path, folder: Path) -> bool:
    return Path(path).resolve().is_relative_to(folder)


_PROBE = textwrap.dedent(
    """\
    import json, sys
    from importlib import resources

    import bot, bot.cli, bot.platforms, bot.platforms.console, bot.example_agents
    import agents

    report = {
        "bot": bot.__file__,
        "bot.cli": bot.cli.__file__,
        "bot.platforms": bot.platforms.__file__,
        "bot.platforms.console": bot.platforms.console.__file__,
        "bot.example_agents": bot.example_agents.__file__,
        "example_data": sorted(
            entry.name
            for entry in resources.files("bot.example_agents").joinpath("data").iterdir()
        ),
        "agents": agents.__file__,
        "agents_is_openai_agents": all(
            hasattr(agents, name) for name in ("Runner", "function_tool", "Agent")
        ),
        "meta_path": [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path],
        "sys_path": sys.path,
    }
    try:
        import platforms
    except ModuleNotFoundError as exc:
        report["platforms"] = "ModuleNotFoundError: " + str(exc.name)
    else:
        report["platforms"] = platforms.__file__
    print(json.dumps(report))
    """
)


def test_the_install_is_what_runs_and_import_agents_is_openai_agents(
    install: Install, tmp_path: Path
) -> None:
    """From an empty directory: ``bot`` is the install, ``agents`` is openai-agents."""
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _python(install, ["-c", _PROBE], cwd=empty, data_dir=tmp_path / "data")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)

    for module in (
        "bot",
        "bot.cli",
        "bot.platforms",
        "bot.platforms.console",
        "bot.example_agents",
    ):
        assert _under(report[module], install.site), (module, report[module])
    assert not any("editable" in name.lower() for name in report["meta_path"]), report
    assert str(empty) not in report["sys_path"] and "" not in report["sys_path"], report
    assert report["example_data"] == ["invoices.json", "orders.json"]

    # openai-agents' own file, as its installed metadata records it.
    expected = Path(str(metadata.distribution("openai-agents").locate_file("agents/__init__.py")))
    assert Path(report["agents"]).resolve() == expected.resolve(), report["agents"]
    assert any(_under(report["agents"], folder) for folder in install.venv_site_packages)
    assert not _under(report["agents"], install.site)
    assert not _under(report["agents"], REPO_ROOT / "agents")
    assert report["agents_is_openai_agents"], report["agents"]

    assert report["platforms"] == "ModuleNotFoundError: platforms", report["platforms"]


def test_the_install_claims_only_bot_and_declares_the_chatflow_script(install: Install) -> None:
    """One top-level import name; ``chatflow`` is ``bot.cli:main``."""
    (dist,) = (
        d for d in metadata.distributions(path=[str(install.site)]) if d.name == "chatflow-bot"
    )
    assert (dist.read_text("top_level.txt") or "").split() == ["bot"]
    # RECORD also lists the dist-info and the generated script (``../../bin/chatflow``
    # under pip --target): everything else must live under bot/.
    tops = {Path(str(f)).parts[0] for f in dist.files or ()}
    assert {t for t in tops if t != ".." and not t.endswith(".dist-info")} == {"bot"}, tops
    (script,) = dist.entry_points.select(group="console_scripts", name="chatflow")
    assert script.value == "bot.cli:main"


def _entry_point_launcher(install: Install) -> list[str]:
    """What the ``chatflow`` script does, built from the installed entry point."""
    (dist,) = (
        d for d in metadata.distributions(path=[str(install.site)]) if d.name == "chatflow-bot"
    )
    (script,) = dist.entry_points.select(group="console_scripts", name="chatflow")
    return ["-c", f"import sys, {script.module} as m; sys.exit(m.{script.attr}())"]


FRONT_DESK_INIT = '''\
"""The operator's own agents: one front desk with one tool."""

from bot import Agent

from .hours import opening_hours

starting_agent = Agent(
    name="Front Desk",
    instructions="You are the front desk of a small bike shop. Answer briefly.",
    tools=(opening_hours,),
)
'''

FRONT_DESK_HOURS = '''\
from bot import tool


@tool
def opening_hours() -> str:
    """When the shop is open."""
    return "Mon-Fri 9:00-17:00 (the operator's own tool)"
'''

MY_AGENTS = '''\
"""Agents named by AGENTS_MODULE=my_agents."""

from bot import Agent

starting_agent = Agent(name="Concierge", instructions="Answer briefly.")
'''


@dataclass(frozen=True)
class Scenario:
    """A project directory, its environment, the piped lines and the replies owed."""

    files: Mapping[str, str]
    lines: Sequence[str]
    replies: Sequence[tuple[str, str]]
    """(answering agent, a fragment of its reply), one per input line, in order."""
    env: Mapping[str, str] = field(default_factory=dict)
    entry_point: bool = False
    """Start through the ``chatflow`` entry point instead of ``python -m bot``."""


SCENARIOS = [
    Scenario(
        files={"agents/__init__.py": FRONT_DESK_INIT, "agents/hours.py": FRONT_DESK_HOURS},
        lines=["What are your opening hours?", "hello"],
        replies=[
            ("Front Desk", "I checked opening hours: Mon-Fri 9:00-17:00 (the operator's own tool)"),
            ("Front Desk", 'Front Desk here. You said: "hello".'),
        ],
    ),
    Scenario(
        files={},
        lines=["Hello", "Where is my order #1001?"],
        replies=[
            ("Triage", 'Triage here. You said: "Hello".'),
            # The handoff and the tool reading the shipped data/orders.json.
            ("Order Tracking", "status: shipped, carrier: DHL Express"),
        ],
    ),
    Scenario(
        # AGENTS_MODULE wins over the agents/ folder beside it; the chatflow script's
        # working directory is not on sys.path by itself (-P), the loader puts it there.
        files={
            "my_agents.py": MY_AGENTS,
            "agents/__init__.py": FRONT_DESK_INIT,
            "agents/hours.py": FRONT_DESK_HOURS,
        },
        lines=["hello", "Are you open?"],
        replies=[
            ("Concierge", 'Concierge here. You said: "hello".'),
            ("Concierge", 'Concierge here. You said: "Are you open?".'),
        ],
        env={"AGENTS_MODULE": "my_agents"},
        entry_point=True,
    ),
]


@pytest.mark.parametrize(
    "scenario",
    SCENARIOS,
    ids=["project-agents-folder", "example-agents", "agents-module-via-entry-point"],
)
def test_piped_chat_is_answered_and_exits_at_end_of_input(
    install: Install, tmp_path: Path, scenario: Scenario
) -> None:
    """``printf 'lines' | python -m bot chat`` from a project directory."""
    project = tmp_path / "project"
    project.mkdir()
    for name, text in scenario.files.items():
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    launcher = _entry_point_launcher(install) if scenario.entry_point else ["-m", "bot"]

    done = _python(
        install,
        [*launcher, "chat"],
        cwd=project,
        data_dir=tmp_path / "data",
        stdin="".join(f"{line}\n" for line in scenario.lines),
        extra_env=scenario.env,
    )

    assert done.returncode == 0, done.stderr
    replies = done.stdout.splitlines()
    assert len(replies) == len(scenario.replies), (done.stdout, done.stderr)
    for reply, (agent, fragment) in zip(replies, scenario.replies, strict=True):
        assert reply.startswith(f"[{agent}] {OFFLINE_LABEL}"), (reply, done.stderr)
        assert fragment in reply, (reply, done.stderr)


def test_a_single_piped_line_is_answered_before_exit(install: Install, tmp_path: Path) -> None:
    """``echo hello | python -m bot chat``: the one line is answered, then the bot exits.

    The end of input comes while start-up recovery may still run: the line was
    accepted "early" and must still be answered before the exit (at commit 56cafe9
    ``Gateway.stop`` cancelled recovery and the line was left unanswered).
    """
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _python(
        install, ["-m", "bot", "chat"], cwd=empty, data_dir=tmp_path / "data", stdin="hello\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"[Triage] {OFFLINE_LABEL}Triage here."), done.stderr
