"""How far a leg got, from its ranks' trace records: what the backends poll and the timeline
dates the resume by.

Records come from the store: a number no status can hold (an int32 count, a time a
timestamp can hold) is no progress; the comparator reads the trace strictly and names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from resumequal.run.beacons import MAX_EPOCH_SECONDS
from resumequal.run.layout import count
from resumequal.trace.records import StepRecord, TraceRecord

__all__ = ["LegProgress", "progress_of"]


@dataclass(frozen=True)
class LegProgress:
    """How far a leg got: steps every rank finished, attempts seen, and when the resume
    completed (the latest rank's first finished step of an attempt >= 1)."""

    steps_done: int = 0
    attempts: int = 0
    resumed_at: float | None = None


def _epoch(value: Any) -> float | None:
    """``value`` if it is a time a status can hold (epoch seconds), else None."""
    ok = (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value) and 0 <= value <= MAX_EPOCH_SECONDS)
    return float(value) if ok else None


def progress_of(per_rank: dict[int, list[TraceRecord]], world_size: int) -> LegProgress:
    """Progress from each rank's trace records (in write order)."""
    per_rank_steps: list[int] = []
    attempts = 0
    resumed: list[float] = []
    for r in range(world_size):
        done = 0
        first_resumed: float | None = None
        for rec in per_rank.get(r, []):
            attempt = count(rec.attempt)
            if attempt is None:
                continue
            attempts = max(attempts, attempt + 1)
            if not isinstance(rec, StepRecord):
                continue
            step = count(rec.step)
            if step is None:
                continue
            done = max(done, step)
            # Whoever writes the store writes these: 1e300 would overflow every
            # timestamp made of it (the operator's status, on every reconcile).
            at = _epoch(rec.finished_at)
            if attempt >= 1 and first_resumed is None and at is not None:
                first_resumed = at
        per_rank_steps.append(done)
        if first_resumed is not None:
            resumed.append(first_resumed)
    resumed_at = max(resumed) if len(resumed) == world_size else None
    return LegProgress(min(per_rank_steps, default=0), attempts, resumed_at)
