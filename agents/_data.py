"""Reading the sample data files shipped in ``agents/data/``.

They are package data, read through ``importlib.resources`` so they are found
wherever the package is installed. Each call reads the file again: edits show
up without a restart, and the files are small. Callers run this in a thread
(sync tools already do), never on the event loop.

Dates in the sample files may be written relative to the day they are read
(``"today"``, ``"today+3"``, ``"today-10"``), so the demo's deliveries are
always due soon and its invoices recent; ``SampleDate`` reads them (an ISO
date such as ``"2026-03-01"`` works too).
"""

from __future__ import annotations

import json
import re
from datetime import date, timedelta
from importlib import resources
from typing import Annotated, Any

from pydantic import BeforeValidator

__all__ = ["SampleDate", "read_data_file"]

_PACKAGE = __name__.rpartition(".")[0]
_RELATIVE_DATE = re.compile(r"today\s*(?:([+-])\s*(\d{1,5}))?", re.IGNORECASE)


def _relative_date(value: Any) -> Any:
    """``"today+3"`` -> the date three days from today; anything else is left to pydantic."""
    if not isinstance(value, str):
        return value
    match = _RELATIVE_DATE.fullmatch(value.strip())
    if match is None:
        return value
    days = int(match.group(2) or 0)
    return date.today() + timedelta(days=-days if match.group(1) == "-" else days)


SampleDate = Annotated[date, BeforeValidator(_relative_date)]
"""A date in a sample data file: ISO, or relative to today (``"today-10"``)."""


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
