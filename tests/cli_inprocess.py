"""``python -m bot ARGS`` for the commands that only read and write the database, run
in the test process (``bot.cli.main`` on a thread of its own) instead of a subprocess.

A subprocess start costs about a second of CPU (the interpreter and ``import bot``);
the suite runs hundreds. Where a test's subject is what a command prints and does to
the database, not the process boundary, this runs the same ``main`` with the same
environment, working directory and standard streams the subprocess would have had,
and restores all of them (and the logging set-up ``main`` changes) afterwards.
Commands that load the operator's agents or start the bot always run as a subprocess
(``tests.test_cli._bot``), as does every command in ``tests/test_cli.py`` and
``tests/test_startup_errors.py``; end-to-end tests keep at least one real
``BotProcess.command`` per command family beside ``BotProcess.command_in_process``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.test_cli import _bot, _env

__all__ = ["IN_PROCESS", "LOADS_AGENTS", "Result", "cli", "in_process", "run_main"]

IN_PROCESS = frozenset({"usage", "pairing", "ledger", "sessions list", "sessions show", "send"})
"""Commands (or command and action) that run in the test process. (``send`` asks whether a
bot runs with an ``flock`` probe on a descriptor of its own, so a lock this process holds
counts as held elsewhere, as from another process.)"""

LOADS_AGENTS = frozenset({"sessions show"})
"""Of those, the ones that load the agents: in-process only with the shipped examples (no
``AGENTS_MODULE``, no ``agents/`` folder in the working directory), a module this
process has imported already; an operator's agents get a process of their own."""

Result = tuple[int, str, str]
"""Exit code, stdout and stderr."""

_LOCK = threading.Lock()
"""One in-process command at a time: the environment and working directory are global."""


def in_process(args: Sequence[str]) -> bool:
    """Whether ``python -m bot ARGS`` is one of the ``IN_PROCESS`` commands."""
    if "--help" in args:
        return True  # argparse prints it and exits before anything is read or started
    if not args or args[0].startswith("-"):
        return False
    return args[0] in IN_PROCESS or " ".join(args[:2]) in IN_PROCESS


@contextlib.contextmanager
def _logging_kept() -> Iterator[None]:
    """``main`` configures the root logger for the process: put it back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    levels = {
        name: logger.level
        for name, logger in logging.Logger.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, logger in logging.Logger.manager.loggerDict.items():
            if isinstance(logger, logging.Logger):
                logger.setLevel(levels.get(name, logging.NOTSET))


@contextlib.contextmanager
def _environment(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def _main(argv: list[str], stdin: str) -> Result:
    """``bot.cli.main(argv)`` with its own standard streams; what the process would exit
    with (an uncaught exception: 1 and its traceback on stderr, as Python does)."""
    from bot.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: --help, a usage error
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception:
        traceback.print_exc(file=err)
        code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return code, out.getvalue(), err.getvalue()


def run_main(args: Sequence[str], *, cwd: Path, env: dict[str, str], stdin: str = "") -> Result:
    """``python -m bot ARGS`` in this process with exactly ``env`` as its environment and
    ``cwd`` as its working directory: the exit code, stdout and stderr. Blocks; from a
    running event loop call it with ``asyncio.to_thread``."""
    result: list[Result] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(_main(list(args), stdin))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    with _LOCK, _logging_kept(), _environment(cwd, env):
        # A thread of its own: ``main`` runs ``asyncio.run``, and async tests call this
        # from inside their event loop (blocking it, as ``subprocess.run`` does).
        thread = threading.Thread(target=run, name=f"chatflow {' '.join(args)}")
        thread.start()
        thread.join(60)
        if thread.is_alive():
            raise AssertionError(f"python -m bot {' '.join(args)} did not end within 60 s")
    if failure:
        raise failure[0]
    return result[0]


def cli(
    tmp_path: Path, *args: str, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """Like ``tests.test_cli._bot``: in the test process for ``IN_PROCESS`` commands."""
    own_agents = "AGENTS_MODULE" in env or (tmp_path / "agents").exists()
    if not in_process(args) or (own_agents and " ".join(args[:2]) in LOADS_AGENTS):
        return _bot(tmp_path, *args, stdin=stdin, **env)
    code, out, err = run_main(args, cwd=tmp_path, env=_env(tmp_path, **env), stdin=stdin)
    return subprocess.CompletedProcess(["python", "-m", "bot", *args], code, out, err)
