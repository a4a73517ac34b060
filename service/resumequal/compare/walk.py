"""The boundary walk: per step, boundary (in execution order) and rank, equal or not.

Exact mode compares each boundary's recorded value bitwise. Tolerance mode
(``comparison.mode: tolerance``) relaxes only boundaries that carry a declared tolerance:

- ``loss``, ``grad_norm``, ``lr`` are numbers: a difference is "within_tolerance" when the
  largest absolute difference over microbatches or param groups is at most the tolerance.
- ``params`` and ``optimizer_state`` are recorded as digests, which say "equal" or "not"
  but cannot measure a difference per step. A digest that differs counts as
  "within_tolerance" when the final checkpoints' drift of the matching group ("model" for
  params, "optimizer" for optimizer_state) has a max abs difference at most that
  tolerance, no key held by one checkpoint only, and, for the optimizer, no differing
  non-tensor item other than the learning rates the ``lr`` boundary judges.
- ``local_grads``, ``reduced_grads`` and ``clipped_grads`` follow the same rule with their
  own tolerance if one is declared, else the ``params`` tolerance, measured on the model
  group's drift.
- ``inputs``, ``rng``, ``loss_scale`` and ``bucket_layout`` are always exact; a tolerance
  declared for them is ignored.

Which boundary is which, and its drift group, is :data:`resumequal.spec.boundaries.TABLE`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from resumequal.compare.drift import values_equal
from resumequal.compare.tensors import bucket_layouts, step_tensors, tensor_difference
from resumequal.results.verdict import BoundaryRow, Divergence, DriftSummary, StepDelta
from resumequal.spec import ComparisonSpec
from resumequal.spec.boundaries import BOUNDARIES, BY_NAME, TABLE, Boundary
from resumequal.trace.records import StepRecord, boundary_value
from resumequal.words import count

Status = Literal["equal", "within_tolerance", "differs", "missing", "not_compared"]
Steps = Mapping[int, Mapping[int, StepRecord]]  # rank -> step -> record

NUMERIC: Final = frozenset(b.name for b in TABLE if b.kind == "numeric")
# A tensor boundary's digests say equal or not; under a tolerance, the drift of this group
# of the final checkpoints measures by how much.
_DIGEST_GROUP: Final = {b.name: b.drift_group for b in TABLE if b.drift_group is not None}
# Non-tensor optimizer items the lr boundary judges (the optimizer_state digest skips them).
_LR_ITEM = re.compile(r"\.(lr|initial_lr)$")
_SEVERITY: Final[dict[Status, int]] = {
    "not_compared": 0, "equal": 0, "within_tolerance": 1, "missing": 2, "differs": 3
}


def _numbers(value: object) -> list[float]:
    if isinstance(value, list):
        return [float(v) for v in value]
    assert isinstance(value, float | int)
    return [float(value)]


@dataclass(frozen=True)
class Rules:
    """How one boundary's values of two legs are judged."""

    comparison: ComparisonSpec = field(default_factory=ComparisonSpec)
    drift: Mapping[str, DriftSummary] = field(default_factory=dict)

    def tolerance(self, boundary: str) -> float | None:
        if self.comparison.mode != "tolerance":
            return None
        tol: dict[str, float] = {str(k): v for k, v in self.comparison.tolerances.items()}
        info = BY_NAME.get(boundary)
        if info is None or info.kind == "exact":
            return None
        if info.tolerance_from is not None:
            return tol.get(boundary, tol.get(info.tolerance_from))
        return tol.get(boundary)

    def group_within(self, group: str, tol: float) -> bool:
        d = self.drift.get(group)
        if d is None or d.unmatched:
            return False
        if any(not _LR_ITEM.search(k) for k in d.values_differ):
            return False
        return not math.isnan(d.max_abs_diff) and d.max_abs_diff <= tol

    def compares(self, boundary: str) -> bool:
        """Whether the spec asks to look at this boundary at all."""
        return boundary in self.comparison.boundaries

    def status(self, boundary: Boundary, a: StepRecord, b: StepRecord) -> Status:
        if not self.compares(boundary):
            return "not_compared"
        va, vb = boundary_value(a, boundary), boundary_value(b, boundary)
        if values_equal(va, vb):
            return "equal"
        tol = self.tolerance(boundary)
        if tol is None:
            return "differs"
        if boundary in NUMERIC:
            xs, ys = _numbers(va), _numbers(vb)
            if len(xs) != len(ys):
                return "differs"
            worst = max((abs(x - y) for x, y in zip(xs, ys, strict=True)), default=0.0)
            return "within_tolerance" if worst <= tol else "differs"  # NaN: differs
        within = self.group_within(_DIGEST_GROUP[boundary], tol)
        return "within_tolerance" if within else "differs"


@dataclass(frozen=True)
class Point:
    """One (step, boundary, rank) of the walk."""

    step: int
    boundary: Boundary
    rank: int


@dataclass
class Walk:
    rows: list[BoundaryRow]
    first: Point | None
    exact_through: int = 0


