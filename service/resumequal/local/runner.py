"""``resumequal run``: one qualification on this machine, from spec to reports and metrics."""

from __future__ import annotations

import contextlib
import logging
import signal
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry
from rich.console import Console

from resumequal.errors import ResumequalError
from resumequal.local.backend import LocalBackend
from resumequal.metrics import QualificationMetrics, push, write_textfile
from resumequal.plan import Plan, qualification_plan, scenario_plan
from resumequal.qualify import Qualification, QualificationStatus
from resumequal.report.files import write_reports
from resumequal.report.terminal import LegProgress
from resumequal.runstore import METRICS_PROM, RunLocation
from resumequal.spec import Omission, QualificationSpec, apply_overrides
from resumequal.store import open_store, s3_config
from resumequal.trace import InventoryRecord, effective_steps, read_trace
from resumequal.verdict import (
    Cut,
    LegSummary,
    Matrix,
    MatrixCell,
    MatrixRow,
    Report,
    Result,
    ValidityCheck,
    Verdict,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How to run a local qualification; the spec says what to qualify."""

    run_dir: Path
    pin: str
    namespace: str = "local"
    side_by_side: bool = False
    deliver_kill: bool = True
    omit: tuple[Omission, ...] = ()
    metrics_file: Path | None = None
    pushgateway: str | None = None
    store: str | None = None
    """``s3://bucket/prefix``: everything but logs and staging goes to
    ``<store>/<namespace>/<run>/<uid>`` (as ``checkpoint.store=s3://...`` in the spec does)."""


@dataclass(frozen=True)
class Outcome:
    """A finished local qualification: its report and where its result files are."""

    report: Report
    location: RunLocation
    files: dict[str, str]


def exit_code(result: Result) -> int:
    """0 PASS, 1 FAIL or NONDETERMINISTIC, 2 INVALID (errors are 2 as well)."""
    return {Result.PASS: 0, Result.FAIL: 1, Result.NONDETERMINISTIC: 1}.get(result, 2)


def run_location(spec: QualificationSpec, opts: RunOptions) -> RunLocation:
    """The run folder, or ``<store>/<namespace>/<run>/<uid>`` when the checkpoint store is
    not a folder on this machine (an object store holds the whole run)."""
    store = opts.store or spec.checkpoint.store
    if store is None or open_store(store, s3_config(spec.checkpoint.s3)).local_folder():
        return RunLocation.open(str(opts.run_dir))
    uri = f"{store.rstrip('/')}/{opts.namespace}/{opts.run_dir.name}/{uuid.uuid4().hex[:12]}"
    return RunLocation.open(uri, spec.checkpoint.s3)


def check_runs_here(spec: QualificationSpec) -> None:
    """ResumequalError naming the field when the spec asks for what a local run cannot do."""
    if spec.preemption.target != "process":
        raise ResumequalError(
            f"preemption.target={spec.preemption.target}: a local run has no pods to "
            "delete; it kills the armed worker process (preemption.target=process)"
        )


def run_qualification(spec: QualificationSpec, opts: RunOptions, console: Console) -> Report:
    """Run every leg, deliver the kills, compare, and write reports and metrics."""
    return qualify_here(spec, opts, console).report


def qualify_here(spec: QualificationSpec, opts: RunOptions, console: Console) -> Outcome:
    """:func:`run_qualification`, also saying where the result files were published."""
    check_runs_here(spec)
    if opts.store is not None:
        spec = apply_overrides(spec, [f"checkpoint.store={opts.store}"])
    location = run_location(spec, opts)
    spec = location.leg_spec(spec)
    if not location.is_local:
        console.print(f"run location {location.uri}")
    matrix = run_matrix(spec, opts, console, location) if spec.matrix.seeds else None
    plan = qualification_plan(spec)
    if opts.omit:
        plan = Plan([replace(p, omit=opts.omit) if p.role == "main" else p for p in plan.legs],
                    plan.not_run)
    status = _run_plan(spec, plan, opts.run_dir, opts, console, location=location)
    if status.verdict is None:
        # No comparison ran: the report still shows what the legs wrote (a folder run
        # already has it in place).
        with contextlib.suppress(ResumequalError):
            location.materialize(opts.run_dir)
    report = build_report(spec, status, opts, matrix)
    local = write_reports(report, opts.run_dir)
    registry = CollectorRegistry()
    QualificationMetrics(registry).record(report, namespace=opts.namespace)
    metrics = opts.metrics_file or opts.run_dir / METRICS_PROM
    write_textfile(registry, metrics)
    if opts.pushgateway:
        push(registry, opts.pushgateway, job="resumequal")
    files: dict[str, Path] = dict(local)
    if opts.metrics_file is None or not location.is_local:
        files[METRICS_PROM] = metrics
    published = location.publish(files)
    if opts.metrics_file is not None and location.is_local:
        published[METRICS_PROM] = str(opts.metrics_file)
    return Outcome(report, location, published)


def _run_plan(
    spec: QualificationSpec,
    plan: Plan,
    run_dir: Path,
    opts: RunOptions,
    console: Console,
    judge: Callable[[], Verdict] | None = None,
    location: RunLocation | None = None,
) -> QualificationStatus:
    backend = LocalBackend(spec, run_dir, location=location, judge=judge)
    q = Qualification(spec, backend, plan=plan, side_by_side=opts.side_by_side,
                      deliver_kill=opts.deliver_kill)
    progress = LegProgress(console, legs=tuple(p.name for p in plan.legs))

    def on_tick(s: QualificationStatus) -> None:
        restarts = sum(max(0, leg.attempts - 1) for leg in s.legs.values())
        steps = {name: leg.steps for name, leg in s.legs.items() if leg.launched_at is not None}
        progress.update(s.phase.value, steps, spec.training.steps, restarts)

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with progress:
            return q.run(on_tick=on_tick)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_matrix(
    spec: QualificationSpec, opts: RunOptions, console: Console,
    location: RunLocation | None = None,
) -> Matrix:
    """Each positive scenario, for each seed, against that seed's control leg."""
    # The comparator (DCP readers, drift statistics) is imported when a comparison runs;
    # torch itself is already loaded here, by the trace reader.
    from resumequal.compare import compare_run

    parent = location or RunLocation.open(str(opts.run_dir))
    cells: list[MatrixCell] = []
    for seed in spec.matrix.seeds:
        sub = parent.child(f"seed-{seed}")
        seeded = sub.leg_spec(apply_overrides(spec, [f"training.seed={seed}"]))
        plan = scenario_plan(seeded)
        run_dir = opts.run_dir / f"seed-{seed}"
        verdicts: dict[str, Verdict] = {}

        def judge(plan: Plan = plan, run_dir: Path = run_dir, sub: RunLocation = sub,
                  verdicts: dict[str, Verdict] = verdicts) -> Verdict:
            local = sub.materialize(run_dir)
            for leg in plan.legs:
                if leg.cut:
                    verdicts[leg.name] = compare_run(local, sub.leg_spec(leg.spec),
                                                     leg=leg.name)
            failing = [v for v in verdicts.values() if v.result != Result.PASS]
            return failing[0] if failing else next(iter(verdicts.values()))

        console.print(f"seed {seed}: {len(plan.legs) - 1} scenario(s)")
        status = _run_plan(seeded, plan, run_dir, opts, console, judge=judge, location=sub)
        for scenario in spec.matrix.scenarios:
            v = verdicts.get(scenario)
            if v is None:
                cells.append(MatrixCell(scenario=scenario, seed=seed, result=Result.INVALID,
                                        reason=status.message or "the scenario did not finish"))
                continue
            d = v.first_divergence
            cells.append(MatrixCell(
                scenario=scenario, seed=seed, result=v.result,
                first_divergent_step=d.step if d else None,
                first_divergent_boundary=d.boundary if d else None, reason=v.reason))
    summary = [
        MatrixRow(scenario=sc, exact=sum(c.result == Result.PASS for c in cells
                                         if c.scenario == sc),
                  total=sum(c.scenario == sc for c in cells))
        for sc in spec.matrix.scenarios
    ]
    return Matrix(seeds=list(spec.matrix.seeds), scenarios=list(spec.matrix.scenarios),
                  cells=cells, summary=summary)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def build_report(
    spec: QualificationSpec,
    status: QualificationStatus,
    opts: RunOptions,
    matrix: Matrix | None = None,
) -> Report:
    """Assemble report.json from the machine's status, the verdict and the traces."""
    p = spec.preemption
    verdict = status.verdict or Verdict(
        result=Result.INVALID,
        reason=f"{status.reason.value if status.reason else 'Failed'}: {status.message}",
        cut=Cut(step=p.step, microstep=p.microstep, rank=p.rank, mode=p.mode, at=p.at),
        resumed_from=None,
        first_divergence=None,
        exact_through_step=0,
        checks=[ValidityCheck(name="qualification completed", ok=False,
                              detail=status.message or "no detail")],
    )
    legs = [leg_summary(opts.run_dir, leg, spec, status) for leg in ("control", "preempted")]
    main = status.main()
    restart = None
    if main.killed_at is not None and main.resumed_at is not None:
        restart = main.resumed_at - main.killed_at
    if matrix is not None:
        verdict = fold_matrix(verdict, matrix)
    return Report(
        run=opts.run_dir.name,
        pin=opts.pin,
        verdict=verdict,
        spec=spec.model_dump(mode="json"),
        phases=status.history,
        legs=legs,
        kill_at=main.killed_at,
        restart_seconds=restart,
        inventory=inventory(opts.run_dir),
        matrix=matrix,
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


def leg_summary(
    run_dir: Path, leg: str, spec: QualificationSpec, status: QualificationStatus | None = None
) -> LegSummary:
    """One leg's attempts and per-step mean loss from its traces (times from ``status``)."""
    per_step: dict[int, list[float]] = {}
    attempts = 0
    for r in range(spec.world.world_size):
        path = run_dir / leg / "trace" / f"rank-{r}.jsonl"
        if not path.exists():
            continue
        records = read_trace(path)
        attempts = max([attempts] + [getattr(x, "attempt", 0) + 1 for x in records])
        for step, rec in effective_steps(records, r).items():
            per_step.setdefault(step, []).extend(m.loss for m in rec.microsteps)
    run = status.legs.get(leg) if status is not None else None
    started = run.launched_at if run else None
    finished = run.finished_at if run else None
    return LegSummary(
        name=leg,  # type: ignore[arg-type]
        attempts=attempts,
        exit_code=None,
        started_at=started,
        finished_at=finished,
        losses=[statistics.fmean(per_step[s]) for s in sorted(per_step)],
    )


def inventory(run_dir: Path) -> dict[str, object]:
    """The control leg's runtime inventory (rank 0), as the legs must agree on it."""
    path = run_dir / "control" / "trace" / "rank-0.jsonl"
    if not path.exists():
        return {}
    for rec in read_trace(path):
        if isinstance(rec, InventoryRecord):
            return rec.comparable()
    return {}


def default_run_dir(base: Path = Path("runs")) -> Path:
    return base / time.strftime("qual-%Y%m%d-%H%M%S")


__all__ = ["Outcome", "RunOptions", "default_run_dir", "exit_code", "qualify_here",
           "run_location", "run_qualification"]
