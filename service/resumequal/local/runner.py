"""``resumequal run``: one qualification on this machine, from spec to reports and metrics."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from types import FrameType

from rich.console import Console

from resumequal.errors import StoreError, TrainingError, UsageError
from resumequal.exitcodes import for_result
from resumequal.local import runkey
from resumequal.local.backend import LocalBackend
from resumequal.local.comparison import ComparisonFailed
from resumequal.local.trial import trial_build
from resumequal.qualify.machine import Qualification, QualificationStatus, failed_verdict
from resumequal.qualify.plan import Plan, qualification_plan, scenario_plan
from resumequal.qualify.timeline import Timeline
from resumequal.redact import printable
from resumequal.report.terminal import ProgressDisplay, say
from resumequal.results.assembly import build_report
from resumequal.results.matrix import matrix_cell, seed_matrix
from resumequal.results.publish import upload, write_results
from resumequal.results.verdict import Matrix, MatrixCell, Report, Result, Verdict
from resumequal.run.layout import METRICS_PROM, RUN_FILE
from resumequal.run.location import RunLocation
from resumequal.run.name import run_uri
from resumequal.run.signing import KEY_ENV, RunSeal, key_from_env, new_key, new_run_id
from resumequal.spec import Omission, QualificationSpec, SpecError, apply_overrides
from resumequal.store import open_store

log = logging.getLogger(__name__)

# What replays a FAIL's first divergence into its report (spec.zoom: onFail):
# resumequal.zoom.replays.zoomed, handed in because the zoom package sits over this one.
Zoomer = Callable[[Report, RunLocation, QualificationSpec, Console], Report]


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
    """The exit status of a verdict (:mod:`resumequal.exitcodes`)."""
    return int(for_result(result))


def run_location(spec: QualificationSpec, opts: RunOptions,
                 seal: RunSeal | None = None) -> RunLocation:
    """The run folder, or ``<store>/<namespace>/<run>/<uid>`` when the checkpoint store is
    shared (an object store holds the whole run, for whoever reads it elsewhere)."""
    store = opts.store or spec.checkpoint.store
    if store is None or not open_store(store, spec.checkpoint.store_settings).shared():
        return RunLocation.open(str(opts.run_dir), seal=seal)
    uri = run_uri(store, opts.namespace, opts.run_dir.name, uuid.uuid4().hex[:12])
    return RunLocation.open(uri, spec.checkpoint.store_settings, seal=seal)


def new_seal() -> RunSeal:
    """This run's seal: a fresh run id, and the environment's key or a fresh one; handed to
    every process the run starts."""
    key = key_from_env() if os.environ.get(KEY_ENV) else new_key().encode()
    seal = RunSeal(key, new_run_id())
    runkey.export(seal)
    return seal


def check_runs_here(spec: QualificationSpec) -> None:
    """SpecError naming the field when the spec asks for what a local run cannot do, or
    when its workload cannot be built (:func:`~resumequal.local.trial.trial_build`)."""
    if spec.training.precision != "fp32":
        # torch only for this check: an fp32 run starts its legs without importing it here.
        from resumequal.train.distributed import resolve_backend
        from resumequal.train.precision import check_precision

        device = "cuda" if resolve_backend(spec.world.backend) == "nccl" else "cpu"
        try:
            check_precision(spec.training, device, spec.parallelism.kind)
        except TrainingError as e:
            raise SpecError(str(e)) from e
    trial_build(spec)


def run_qualification(spec: QualificationSpec, opts: RunOptions, console: Console,
                      zoom: Zoomer) -> Report:
    """Run every leg, deliver the kills, compare, and write reports and metrics."""
    return qualify_here(spec, opts, console, zoom).report


def qualify_here(spec: QualificationSpec, opts: RunOptions, console: Console,
                 zoom: Zoomer) -> Outcome:
    """:func:`run_qualification`, also saying where the result files were published.

    With ``spec.zoom: onFail``, a FAIL's report goes through ``zoom`` before the results
    are published, so report.json, report.html and the metrics carry the zoom."""
    check_runs_here(spec)
    if opts.store is not None:
        spec = apply_overrides(spec, [f"checkpoint.store={opts.store}"])
    location = run_location(spec, opts, new_seal())
    spec = location.leg_spec(spec)
    plan = qualification_plan(spec)
    if opts.omit:
        plan = Plan([replace(p, omit=opts.omit) if p.role == "main" else p for p in plan.legs],
                    plan.not_run)
    if not location.claim(spec):
        # Another run's traces are there: its legs' and ours would be appended together.
        raise UsageError(f"run location {location.uri} is taken: it holds another run "
                         f"({location.url(RUN_FILE)}); use a new --run-dir")
    assert location.seal is not None
    # compare --write and zoom of this run, later, authenticate it with the same seal.
    runkey.remember(location.uri, location.seal)
    if location.uri != RunLocation.open(str(opts.run_dir)).uri:
        say(console, f"run location {printable(location.uri)}")
    matrix = run_matrix(spec, opts, console, location) if spec.matrix.seeds else None
    status = _run_plan(spec, plan, opts.run_dir, opts, console, location=location)
    report, published = conclude(spec, status, opts, console, zoom, location, matrix)
    return Outcome(report, location, published)


def conclude(spec: QualificationSpec, status: QualificationStatus, opts: RunOptions,
             console: Console, zoom: Zoomer, location: RunLocation,
             matrix: Matrix | None = None) -> tuple[Report, dict[str, str]]:
    """The report of a run that has ended, written into the run folder and published; name
    -> where each result file is. The verdict is written whatever the store does."""
    verdict = status.verdict or failed_verdict(spec, status)
    # The report is made and published as patiently as the workers write: a verdict is not
    # lost to a store that is back within timeouts.backendErrorSeconds.
    patient = location.patient(spec.timeouts.backend_error_seconds)
    report_of = partial(build_report, spec, verdict, Timeline.of(status), run=opts.run_dir.name,
                        pin=opts.pin, status=status, matrix=matrix)
    try:
        report = report_of(location=patient)
    except StoreError as e:
        # The verdict was reached before: only what the report reads back is lost.
        log.warning("the report is made without the legs' traces: %s", e)
        report = report_of(location=None).model_copy(
            update={"incomplete": f"the legs' traces could not be read: {e}"})
    if spec.zoom == "onFail" and verdict.result is Result.FAIL and report.incomplete is None:
        try:
            report = zoom(report, patient, spec, console)
        except StoreError as e:
            log.warning("the first divergence is not zoomed: %s", e)
            report = report.model_copy(
                update={"incomplete": f"the first divergence could not be zoomed: {e}"})
    contents = write_results(report, opts.run_dir, namespace=opts.namespace,
                             metrics_file=opts.metrics_file, pushgateway=opts.pushgateway)
    try:
        return report, upload(contents, patient, metrics_file=opts.metrics_file)
    except StoreError as e:
        log.warning("the result files are not in the run location: %s", e)
        say(console, f"the result files are in {printable(str(opts.run_dir))} only: they "
                     f"could not be put into {printable(location.uri)}: {printable(str(e))}")
        local = {name: str(opts.run_dir / name) for name in contents}
        if opts.metrics_file is not None:
            local[METRICS_PROM] = str(opts.metrics_file)
        return report, local


def _run_plan(
    spec: QualificationSpec,
    plan: Plan,
    run_dir: Path,
    opts: RunOptions,
    console: Console,
    judge_legs: Sequence[str] = (),
    verdicts: dict[str, Verdict] | None = None,
    location: RunLocation | None = None,
) -> QualificationStatus:
    """Run ``plan`` to its end; judged as a qualification, or each of ``judge_legs``
    against the control leg (their verdicts into ``verdicts``)."""
    backend = LocalBackend(spec, run_dir, location=location, judge_legs=judge_legs,
                           verdicts=verdicts)
    q = Qualification(spec, backend, plan=plan, side_by_side=opts.side_by_side,
                      deliver_kill=opts.deliver_kill)
    progress = ProgressDisplay(console, legs=tuple(p.name for p in plan.legs))

    def on_tick(s: QualificationStatus) -> None:
        # The preempted leg's: every control leg restarts too, once, by design.
        main = s.legs.get(plan.legs[1].name) if len(plan.legs) > 1 else None
        restarts = max(0, main.attempts - 1) if main is not None else 0
        steps = {name: leg.steps for name, leg in s.legs.items() if leg.launched_at is not None}
        progress.update(s.phase.value, steps, spec.training.steps, restarts)

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with progress:
            return q.run(on_tick=on_tick)
    except ComparisonFailed:
        # As a cluster's comparator Job that ends without a verdict: the run has failed
        # (reason Error, the message saying why) and its report says so.
        return q.status
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_matrix(
    spec: QualificationSpec, opts: RunOptions, console: Console,
    location: RunLocation | None = None,
) -> Matrix:
    """Each positive scenario, for each seed, against that seed's reference leg."""
    parent = location or RunLocation.open(str(opts.run_dir))
    cells: list[MatrixCell] = []
    for seed in spec.matrix.seeds:
        sub = parent.child(f"seed-{seed}")
        seeded = sub.leg_spec(apply_overrides(spec, [f"training.seed={seed}"]))
        plan = scenario_plan(seeded)
        run_dir = opts.run_dir / f"seed-{seed}"
        verdicts: dict[str, Verdict] = {}
        say(console, f"seed {seed}: {len(plan.legs) - 1} scenario(s)")
        status = _run_plan(seeded, plan, run_dir, opts, console,
                           judge_legs=[leg.name for leg in plan.legs if leg.cut],
                           verdicts=verdicts, location=sub)
        why_not = status.message or "the scenario did not finish"
        cells += [matrix_cell(scenario, seed, verdicts.get(scenario), why_not)
                  for scenario in spec.matrix.scenarios]
    return seed_matrix(spec.matrix.seeds, spec.matrix.scenarios, cells)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def default_run_dir(base: Path = Path("runs")) -> Path:
    return base / time.strftime("qual-%Y%m%d-%H%M%S")


__all__ = ["Outcome", "RunOptions", "default_run_dir", "exit_code", "qualify_here",
           "run_location", "run_qualification"]
