"""The README's table of settings, generated from ``bot.config.Settings``.

    python scripts/settings_table.py          # print the table
    python scripts/settings_table.py --write  # put it into README.md between its markers

``tests/test_settings_docs.py`` fails when the README's table, ``.env.example``
and ``Settings`` disagree, so a new setting is documented where operators look.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic.fields import FieldInfo

ROOT = Path(__file__).resolve().parents[1]
START = "<!-- settings:start (scripts/settings_table.py --write) -->"
END = "<!-- settings:end -->"


def _default(info: FieldInfo) -> str:
    value = info.get_default(call_default_factory=True)
    if value is None or value == frozenset() or value == "":
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`"


def _first_sentence(text: str | None) -> str:
    flat = " ".join((text or "").split())
    sentence = flat.split(". ")[0].rstrip(".")
    return sentence.replace("``", "`").replace("|", "\\|")


def settings_table() -> str:
    """One row per setting: name, default, what it does (its docstring's first sentence)."""
    from bot.config import Settings

    rows = ["| setting | default | what it does |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        rows.append(
            f"| `{name.upper()}` | {_default(info)} | {_first_sentence(info.description)} |"
        )
    return "\n".join(rows)


def with_table(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table``."""
    head, _, rest = readme.partition(START)
    _, found, tail = rest.partition(END)
    if not found:
        raise SystemExit(f"README.md lacks the markers {START!r} ... {END!r}")
    return f"{head}{START}\n{table}\n{END}{tail}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help="update README.md in place")
    args = parser.parse_args()
    table = settings_table()
    if not args.write:
        print(table)
        return 0
    readme = ROOT / "README.md"
    readme.write_text(with_table(readme.read_text(encoding="utf-8"), table), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
