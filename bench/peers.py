"""The bench venv (``.venv-bench``): the peer libraries, kept out of the project's venv.

``ensure_peer_python()`` creates the venv on first use and installs
``bench/requirements.txt`` with pip (from the package registry), again only
when that file changes. The venv holds a ``.gitignore`` of ``*`` so git
never lists it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from bench.common import BENCH_DIR, ROOT

__all__ = ["PEER_VENV", "REQUIREMENTS", "PeerSetupError", "ensure_peer_python"]

PEER_VENV = Path(os.environ.get("BENCH_PEER_VENV") or ROOT / ".venv-bench")
"""Where the peers are installed (``BENCH_PEER_VENV`` overrides)."""
REQUIREMENTS = BENCH_DIR / "requirements.txt"
"""Pinned peer versions."""
INSTALL_TIMEOUT = 300


class PeerSetupError(RuntimeError):
    """The bench venv could not be created or filled."""


def _digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()


def ensure_peer_python() -> Path:
    """The bench venv's interpreter, with the pinned peers installed."""
    python = PEER_VENV / "bin" / "python"
    stamp = PEER_VENV / ".bench-installed"
    wanted = _digest()
    if python.exists() and stamp.exists() and stamp.read_text(encoding="utf-8").strip() == wanted:
        return python
    try:
        if not python.exists():
            print(f"creating {PEER_VENV.name} for the peer libraries ...", flush=True)
            subprocess.run(
                [sys.executable, "-m", "venv", str(PEER_VENV)],
                check=True,
                timeout=INSTALL_TIMEOUT,
            )
            (PEER_VENV / ".gitignore").write_text("*\n", encoding="utf-8")
        print(f"installing {REQUIREMENTS.relative_to(ROOT)} into {PEER_VENV.name} ...", flush=True)
        pip = subprocess.run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
                str(REQUIREMENTS),
            ],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise PeerSetupError(f"could not prepare {PEER_VENV}: {exc}") from exc
    if pip.returncode != 0:
        # pip's own warnings go to stderr too; show only the end, where the error is.
        tail = "\n".join((pip.stderr or pip.stdout).strip().splitlines()[-5:])
        raise PeerSetupError(f"pip could not install {REQUIREMENTS.name}:\n{tail}")
    stamp.write_text(wanted + "\n", encoding="utf-8")
    return python
