"""Variables that look like Chatflow settings but are none: the typos ``.env`` hides.

``Settings`` ignores names it does not know (the environment is shared with
everything else on the machine), so ``ACCES_MODE=pairing`` would leave the bot
open without a word. ``find_typos`` picks out the names an operator most likely
meant as settings: those of a family only Chatflow uses (``TELEGRAM_*``,
``WHATSAPP_*``, ``RATE_LIMIT*``, ...) and those within a few letters of a real
name, and suggests the closest real one (``difflib``). Only names are looked
at, never values.

A near miss of a *security* setting (``ACCES_MODE``, ``ALLOWED_USER``,
``CONSOLE_TOKN``...) is fatal: the setting it meant is unset, so the bot would
start more open than the operator asked. ``python -m bot`` stops with one line,
and doctor FAILs. Near misses are found by edit distance (two letters added,
dropped, changed or swapped) as well as by ``difflib``'s ratio; a few names other
products use for a setting (Meta's ``WHATSAPP_PHONE_NUMBER_ID``) are known aliases.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from dotenv import dotenv_values

from bot.errors import ConfigurationError

__all__ = [
    "SECURITY_SETTINGS",
    "SettingTypo",
    "find_typos",
    "refuse_fatal_typos",
    "setting_typos",
    "typo_hints",
]

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
_EDITS = 2
"""Edit distance up to which a name counts as a near miss (names of 6 letters or more)."""
_ALIASES = {
    "WHATSAPP_PHONE_NUMBER_ID": "WHATSAPP_PHONE_ID",
    "TELEGRAM_TOKEN": "TELEGRAM_BOT_TOKEN",
}
"""Names other tools (Meta's docs, other bots) give a setting Chatflow names otherwise."""

SECURITY_SETTINGS = frozenset(
    {
        "ACCESS_MODE",
        "ALLOWED_USERS",
        "ALLOWED_CHATS",
        "CONSOLE_TOKEN",
        "PAIRING_CODE_TTL_SECONDS",
        "RATE_LIMIT_MESSAGES",
        "RATE_LIMIT_WINDOW_SECONDS",
        "MAX_TOKENS_PER_SENDER_PER_DAY",
        "TELEGRAM_WEBHOOK_SECRET",
        "WHATSAPP_APP_SECRET",
        "WHATSAPP_VERIFY_TOKEN",
        "FORWARDED_ALLOW_IPS",
    }
)
"""Settings whose absence leaves the bot more open than asked: a typo of one is fatal."""


@dataclass(frozen=True, slots=True)
class SettingTypo:
    """A variable that is no setting, and the setting it most likely meant."""

    name: str
    suggestion: str | None

    @property
    def fatal(self) -> bool:
        """Whether the setting meant guards access: the bot must not start without it."""
        return self.suggestion in SECURITY_SETTINGS

    def message(self) -> str:
        """``ACCES_MODE is not a setting; did you mean ACCESS_MODE?``"""
        if self.suggestion is None:
            return f"{self.name} is not a setting (see .env.example)"
        return f"{self.name} is not a setting; did you mean {self.suggestion}?"


def edit_distance(a: str, b: str) -> int:
    """Letters added, dropped, changed or swapped with a neighbour to turn ``a`` into ``b``."""
    previous2: list[int] = []
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], previous2[j - 2] + 1)
        previous2, previous = previous, row
    return previous[-1]


def _nearest(name: str, known_upper: list[str]) -> str | None:
    """The setting ``name`` is a near miss of by edit distance, if any (the closest)."""
    if len(name) < 6:
        return None
    best, best_distance = None, _EDITS + 1
    for candidate in known_upper:  # sorted: of equally near names, the first
        if abs(len(candidate) - len(name)) > _EDITS:
            continue  # more letters apart than edits allowed: no need to count them
        distance = edit_distance(name, candidate)
        if distance < best_distance:
            best, best_distance = candidate, distance
    return best


def find_typos(names: Iterable[str], known: Collection[str]) -> list[SettingTypo]:
    """The ``names`` that look like one of ``known`` (upper case) without being one."""
    known_upper = sorted({k.upper() for k in known})
    typos: list[SettingTypo] = []
    for raw in sorted(set(names)):
        name = raw.upper()
        if name in known_upper:
            continue
        alias = _ALIASES.get(name)
        if alias is not None and alias in known_upper:
            typos.append(SettingTypo(raw, alias))
            continue
        nearest = _nearest(name, known_upper)
        if nearest is not None:
            typos.append(SettingTypo(raw, nearest))
            continue
        close = difflib.get_close_matches(name, known_upper, n=1, cutoff=_SUGGEST)
        near = bool(close) and difflib.SequenceMatcher(None, name, close[0]).ratio() >= _CLOSE
        if near or name.startswith(_FAMILIES):
            typos.append(SettingTypo(raw, close[0] if close else None))
    return typos


def refuse_fatal_typos(typos: Iterable[SettingTypo]) -> None:
    """Raise ``ConfigurationError`` (one line) if a typo left a security setting unset."""
    fatal = [typo for typo in typos if typo.fatal]
    if fatal:
        raise ConfigurationError(
            "; ".join(typo.message() for typo in fatal)
            + " (a security setting: fix the name, the bot does not start without it)",
            setting=fatal[0].suggestion,
        )


def typo_hints(message: str, typos: Iterable[SettingTypo]) -> str:
    """``message`` with the typos that meant a setting it names (``X is missing``)."""
    hints = [
        f"{typo.name} is set: did you mean {typo.suggestion}?"
        for typo in typos
        if typo.suggestion is not None and typo.suggestion in message
    ]
    return message if not hints else f"{message}; {' '.join(hints)}"


def setting_typos(known: Collection[str], env_file: Path = Path(".env")) -> list[SettingTypo]:
    """``find_typos`` over the process environment and the ``.env`` file's names."""
    names = set(os.environ)
    if env_file.is_file():
        names.update(dotenv_values(env_file))
    return find_typos(names, known)