def walk(
    control: Steps,
    preempted: Steps,
    steps: Iterable[int],
    ranks: Sequence[int],
    rules: Rules,
    *,
    skip_missing: bool = False,
) -> Walk:
    """Compare every boundary in execution order; a row per step, the first "differs".

    With ``skip_missing``, a (rank, step) that either side lacks is left out instead of
    being marked "missing" (used for the partial record of steps run before the kill).
    """
    rows: list[BoundaryRow] = []
    first: Point | None = None
    exact_through = 0
    still_exact = True
    for step in steps:
        status: dict[str, Status] = {}
        attempts = []
        for boundary in BOUNDARIES:
            worst: Status = "equal"
            if not rules.compares(boundary):
                status[boundary] = "not_compared"
                continue
            for rank in ranks:
                a = control.get(rank, {}).get(step)
                b = preempted.get(rank, {}).get(step)
                if a is None or b is None:
                    if skip_missing:
                        continue
                    s: Status = "missing"
                else:
                    s = rules.status(boundary, a, b)
                    attempts.append(b.attempt)
                if s == "differs" and first is None:
                    first = Point(step, boundary, rank)
                if _SEVERITY[s] > _SEVERITY[worst]:
                    worst = s
            status[boundary] = worst
        if not attempts:
            continue
        rows.append(BoundaryRow(step=step, attempt=max(attempts), status=dict(status)))
        still_exact = still_exact and all(v in ("equal", "not_compared")
                                          for v in status.values())
        if still_exact:
            exact_through = step
    return Walk(rows, first, exact_through)


# --------------------------------------------------------------------------- summaries

_SHORT_DIGEST: Final = 12
_MAX_TEXT: Final = 80


def _digest(value: str) -> str:
    algo, sep, hexdigest = value.partition(":")
    return f"{algo}:{hexdigest[:_SHORT_DIGEST]}…" if sep else value[:_SHORT_DIGEST]


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[: _MAX_TEXT - 1] + "…"


def _first_index(xs: Sequence[object], ys: Sequence[object]) -> int:
    for i, (x, y) in enumerate(zip(xs, ys, strict=False)):
        if not values_equal(x, y):
            return i
    return min(len(xs), len(ys))


def divergence(point: Point, control: Steps, preempted: Steps, *, before_cut: bool) -> Divergence:
    """Where and how the legs first differ at ``point``: its values, tensors and buckets."""
    a = control[point.rank][point.step]
    b = preempted[point.rank][point.step]
    ca, pb = summarise(point.boundary, a, b)
    return Divergence(step=point.step, boundary=point.boundary, rank=point.rank,
                      control=ca, preempted=pb, before_cut=before_cut,
                      tensors=tensor_difference(point.boundary, a, b),
                      step_tensors=step_tensors(a, b), buckets=bucket_layouts(a, b))


def summarise(boundary: Boundary, a: StepRecord, b: StepRecord) -> tuple[str, str]:
    """Short descriptions of two legs' values at a boundary, pointing at what differs."""
    va, vb = boundary_value(a, boundary), boundary_value(b, boundary)
    if boundary in ("inputs", "loss"):
        assert isinstance(va, list) and isinstance(vb, list)
        i = _first_index(va, vb)

        def mb(values: list[object]) -> str:
            if i >= len(values):
                return f"{len(values)} microbatch(es)"
            return _clip(f"microbatch {i}: {values[i]!r}")

        return mb(va), mb(vb)
    if boundary == "rng":
        assert isinstance(va, dict) and isinstance(vb, dict)
        keys = [k for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)]

        def streams(d: dict[str, str]) -> str:
            return _clip(" ".join(f"{k}={_digest(d[k]) if k in d else '-'}" for k in keys))

        return streams(va), streams(vb)
    if boundary == "bucket_layout":
        if a.bucket_layout is None or b.bucket_layout is None:
            return repr(a.bucket_layout), repr(b.bucket_layout)
        return (f"{_digest(a.bucket_layout)} ({count(len(a.buckets), 'bucket')})",
                f"{_digest(b.bucket_layout)} ({count(len(b.buckets), 'bucket')})")
    if isinstance(va, str) and isinstance(vb, str):
        return _digest(va), _digest(vb)
    return _clip(repr(va)), _clip(repr(vb))


# --------------------------------------------------------------------------- losses


def _mean_loss(records: Iterable[StepRecord]) -> float | None:
    losses = [m.loss for r in records for m in r.microsteps]
    return sum(losses) / len(losses) if losses else None


def loss_deltas(control: Steps, preempted: Steps, steps: Iterable[int]) -> list[StepDelta]:
    """Per step: each leg's loss averaged over ranks and microbatches, and the difference."""
    out = []
    for step in steps:
        a = _mean_loss(r[step] for r in control.values() if step in r)
        b = _mean_loss(r[step] for r in preempted.values() if step in r)
        if a is not None and b is not None:
            out.append(StepDelta(step=step, control_loss=a, preempted_loss=b,
                                 abs_diff=abs(a - b)))
    return out
