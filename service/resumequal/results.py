"""Results: a qualification's verdict, report and metrics, assembled and published in one place.

The local runner, the comparator (``resumequal compare``, the cluster's comparator Job) and
the operator's controller all build their results here: the INVALID verdict of a run that
ended without a comparison, the timeline (phases, kill time, restart seconds), the legs'
summaries, the seed-matrix fold, the report, and the publish sequence (``verdict.json``,
``report.json``, ``report.html``, then ``metrics.prom``). The run URI
``<store>/<namespace>/<run>/<uid>`` is spelled here too.

A timeline comes from the qualification machine's memory when the caller has it (the
runner, the controller), and otherwise from the run location (the comparator): trace
records, beacons and kill orders carry the same timestamps on a folder and on S3.

Shared with the operator: it must import neither torch nor numpy, nor ``compare``,
``trace`` or the worker side; traces are read as JSON objects through ``runstore``.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from resumequal.built import BuiltOptimizer
from resumequal.errors import StoreError
from resumequal.launchers import caveats
from resumequal.metrics import QualificationMetrics, push, write_textfile
from resumequal.qualify import MAIN_LEG, Phase, QualificationStatus, Reason
from resumequal.report.files import write_reports
from resumequal.runstore import METRICS_PROM, RunLocation, progress_of
from resumequal.spec import REFERENCE_LEG, QualificationSpec
from resumequal.verdict import (
    AttemptCompile,
    Cut,
    LegSummary,
    Matrix,
    MatrixCell,
    MatrixRow,
    PhaseEvent,
    Report,
    Result,
    ValidityCheck,
    Verdict,
)

log = logging.getLogger(__name__)

# The pair every report summarises: the reference leg and the main preempted leg.
REPORTED_LEGS = (REFERENCE_LEG, MAIN_LEG)

__all__ = [
    "Timeline",
    "build_report",
    "failed_reason",
    "failed_verdict",
    "fold_matrix",
    "inventory",
    "leg_summary",
    "matrix_cell",
    "publish",
    "read_timeline",
    "restart_seconds",
    "run_names",
    "run_uri",
    "seed_matrix",
]


# --------------------------------------------------------------------------- run URI


def run_uri(store_uri: str, namespace: str, name: str, uid: str) -> str:
    """The run location: ``<store>/<namespace>/<name>/<uid>`` (uid: reruns never mix)."""
    for label, part in (("namespace", namespace), ("name", name), ("uid", uid)):
        if not part or "/" in part:
            raise ValueError(f"{label} {part!r} cannot be a path segment")
    return f"{store_uri.rstrip('/')}/{namespace}/{name}/{uid}"


def run_names(uri: str) -> tuple[str, str]:
    """(namespace, run) read back from :func:`run_uri` in an object store (a URI with a
    bucket); ("local", folder name) for a folder."""
    parsed = urlparse(uri)
    if parsed.netloc:
        parts = [p for p in parsed.path.split("/") if p]
        if len(parts) >= 3:
            return parts[-3], parts[-2]
        return "default", parts[-1] if parts else "run"
    return "local", Path(parsed.path).name


# --------------------------------------------------------------------------- verdicts


def failed_reason(status: QualificationStatus) -> str:
    """Why a run that ended without a comparison tested nothing: ``<Reason>: <message>``."""
    return f"{status.reason.value if status.reason else 'Failed'}: {status.message or ''}"


def failed_verdict(spec: QualificationSpec, status: QualificationStatus) -> Verdict:
    """The INVALID verdict of a run that ended without a comparison (a timeout, a failed
    leg)."""
    p = spec.preemption
    return Verdict(
        result=Result.INVALID,
        reason=failed_reason(status),
        cut=Cut(step=p.step, microstep=p.microstep, rank=p.rank, mode=p.mode, at=p.at),
        resumed_from=None,
        first_divergence=None,
        exact_through_step=0,
        checks=[ValidityCheck(name="qualification completed", ok=False,
                              detail=status.message or "no detail")],
    )


_WORST = (Result.PASS, Result.FAIL, Result.NONDETERMINISTIC, Result.INVALID)


def fold_matrix(verdict: Verdict, matrix: Matrix) -> Verdict:
    """A qualification with a seed matrix passes only when every scenario and seed did."""
    bad = [c for c in matrix.cells if c.result != Result.PASS]
    if verdict.result != Result.PASS or not bad:
        return verdict
    worst = max(bad, key=lambda c: _WORST.index(c.result))
    where = ", ".join(f"{c.scenario}/seed {c.seed}" for c in bad[:4])
    more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
    detail = (f"step {worst.first_divergent_step}, {worst.first_divergent_boundary}"
              if worst.first_divergent_step is not None else worst.reason)
    reason = (f"seed matrix: {len(bad)} of {len(matrix.cells)} scenario runs not exact "
              f"({where}{more}); {worst.scenario}/seed {worst.seed}: {worst.result.value}, "
              f"{detail}")
    return verdict.model_copy(update={"result": worst.result, "reason": reason})


def matrix_cell(scenario: str, seed: int, verdict: Verdict | None, why_not: str) -> MatrixCell:
    """One scenario of one seed: its verdict, or INVALID with ``why_not`` when it has none."""
    if verdict is None:
        return MatrixCell(scenario=scenario, seed=seed, result=Result.INVALID, reason=why_not)
    d = verdict.first_divergence
    return MatrixCell(scenario=scenario, seed=seed, result=verdict.result,
                      first_divergent_step=d.step if d else None,
                      first_divergent_boundary=d.boundary if d else None,
                      reason=verdict.reason)


def seed_matrix(seeds: Sequence[int], scenarios: Sequence[str],
                cells: Sequence[MatrixCell]) -> Matrix:
    """The matrix of ``cells``, with each scenario's count of exact seeds."""
    summary = [MatrixRow(scenario=sc,
                         exact=sum(c.result == Result.PASS for c in cells if c.scenario == sc),
                         total=sum(c.scenario == sc for c in cells))
               for sc in scenarios]
    return Matrix(seeds=list(seeds), scenarios=list(scenarios), cells=list(cells),
                  summary=summary)


