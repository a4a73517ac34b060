"""How counts read in messages and reports: "1 rank", "2 ranks"."""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun, singular for exactly one: ``count(1, "rank") == "1 rank"``."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
