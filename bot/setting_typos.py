"""Variables that look like Chatflow settings but are none: the typos ``.env`` hides.

``Settings`` ignores names it does not know (the environment is shared with
everything else on the machine), so ``ACCES_MODE=pairing`` would leave the bot
open without a word. ``find_typos`` picks out the names an operator most likely
meant as settings: those of a family only Chatflow uses (``TELEGRAM_*``,
``WHATSAPP_*``, ``RATE_LIMIT*``, ...) and those within a few letters of a real
name, and suggests the closest real one (``difflib``). Only names are looked
at, never values.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from dotenv import dotenv_values

__all__ = ["SettingTypo", "find_typos", "setting_typos"]

_FAMILIES = (
    "TELEGRAM_",
    "WHATSAPP_",
    "ACCES",
    "ALLOWED_",
    "PAIRING_",
    "RATE_LIMIT",
    "CONSOLE_",
    "AGENTS_",
    "INSTANCE_",
    "GROUP_",
    "SHUTDOWN_",
    "TRANSCRIPTION_",
)
"""Prefixes only Chatflow's settings use: any other name with one is a mistake. Shared
prefixes (``HTTP_``, ``LOG_``, ``OPENAI_``, ``DATABASE_``...) count only when close."""
_CLOSE = 0.85
"""``difflib`` ratio from which a name counts as a near miss of a setting."""
_SUGGEST = 0.6
"""Lowest ratio at which a real name is still offered as the one meant."""


@dataclass(frozen=True, slots=True)
class SettingTypo:
    """A variable that is no setting, and the setting it most likely meant."""

    name: str
    suggestion: str | None

    def message(self) -> str:
        """``ACCES_MODE is not a setting; did you mean ACCESS_MODE?``"""
        if self.suggestion is None:
            return f"{self.name} is not a setting (see .env.example)"
        return f"{self.name} is not a setting; did you mean {self.suggestion}?"


def find_typos(names: Iterable[str], known: Collection[str]) -> list[SettingTypo]:
    """The ``names`` that look like one of ``known`` (upper case) without being one."""
    known_upper = sorted({k.upper() for k in known})
    typos: list[SettingTypo] = []
    for raw in sorted(set(names)):
        name = raw.upper()
        if name in known_upper:
            continue
        close = difflib.get_close_matches(name, known_upper, n=1, cutoff=_SUGGEST)
        near = bool(close) and difflib.SequenceMatcher(None, name, close[0]).ratio() >= _CLOSE
        if near or name.startswith(_FAMILIES):
            typos.append(SettingTypo(raw, close[0] if close else None))
    return typos


def setting_typos(known: Collection[str], env_file: Path = Path(".env")) -> list[SettingTypo]:
    """``find_typos`` over the process environment and the ``.env`` file's names."""
    names = set(os.environ)
    if env_file.is_file():
        names.update(dotenv_values(env_file))
    return find_typos(names, known)
