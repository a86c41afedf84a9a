"""Reading the sample data files shipped in ``agents/data/``.

They are package data, read through ``importlib.resources`` so they are found
wherever the package is installed. Each call reads the file again: edits show
up without a restart, and the files are small. Callers run this in a thread
(sync tools already do), never on the event loop.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["read_data_file"]

_PACKAGE = __name__.rpartition(".")[0]


def read_data_file(name: str) -> Any:
    """Parse ``data/<name>`` of this package as JSON.

    Raises ``FileNotFoundError`` or ``ValueError`` (bad JSON) with the file name.
    """
    resource = resources.files(_PACKAGE).joinpath("data", name)
    try:
        text = resource.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"agents data file {name!r} is missing") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"agents data file {name!r} is not valid JSON: {exc}") from exc
