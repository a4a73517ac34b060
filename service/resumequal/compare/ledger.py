"""The data ledger of a resize run: which records of a step count, and what they consumed.

A leg that resizes runs a step on another number of ranks than the reference leg, and
may run it more than once (a restart redoes the steps after its checkpoint), so records
are not compared rank by rank. The records of a step that count are those of the latest
attempt that wrote it, one per rank of the world that attempt ran on (never a merge per
rank: that would mix a stale rank's record of an earlier attempt in). A step's global
microbatch ``j`` holds the same samples at any world size, so the ledger compares them by
global index, and the loss with them.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from resumequal.compare.files import LegTrace
from resumequal.trace.records import MicrostepRecord, StepRecord
from resumequal.words import count

# How many sample ids a ledger detail shows of each kind.
_EXAMPLES = 3


@dataclass(frozen=True)
class StepRecords:
    """The authoritative records of one step: its latest attempt's, by rank."""

    step: int
    attempt: int
    records: Mapping[int, StepRecord]

    @property
    def world_size(self) -> int | None:
        """The world the records say they ran on (None: they do not say, or disagree)."""
        sizes = {r.world_size for r in self.records.values()}
        return sizes.pop() if len(sizes) == 1 else None

    def microbatches(self) -> Iterable[tuple[int, MicrostepRecord]]:
        """(rank, microbatch) of every microbatch the step ran."""
        for rank, record in sorted(self.records.items()):
            for m in record.microsteps:
                yield rank, m


def authoritative(leg: LegTrace) -> dict[int, StepRecords]:
    """Step -> the records of the latest attempt that wrote that step."""
    by_step: dict[int, dict[int, dict[int, StepRecord]]] = {}  # step -> attempt -> rank
    for record in leg.of(StepRecord):
        by_step.setdefault(record.step, {}).setdefault(record.attempt, {})[record.rank] = record
    out = {}
    for step, attempts in sorted(by_step.items()):
        latest = max(attempts)
        out[step] = StepRecords(step, latest, dict(sorted(attempts[latest].items())))
    return out


def as_steps(records: Mapping[int, StepRecords]) -> dict[int, dict[int, StepRecord]]:
    """Rank -> step -> record, the shape the boundary walk and loss deltas take."""
    out: dict[int, dict[int, StepRecord]] = {}
    for step, s in records.items():
        for rank, record in s.records.items():
            out.setdefault(rank, {})[step] = record
    return out


def _examples(ids: Counter[int]) -> str:
    shown = [f"{i}" if n == 1 else f"{i} x{n}" for i, n in sorted(ids.items())[:_EXAMPLES]]
    more = " …" if len(ids) > _EXAMPLES else ""
    return f"e.g. {', '.join(shown)}{more}"


@dataclass(frozen=True)
class LedgerStep:
    """What one step of the resized leg consumed, against the reference leg's step."""

    step: int
    missing: Counter[int]  # ids the reference consumed that this leg did not (as often)
    duplicated: Counter[int]  # ids consumed more often than by the reference
    foreign: Counter[int]  # ids the reference never consumed in this step
    indices_missing: list[int]
    indices_repeated: list[int]
    # Global indices whose samples differ from the reference's at the same index, and the
    # rank that ran the first of them.
    other_samples: list[int]
    first_rank: int | None

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicated or self.foreign or self.indices_missing
                    or self.indices_repeated or self.other_samples)

    def words(self) -> str:
        """E.g. "step 5: 2 sample id(s) missing (e.g. 3, 7), 2 duplicated (e.g. 1 x2 …)"."""
        parts = []
        if self.missing:
            parts.append(f"{count(self.missing.total(), 'sample id')} missing "
                         f"({_examples(self.missing)})")
        if self.duplicated:
            parts.append(f"{self.duplicated.total()} consumed once too often "
                         f"({_examples(self.duplicated)})")
        if self.foreign:
            parts.append(f"{self.foreign.total()} not in the control's step "
                         f"({_examples(self.foreign)})")
        if self.indices_missing:
            parts.append(f"global microbatch(es) {_indices(self.indices_missing)} not run")
        if self.indices_repeated:
            parts.append(f"global microbatch(es) {_indices(self.indices_repeated)} run more "
                         "than once")
        if self.other_samples:
            many = count(len(self.other_samples), "global microbatch", "global microbatches")
            parts.append(f"{many} with other "
                         f"samples than the control's at the same index "
                         f"({_indices(self.other_samples)})")
        return f"step {self.step}: " + ", ".join(parts)


