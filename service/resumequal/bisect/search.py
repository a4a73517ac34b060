"""The two searches, over an oracle that qualifies one probe: pure, no I/O.

:func:`ddmin` is Zeller and Hildebrandt's delta debugging ("Simplifying and Isolating
Failure-Inducing Input", 2002) over the changes between a good and a bad pin: it finds a
subset of changes that still flips the verdict and from which no single change can be
dropped. A probe is three-valued: ``SAME`` (as the good pin), ``FLIP`` (as the bad pin) or
``UNRESOLVED`` (the resolver refused the mix, the qualification could not judge it, or it
ended a third way). An unresolved probe is never blamed; it only leaves the search less
sure. :func:`first_flip` is a binary search over pins in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    SAME = "same"
    FLIP = "flip"
    UNRESOLVED = "unresolved"


class BudgetSpent(Exception):  # a signal between the oracle and the search, no error
    """Raised by an oracle that may run no more probes: the search stops, undecided."""


Oracle = Callable[[frozenset[int]], Outcome]


@dataclass(frozen=True)
class Minimal:
    """What :func:`ddmin` found: ``culprits`` (indexes of changes) flip the verdict;
    ``decided`` when each one-smaller subset was probed and ended as the good pin, so every
    culprit is needed (1-minimal)."""

    culprits: tuple[int, ...]
    decided: bool
    why: str
    unsure: tuple[int, ...] = field(default=())  # culprits whose removal was unresolved


def split(items: Sequence[int], parts: int) -> list[list[int]]:
    """``items`` in ``parts`` contiguous runs, the longer ones first (sizes differ by ≤ 1)."""
    size, extra = divmod(len(items), parts)
    runs, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        runs.append(list(items[start:end]))
        start = end
    return runs


def ddmin(count: int, probe: Oracle) -> Minimal:
    """A 1-minimal flipping subset of ``range(count)`` changes.

    ``probe(subset)`` qualifies the good pin with the changes of ``subset`` applied. The
    empty set is the good pin and the whole set the bad pin: the caller has confirmed both
    (they are never probed here). Subsets are probed before complements, and complements
    only at a granularity above 2 (at 2 they are the other subset).
    """
    current, parts = list(range(count)), 2
    known: dict[frozenset[int], Outcome] = {frozenset(): Outcome.SAME,
                                            frozenset(current): Outcome.FLIP}

    def test(subset: Sequence[int]) -> Outcome:
        key = frozenset(subset)
        if key not in known:
            known[key] = probe(key)
        return known[key]

    try:
        while len(current) >= 2:
            runs = split(current, parts)
            found = next((r for r in runs if test(r) is Outcome.FLIP), None)
            if found is not None:
                current, parts = found, 2
                continue
            if parts > 2:
                rest = ([c for c in current if c not in r] for r in runs)
                found = next((r for r in rest if test(r) is Outcome.FLIP), None)
                if found is not None:
                    current, parts = found, max(parts - 1, 2)
                    continue
            if parts >= len(current):
                break
            parts = min(len(current), 2 * parts)
    except BudgetSpent:
        return Minimal(tuple(current), False, "the probe budget ran out before the set "
                       f"of {len(current)} change(s) could be made smaller")
    unsure = tuple(c for c in current
                   if known.get(frozenset(current) - {c}) is not Outcome.SAME)
    if unsure:
        return Minimal(tuple(current), False, "leaving out " + ", ".join(map(str, unsure)) +
                       " was never judged (unresolved): a smaller set may flip it", unsure)
    return Minimal(tuple(current), True, "every change of the set is needed: without any "
                   "one of them the verdict is the good pin's")


@dataclass(frozen=True)
class FirstFlip:
    """What :func:`first_flip` found: ``index`` is the first pin that flips, when decided;
    otherwise the flip lies in ``(good, bad]`` and the pins between could not be judged."""

    index: int | None
    good: int
    bad: int
    unjudged: tuple[int, ...]


def first_flip(count: int, probe: Callable[[int], Outcome]) -> FirstFlip:
    """Binary search over pins ``0 .. count-1``: pin 0 is good, pin ``count-1`` flips (the
    caller confirmed or assumed both). An unresolved pin is skipped (as ``git bisect
    skip``): the next probe is the untried pin nearest the middle of the interval."""
    good, bad = 0, count - 1
    unjudged: set[int] = set()
    try:
        while bad - good > 1:
            middle = (good + bad) / 2
            left = [i for i in range(good + 1, bad) if i not in unjudged]
            if not left:
                break
            pick = min(left, key=lambda i: (abs(i - middle), i))
            outcome = probe(pick)
            if outcome is Outcome.SAME:
                good = pick
            elif outcome is Outcome.FLIP:
                bad = pick
            else:
                unjudged.add(pick)
    except BudgetSpent:
        return FirstFlip(None, good, bad, tuple(sorted(unjudged)))
    between = tuple(sorted(i for i in unjudged if good < i < bad))
    return FirstFlip(None if between or bad - good > 1 else bad, good, bad, between)


__all__ = ["BudgetSpent", "FirstFlip", "Minimal", "Oracle", "Outcome", "ddmin", "first_flip",
           "split"]
