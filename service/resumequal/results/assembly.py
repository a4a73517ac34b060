"""Report assembly: ``report.json`` from a verdict, a timeline and the legs' traces.

The local runner, the comparator (``resumequal compare``, the cluster's comparator Job) and
the operator's controller all build their report here: the verdict folded with the seed
matrix, the timeline, the legs' summaries, the runtime inventory and what was built.
Publishing the report is :mod:`resumequal.results.publish`'s.

Shared with the operator: it must import neither torch nor numpy, nor ``compare`` or the
worker side; traces are read as their records' models (:mod:`resumequal.trace.records`)
through :mod:`resumequal.run.traces`.
"""

from __future__ import annotations

import statistics
from typing import Any

from resumequal.built import BuiltOptimizer
from resumequal.qualify.machine import QualificationStatus
from resumequal.qualify.timeline import REPORTED_LEGS, Timeline
from resumequal.results.matrix import fold_matrix
from resumequal.results.verdict import AttemptCompile, LegSummary, Matrix, Report, Verdict
from resumequal.run.location import RunLocation
from resumequal.spec import REFERENCE_LEG, QualificationSpec
from resumequal.spec.launchers import caveats
from resumequal.trace.records import CompiledRecord, InventoryRecord, StepRecord

__all__ = ["build_report", "built", "claimed_spec", "inventory", "leg_summary"]


def leg_summary(location: RunLocation, leg: str, spec: QualificationSpec,
                status: QualificationStatus | None = None) -> LegSummary:
    """One leg's attempts and per-step mean loss from its traces (times from ``status``)."""
    # step -> attempt -> losses: the latest attempt that ran a step is what the leg did
    # (never a merge per rank: after a resize a rank's record of an earlier attempt is stale).
    per_attempt: dict[int, dict[int, list[float]]] = {}
    attempts = 0
    compiled: dict[tuple[int, int], list[CompiledRecord]] = {}  # (attempt, rank) -> records
    traces = location.traces(leg).records_so_far(spec.world.world_size)
    for r, records in traces.items():
        attempts = max([attempts] + [x.attempt + 1 for x in records])
        for rec in records:
            if isinstance(rec, CompiledRecord):
                compiled.setdefault((rec.attempt, r), []).append(rec)
        final: dict[tuple[int, int], StepRecord] = {}
        for rec in records:
            if isinstance(rec, StepRecord) and rec.rank == r:
                final[rec.step, rec.attempt] = rec
        for (step, attempt), rec in final.items():
            per_attempt.setdefault(step, {}).setdefault(attempt, []).extend(
                m.loss for m in rec.microsteps)
    per_step = {step: by[max(by)] for step, by in per_attempt.items()}
    run = status.legs.get(leg) if status is not None else None
    return LegSummary(
        name=leg,  # type: ignore[arg-type]
        attempts=attempts,
        exit_code=None,
        started_at=run.launched_at if run else None,
        finished_at=run.finished_at if run else None,
        losses=[statistics.fmean(per_step[s]) for s in sorted(per_step)],
        compiled=_attempt_compiles(compiled),
    )


def _attempt_compiles(records: dict[tuple[int, int], list[CompiledRecord]]
                      ) -> list[AttemptCompile]:
    """Per attempt: the slowest rank's compile seconds, the ranks' cache hits and misses."""
    out = []
    for attempt in sorted({a for a, _ in records}):
        ranks = [recs for (a, _), recs in records.items() if a == attempt]
        out.append(AttemptCompile(
            attempt=attempt,
            seconds=max(sum(r.seconds for r in recs) for recs in ranks),
            fx_cache_hits=sum(r.fx_cache_hits for recs in ranks for r in recs),
            fx_cache_misses=sum(r.fx_cache_misses for recs in ranks for r in recs),
            autotuned=sum(len(r.autotuned) for recs in ranks for r in recs)))
    return out


# Not the runtime: what differs between processes, and what the workload built (shown apart).
_NOT_COMPARABLE = frozenset({"pid", "host", "rank", "attempt", "built"})


def _inventory_record(location: RunLocation) -> InventoryRecord | None:
    """The reference leg's first inventory record on rank 0; None when it wrote none."""
    records = location.traces(REFERENCE_LEG).records_so_far(1).get(0, [])
    return next((rec for rec in records if isinstance(rec, InventoryRecord)), None)


def inventory(location: RunLocation) -> dict[str, object]:
    """The reference leg's runtime inventory (rank 0), as the legs must agree on it."""
    rec = _inventory_record(location)
    if rec is None:
        return {}
    return {k: v for k, v in rec.model_dump(mode="json").items() if k not in _NOT_COMPARABLE}


def built(location: RunLocation) -> BuiltOptimizer | None:
    """What the reference leg's workload built (rank 0); None where its trace has none."""
    rec = _inventory_record(location)
    return rec.built if rec is not None else None


def claimed_spec(spec: QualificationSpec, made: BuiltOptimizer | None) -> dict[str, Any]:
    """The spec as the report shows it: without ``training.optimizer`` or
    ``training.schedule`` where the workload built something else (a factory's own)."""
    out = spec.model_dump(mode="json")
    if made is not None:
        training = out["training"]
        if not made.optimizer_from_spec:
            training.pop("optimizer", None)
        if not made.schedule_from_spec:
            training.pop("schedule", None)
    return out


def build_report(
    spec: QualificationSpec,
    verdict: Verdict,
    timeline: Timeline,
    *,
    run: str,
    pin: str,
    location: RunLocation | None = None,
    status: QualificationStatus | None = None,
    matrix: Matrix | None = None,
) -> Report:
    """report.json: the verdict (folded with the seed matrix), the timeline and, from the
    legs' traces at ``location``, their summaries, runtime inventory and what was built."""
    if matrix is not None:
        verdict = fold_matrix(verdict, matrix)
    legs = [] if location is None else [leg_summary(location, leg, spec, status)
                                        for leg in REPORTED_LEGS]
    made = built(location) if location is not None else None
    return Report(
        run=run,
        pin=pin,
        verdict=verdict,
        spec=claimed_spec(spec, made),
        built=made,
        phases=timeline.phases,
        legs=legs,
        kill_at=timeline.kill_at,
        restart_seconds=timeline.restart_seconds,
        inventory=inventory(location) if location is not None else {},
        launcher=spec.world.launcher,
        caveats=caveats(spec.world.launcher),
        matrix=matrix,
    )