def _indices(xs: list[int]) -> str:
    shown = ", ".join(map(str, xs[:_EXAMPLES]))
    return shown + (" …" if len(xs) > _EXAMPLES else "")


def _by_index(s: StepRecords) -> dict[int, list[tuple[int, MicrostepRecord]]]:
    out: dict[int, list[tuple[int, MicrostepRecord]]] = {}
    for rank, m in s.microbatches():
        assert m.global_index is not None  # the steps check rejects records without one
        out.setdefault(m.global_index, []).append((rank, m))
    return out


def consumed(s: StepRecords) -> Counter[int]:
    """Every sample id the step's microbatches consumed, as often as they did."""
    return Counter(i for _, m in s.microbatches() for i in m.sample_ids)


def ledger_step(control: StepRecords, resized: StepRecords, global_microbatches: int
                ) -> LedgerStep:
    """The resized leg's step against the control's: ids, and each global index once."""
    want, got = consumed(control), consumed(resized)
    over = got - want
    ctrl, mine = _by_index(control), _by_index(resized)
    other = sorted(j for j, runs in mine.items() if j in ctrl
                   and any(m.sample_ids != ctrl[j][0][1].sample_ids for _, m in runs))
    return LedgerStep(
        step=resized.step,
        missing=want - got,
        duplicated=Counter({i: n for i, n in over.items() if i in want}),
        foreign=Counter({i: n for i, n in over.items() if i not in want}),
        indices_missing=[j for j in range(global_microbatches) if j not in mine],
        indices_repeated=sorted(j for j, runs in mine.items()
                                if len(runs) > 1 or not 0 <= j < global_microbatches),
        other_samples=other,
        first_rank=mine[other[0]][0][0] if other else None,
    )


@dataclass(frozen=True)
class Worst:
    """The largest difference of a numeric boundary in one step, and where it was."""

    diff: float  # NaN when one side is NaN or infinite and the other is not
    rank: int
    control: float
    resized: float
    index: int | None = None  # the global microbatch, for the loss


def loss_diff(control: StepRecords, resized: StepRecords) -> Worst | None:
    """The largest |loss difference| over the step's global microbatches, matched by index
    (None: no index in common)."""
    ctrl = {j: runs[0][1].loss for j, runs in _by_index(control).items()}
    worst: Worst | None = None
    for j, runs in sorted(_by_index(resized).items()):
        if j not in ctrl:
            continue
        for rank, m in runs:
            d = _abs_diff(ctrl[j], m.loss)
            if worst is None or _worse(d, worst.diff):
                worst = Worst(d, rank, ctrl[j], m.loss, j)
    return worst


def grad_norm_diff(control: StepRecords, resized: StepRecords) -> Worst | None:
    """The largest |grad norm difference| of any rank of the resized step from the
    control's rank 0 (every rank records the same norm after the reduction)."""
    ref = control.records.get(0)
    worst: Worst | None = None
    if ref is None:
        return None
    for rank, record in sorted(resized.records.items()):
        d = _abs_diff(ref.grad_norm, record.grad_norm)
        if worst is None or _worse(d, worst.diff):
            worst = Worst(d, rank, ref.grad_norm, record.grad_norm)
    return worst


def _abs_diff(a: float, b: float) -> float:
    # Equal NaNs and equal infinities are the same observation: no drift.
    if a == b or (math.isnan(a) and math.isnan(b)):
        return 0.0
    return abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.nan


def _worse(a: float, b: float) -> bool:
    return (math.isnan(a) and not math.isnan(b)) or a > b


def within(worst: Worst | None, tolerance: float) -> bool:
    """A difference at most the tolerance (none measured, or NaN: not)."""
    return worst is not None and not math.isnan(worst.diff) and worst.diff <= tolerance
