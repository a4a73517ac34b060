"""``resumequal run``: one qualification on this machine, from spec to reports and metrics."""

from __future__ import annotations

import logging
import signal
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from prometheus_client import CollectorRegistry
from rich.console import Console

from resumequal.local.backend import LocalBackend
from resumequal.metrics import QualificationMetrics, push, write_textfile
from resumequal.qualify import Qualification, QualificationStatus
from resumequal.report.files import write_reports
from resumequal.report.terminal import LegProgress
from resumequal.spec import QualificationSpec
from resumequal.trace import InventoryRecord, StepRecord, effective_steps, read_trace
from resumequal.verdict import Cut, LegSummary, Report, Result, ValidityCheck, Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How to run a local qualification; the spec says what to qualify."""

    run_dir: Path
    pin: str
    namespace: str = "local"
    side_by_side: bool = False
    deliver_kill: bool = True
    omit: tuple[str, ...] = ()
    metrics_file: Path | None = None
    pushgateway: str | None = None


def exit_code(result: Result) -> int:
    """0 PASS, 1 FAIL or NONDETERMINISTIC, 2 INVALID (errors are 2 as well)."""
    return {Result.PASS: 0, Result.FAIL: 1, Result.NONDETERMINISTIC: 1}.get(result, 2)


def run_qualification(spec: QualificationSpec, opts: RunOptions, console: Console) -> Report:
    """Run both legs, deliver the kill, compare, and write reports and metrics."""
    backend = LocalBackend(spec, opts.run_dir, omit={"preempted": opts.omit})
    q = Qualification(spec, backend, side_by_side=opts.side_by_side,
                      deliver_kill=opts.deliver_kill)
    progress = LegProgress(console)

    def on_tick(s: QualificationStatus) -> None:
        restarts = max(0, s.attempts.get("preempted", 0) - 1)
        progress.update(s.phase.value, dict(s.steps), spec.training.steps, restarts)

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with progress:
            status = q.run(on_tick=on_tick)
    finally:
        signal.signal(signal.SIGTERM, previous)
    report = build_report(spec, status, opts)
    write_reports(report, opts.run_dir)
    registry = CollectorRegistry()
    QualificationMetrics(registry).record(report, namespace=opts.namespace)
    write_textfile(registry, opts.metrics_file or opts.run_dir / "metrics.prom")
    if opts.pushgateway:
        push(registry, opts.pushgateway, job="resumequal")
    return report


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def build_report(spec: QualificationSpec, status: QualificationStatus, opts: RunOptions) -> Report:
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
    legs = [_leg_summary(opts.run_dir, leg, spec, status) for leg in ("control", "preempted")]
    restart = None
    if status.killed_at is not None and status.resumed_at is not None:
        restart = status.resumed_at - status.killed_at
    return Report(
        run=opts.run_dir.name,
        pin=opts.pin,
        verdict=verdict,
        spec=spec.model_dump(mode="json"),
        phases=status.history,
        legs=legs,
        kill_at=status.killed_at,
        restart_seconds=restart,
        inventory=_inventory(opts.run_dir),
    )


def _leg_summary(
    run_dir: Path, leg: str, spec: QualificationSpec, status: QualificationStatus
) -> LegSummary:
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
    started = status.launched.get(leg)
    finished = None
    for event in status.history:
        if event.phase in ("Comparing", "Failed"):
            finished = event.at
            break
    return LegSummary(
        name=leg,  # type: ignore[arg-type]
        attempts=attempts,
        exit_code=None,
        started_at=started,
        finished_at=finished,
        losses=[statistics.fmean(per_step[s]) for s in sorted(per_step)],
    )


def _inventory(run_dir: Path) -> dict[str, object]:
    path = run_dir / "control" / "trace" / "rank-0.jsonl"
    if not path.exists():
        return {}
    for rec in read_trace(path):
        if isinstance(rec, InventoryRecord):
            return rec.comparable()
    return {}


def default_run_dir(base: Path = Path("runs")) -> Path:
    return base / time.strftime("qual-%Y%m%d-%H%M%S")


__all__ = ["RunOptions", "StepRecord", "default_run_dir", "exit_code", "run_qualification"]