# --------------------------------------------------------------------------- timeline


def restart_seconds(killed_at: float | None, resumed_at: float | None) -> float | None:
    """Kill -> first resumed step finished; None unless both happened."""
    if killed_at is None or resumed_at is None:
        return None
    return resumed_at - killed_at


class Timeline(BaseModel):
    """When the qualification went through its phases, and the main leg's kill and resume."""

    model_config = ConfigDict(extra="forbid")
    phases: list[PhaseEvent] = Field(default_factory=list)
    kill_at: float | None = None
    resumed_at: float | None = None

    @property
    def restart_seconds(self) -> float | None:
        return restart_seconds(self.kill_at, self.resumed_at)

    @classmethod
    def of(cls, status: QualificationStatus) -> Timeline:
        """From the machine's memory (what the runner and the controller hold)."""
        main = status.main()
        return cls(phases=list(status.history), kill_at=main.killed_at,
                   resumed_at=main.resumed_at)


def _records(location: RunLocation, leg: str, world_size: int) -> dict[int, list[dict[str, Any]]]:
    return {r: location.trace_records(leg, r) for r in range(world_size)}


def _earliest(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _number(value: object) -> float | None:
    """A timestamp from a JSON record; None when absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def read_timeline(location: RunLocation, spec: QualificationSpec, *, compared_at: float,
                  verdict: Verdict | None = None, concluded_at: float | None = None,
                  ) -> Timeline:
    """The timeline of a run from what its legs left in ``location`` (the comparator's view).

    LegsRunning: the first worker process started; Armed: the target rank's arm record (or
    beacon); Preempted: the kill order of a process kill, or the record of a pod deletion;
    Resumed: the last rank's first finished step of a later attempt;
    Comparing at ``compared_at``; then Succeeded or Failed as ``verdict`` concludes.
    """
    world, p = spec.world.world_size, spec.preemption
    legs = {leg: _records(location, leg, world) for leg in REPORTED_LEGS}
    every = [rec for per_rank in legs.values() for recs in per_rank.values() for rec in recs]
    started = _earliest(_number(r.get("process_started_at")) for r in every
                        if r.get("kind") == "startup")
    started = started if started is not None else _earliest(
        _number(r.get("started_at")) for r in every if r.get("kind") == "step")
    main = legs[MAIN_LEG]
    armed = _earliest(_number(r.get("armed_at")) for r in main.get(p.rank, [])
                      if r.get("kind") == "arm" and r.get("attempt") == 0)
    beacon, killed_at, kill = None, None, None
    try:
        beacon = location.read_beacon(MAIN_LEG, p.rank)
        order = location.leg(MAIN_LEG).read_kill_order(p.rank, 0)
        pod_kill = None if order is not None else location.leg(MAIN_LEG).read_pod_kill(p.rank, 0)
    except StoreError as e:
        # A half-written beacon or record leaves the timeline without that event.
        log.warning("timeline: %s", e)
        order, pod_kill = None, None
    if order is not None:
        killed_at, kill = order.issued_at, f"killed pid {order.pid} ({order.mode})"
    elif pod_kill is not None:
        killed_at = pod_kill.issued_at
        kill = f"deleted pod {pod_kill.pod} ({pod_kill.mode}, grace {pod_kill.grace_seconds:g}s)"
    if armed is None and beacon is not None:
        armed = _number(beacon.get("armedAt"))
    resumed = progress_of(main, world).resumed_at
    events: list[PhaseEvent] = []
    if started is not None:
        events.append(PhaseEvent(phase=Phase.LEGS_RUNNING.value, at=started))
    if armed is not None:
        events.append(PhaseEvent(phase=Phase.ARMED.value, at=armed))
    if killed_at is not None:
        events.append(PhaseEvent(phase=Phase.PREEMPTED.value, at=killed_at,
                                 message=f"{MAIN_LEG}: {kill}"))
    if resumed is not None:
        events.append(PhaseEvent(phase=Phase.RESUMED.value, at=resumed))
    events.append(PhaseEvent(phase=Phase.COMPARING.value, at=compared_at))
    if verdict is not None:
        events.append(_concluded(verdict, concluded_at if concluded_at is not None
                                 else compared_at))
    return Timeline(phases=events, kill_at=killed_at, resumed_at=resumed)


def _concluded(verdict: Verdict, at: float) -> PhaseEvent:
    """The machine's last phase once a verdict is in (see ``Qualification._compare``)."""
    if verdict.result == Result.INVALID:
        return PhaseEvent(phase=Phase.FAILED.value, at=at, reason=Reason.INVALID.value,
                          message=verdict.reason)
    return PhaseEvent(phase=Phase.SUCCEEDED.value, at=at, reason=Reason.COMPLETED.value,
                      message=f"{verdict.result}: {verdict.reason}")


# --------------------------------------------------------------------------- legs


def leg_summary(location: RunLocation, leg: str, spec: QualificationSpec,
                status: QualificationStatus | None = None) -> LegSummary:
    """One leg's attempts and per-step mean loss from its traces (times from ``status``)."""
    # step -> attempt -> losses: the latest attempt that ran a step is what the leg did
    # (never a merge per rank: after a resize a rank's record of an earlier attempt is stale).
    per_attempt: dict[int, dict[int, list[float]]] = {}
    attempts = 0
    compiled: dict[tuple[int, int], list[dict[str, Any]]] = {}  # (attempt, rank) -> records
    for r, records in _records(location, leg, spec.world.world_size).items():
        attempts = max([attempts] + [int(x.get("attempt", 0)) + 1 for x in records])
        for rec in records:
            if rec.get("kind") == "compiled":
                compiled.setdefault((int(rec["attempt"]), r), []).append(rec)
        final: dict[tuple[int, int], dict[str, Any]] = {}
        for rec in records:
            if rec.get("kind") == "step" and rec.get("rank") == r:
                final[int(rec["step"]), int(rec["attempt"])] = rec
        for (step, attempt), rec in final.items():
            # float(): a NaN or infinite loss is stored as the string "NaN" / "Infinity".
            per_attempt.setdefault(step, {}).setdefault(attempt, []).extend(
                float(m["loss"]) for m in rec["microsteps"])
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


def _attempt_compiles(records: dict[tuple[int, int], list[dict[str, Any]]]
                      ) -> list[AttemptCompile]:
    """Per attempt: the slowest rank's compile seconds, the ranks' cache hits and misses."""
    out = []
    for attempt in sorted({a for a, _ in records}):
        ranks = [recs for (a, _), recs in records.items() if a == attempt]
        out.append(AttemptCompile(
            attempt=attempt,
            seconds=max(sum(float(r["seconds"]) for r in recs) for recs in ranks),
            fx_cache_hits=sum(int(r["fx_cache_hits"]) for recs in ranks for r in recs),
            fx_cache_misses=sum(int(r["fx_cache_misses"]) for recs in ranks for r in recs),
            autotuned=sum(len(r["autotuned"]) for recs in ranks for r in recs)))
    return out


# Not the runtime: what differs between processes, and what the workload built (shown apart).
_NOT_COMPARABLE = frozenset({"pid", "host", "rank", "attempt", "built"})


def _inventory_record(location: RunLocation) -> dict[str, Any]:
    """The reference leg's first inventory record on rank 0; empty when it wrote none."""
    for rec in location.trace_records(REFERENCE_LEG, 0):
        if rec.get("kind") == "inventory":
            return rec
    return {}


def inventory(location: RunLocation) -> dict[str, object]:
    """The reference leg's runtime inventory (rank 0), as the legs must agree on it."""
    return {k: v for k, v in _inventory_record(location).items() if k not in _NOT_COMPARABLE}


def built(location: RunLocation) -> BuiltOptimizer | None:
    """What the reference leg's workload built (rank 0); None where its trace has none."""
    raw = _inventory_record(location).get("built")
    if raw is None:
        return None
    try:
        return BuiltOptimizer.model_validate(raw)
    except ValidationError as e:
        # The report stands without it: it only says what was built.
        log.warning("the inventory's record of the optimizer is refused: %s",
                    e.errors()[0]["msg"])
        return None


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


# --------------------------------------------------------------------------- the report


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


def publish(report: Report, location: RunLocation, out: Path, *, namespace: str,
            metrics_file: Path | None = None, pushgateway: str | None = None) -> dict[str, str]:
    """Write the result files into ``out`` and put them into ``location``; name -> URI.

    One order everywhere: ``verdict.json``, ``report.json``, ``report.html`` (atomically),
    then ``metrics.prom`` (to ``metrics_file`` when given), the push, and the upload.
    """
    files: dict[str, Path] = dict(write_reports(report, out))
    registry = CollectorRegistry()
    QualificationMetrics(registry).record(report, namespace=namespace)
    metrics = metrics_file or out / METRICS_PROM
    write_textfile(registry, metrics)
    if pushgateway:
        push(registry, pushgateway, job="resumequal")
    # A metrics file asked for elsewhere stays there, and the location gets a copy.
    files[METRICS_PROM] = metrics
    published = location.publish(files)
    if metrics_file is not None:
        published[METRICS_PROM] = str(metrics_file)
    return published
