"""Near misses of setting names (``bot.setting_typos``)."""

from __future__ import annotations

from bot.config import Settings
from bot.setting_typos import _EDITS, edit_distance, find_typos

KNOWN = sorted(name.upper() for name in Settings.model_fields)


def brute_nearest(name: str) -> str | None:
    """The nearest setting by edit distance over every name, ties to the first."""
    best = min(KNOWN, key=lambda k: (edit_distance(name, k), k))
    return best if edit_distance(name, best) <= _EDITS else None


def test_a_near_miss_names_the_nearest_setting_as_a_search_of_every_name_would() -> None:
    names = ["ACCES_MODE", "ALLOWED_USER", "CONSOLE_TOKN", "ACCESS_MODEXY", "MAX_TOKNS"]
    typos = {typo.name: typo.suggestion for typo in find_typos(names, KNOWN)}
    for name in names:
        expected = brute_nearest(name)
        if expected is not None:
            assert typos[name] == expected
    assert typos["ACCES_MODE"] == "ACCESS_MODE"
    assert typos["CONSOLE_TOKN"] == "CONSOLE_TOKEN"


def test_a_name_more_letters_apart_than_the_edits_allowed_is_no_near_miss() -> None:
    assert edit_distance("ACCESS_MODE", "ACCESS_MODE_XYZ") == 4
    assert find_typos(["SOME_OTHER_TOOLS_NAME"], ["SOME_OTHER_TOOL"]) == []
