"""Model prices the operator gives (``MODEL_PRICES``), and what tokens cost at them.

The file is JSON (or TOML, by its ``.toml`` suffix): per model name, USD per
million tokens::

    {"gpt-4o-mini": {"input": 0.15, "cached_input": 0.075, "output": 0.6}}

``input`` and ``output`` are required; ``cached_input`` is optional (cached
prompt tokens then cost ``input``: the operator's own number, the dearer
one). Reasoning tokens are completion tokens and cost ``output``. Prices are
never guessed: a model the file does not name has no cost (``None``), and
callers show "no price" for it.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bot.core.usage import UsageTotals

__all__ = [
    "NO_PRICE",
    "ModelPrice",
    "Prices",
    "cost_of",
    "cost_of_totals",
    "format_usd",
    "load_prices",
    "parse_prices",
]

NO_PRICE: Final = "no price"
"""Shown where tokens have no money value: a model ``MODEL_PRICES`` does not name."""

_PER: float = 1_000_000.0


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """One model's prices, USD per million tokens."""

    input: float
    """Prompt tokens."""
    output: float
    """Completion tokens (reasoning included)."""
    cached_input: float | None = None
    """Prompt tokens served from the provider's cache; ``None``: priced as ``input``."""


Prices = Mapping[str, ModelPrice]
"""Prices by model name, as the model is named in requests (``gpt-4o-mini``)."""


def _number(model: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{model!r}: {key!r} must be a number (USD per million tokens)")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{model!r}: {key!r} must be a finite number >= 0")
    return number


def parse_prices(data: Any) -> dict[str, ModelPrice]:
    """Check a decoded prices document; ``ValueError`` saying what is wrong."""
    if not isinstance(data, Mapping):
        raise ValueError("the file must hold an object: {model: {input, output, cached_input}}")
    prices: dict[str, ModelPrice] = {}
    for model, entry in data.items():
        if not isinstance(entry, Mapping):
            raise ValueError(f"{model!r}: expected an object with input and output prices")
        unknown = sorted(set(entry) - {"input", "cached_input", "output"})
        if unknown:
            raise ValueError(
                f"{model!r}: unknown key {unknown[0]!r} (use input, cached_input, output)"
            )
        for required in ("input", "output"):
            if required not in entry:
                raise ValueError(f"{model!r}: {required!r} is missing")
        cached = entry.get("cached_input")
        prices[str(model)] = ModelPrice(
            input=_number(model, "input", entry["input"]),
            output=_number(model, "output", entry["output"]),
            cached_input=None if cached is None else _number(model, "cached_input", cached),
        )
    return prices


def load_prices(path: Path) -> dict[str, ModelPrice]:
    """Read and check the prices file at ``path`` (blocking: at start or in a thread).

    ``ValueError`` in one line when it cannot be read or is malformed.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from exc
    try:
        data = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"{path} is not valid {kind}: {first}") from exc
    return parse_prices(data)


def cost_of(
    price: ModelPrice | None, *, prompt: int, cached_prompt: int, completion: int
) -> float | None:
    """USD for these tokens at ``price``; ``None`` without a price (never guessed)."""
    if price is None:
        return None
    cached = min(max(cached_prompt, 0), max(prompt, 0))
    cached_rate = price.input if price.cached_input is None else price.cached_input
    return (
        (prompt - cached) * price.input + cached * cached_rate + completion * price.output
    ) / _PER


def cost_of_totals(by_model: Mapping[str | None, UsageTotals], prices: Prices) -> float | None:
    """USD of usage summed by model; ``None`` if any model in it has no price (a partial
    sum would read as the whole cost)."""
    total = 0.0
    for model, totals in by_model.items():
        if not totals.total:
            continue
        cost = cost_of(
            prices.get(model) if model is not None else None,
            prompt=totals.prompt,
            cached_prompt=totals.cached_prompt,
            completion=totals.completion,
        )
        if cost is None:
            return None
        total += cost
    return total


def format_usd(cost: float | None) -> str:
    """``$0.0123`` (four decimals below a dollar, two above), or ``no price``."""
    if cost is None:
        return NO_PRICE
    return f"${cost:,.2f}" if cost >= 1 else f"${cost:.4f}"
