"""The replays of a divergent step, one per leg, and what their comparison found.

For each leg, the attempt whose run of the step is authoritative (its last record of it)
is found in the leg's trace, with the checkpoint that attempt restored. Each leg is then
replayed on this machine under torchrun, with as many ranks as ran the step, from that
checkpoint (or from the beginning, for an attempt that started there) through the step,
capturing it whole (:mod:`resumequal.train.replay`). Starting where the leg's process
started, not at the newest checkpoint before the step, runs again what that process ran
before the step: a difference that comes from a process's history (a DDP reducer's age, a
module that counts its calls) is reproduced, not only one that comes from state.

Each replay's digests of the step are checked against the leg's own, and the captures are
compared (:mod:`resumequal.zoom.captures`). ``resumequal run`` zooms here (``spec.zoom:
onFail``, :func:`zoomed`); ``resumequal zoom``, the cluster's zoom Job, is
:mod:`resumequal.zoom.job`.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from resumequal.compare.files import LegTrace
from resumequal.errors import ReportError, ResumequalError, UsageError
from resumequal.local.processes import ProcessTree
from resumequal.redact import printable
from resumequal.report.terminal import say
from resumequal.results.verdict import Report, Verdict, Zoom, ZoomReplay
from resumequal.run.layout import ZOOM_JSON
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal, key_from_env
from resumequal.spec import REFERENCE_LEG, QualificationSpec
from resumequal.spec.boundaries import BOUNDARIES
from resumequal.spec.launchers import TORCHRUN
from resumequal.trace.records import (
    InventoryRecord,
    RestoreRecord,
    StepRecord,
    boundary_value,
)
from resumequal.zoom.captures import Capture, compare_captures, load_capture, summary

log = logging.getLogger(__name__)

MAIN_LEG = "preempted"
# Inventory items that differ between any two processes and say nothing of the numerics.
_NOT_COMPARABLE = frozenset({"kind", "pid", "host", "rank", "attempt"})


@dataclass(frozen=True)
class ReplayStart:
    """Where a leg's replay starts and with how many ranks."""

    leg: str
    attempt: int
    start: str | None
    world_size: int
    records: Mapping[int, StepRecord]  # rank -> the leg's record of the step
    inventory: InventoryRecord | None


def replay_start(location: RunLocation, spec: QualificationSpec, leg: str, step: int,
                 rank: int) -> ReplayStart:
    """The attempt of ``leg`` that ran ``step`` last (on ``rank``) and what it restored."""
    trace = LegTrace.read(location, leg, spec.world.world_size)
    if rank not in trace.ranks:
        raise ReportError("; ".join(trace.problems) or f"the {leg} leg has no trace")
    record = trace.effective[rank].get(step)
    if record is None:
        raise ReportError(f"the {leg} leg has no record of step {step} on rank {rank}")
    attempt = record.attempt
    restores = [r for r in trace.of(RestoreRecord, rank) if r.attempt == attempt]
    world = record.world_size or spec.world.world_size
    records = {r: steps[step] for r, steps in trace.attempt_steps(attempt).items()
               if step in steps}
    inventories = [r for r in trace.of(InventoryRecord, rank) if r.attempt == attempt]
    return ReplayStart(leg=leg, attempt=attempt,
                       start=restores[-1].checkpoint if restores else None,
                       world_size=world, records=records,
                       inventory=inventories[-1] if inventories else None)


def _replay(start: ReplayStart, step: int, location: RunLocation,
            spec: QualificationSpec, work: Path, python: str) -> dict[int, Capture]:
    """Run one leg's replay under torchrun; each rank's capture."""
    out = work / start.leg
    cmd = [python, *TORCHRUN, "--standalone", f"--nproc-per-node={start.world_size}",
           "--max-restarts=0", "--monitor-interval=0.1",
           "-m", "resumequal", "replay", "--leg", start.leg, "--run-dir", location.uri,
           "--step", str(step), "--attempt", str(start.attempt), "--capture-dir", str(out)]
    if start.start is not None:
        cmd += ["--from-checkpoint", start.start]
    env = dict(os.environ, OMP_NUM_THREADS=str(spec.world.threads_per_rank))
    settings = spec.checkpoint.store_settings
    if settings is not None:
        env.update(settings.environment())
    log_path = work / f"{start.leg}.replay.log"
    tree = ProcessTree()
    proc = tree.spawn(cmd, log_path, env)
    limit = spec.timeouts.leg_seconds
    deadline = time.monotonic() + limit
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise ReportError(f"the replay of the {start.leg} leg did not finish within "
                                  f"{limit:g} s (timeouts.leg_seconds)")
            time.sleep(0.1)
    finally:
        tree.stop_all()
    if proc.returncode != 0:
        lines = log_path.read_text(errors="replace").strip().splitlines()
        # A rank's own error line (resumequal replay prints one) says it best.
        errors = list(dict.fromkeys(ln.split("error: ", 1)[1] for ln in lines
                                    if "error: " in ln))
        why = "; ".join(errors) if errors else "\n".join(lines[-12:])
        raise ReportError(f"the replay of the {start.leg} leg exited {proc.returncode} "
                          f"({log_path.name}): {why}")
    return {rank: load_capture(out / f"rank-{rank}.pt") for rank in range(start.world_size)}


def _reproduced(start: ReplayStart, work: Path, step: int,
                seal: RunSeal | None) -> tuple[bool, str]:
    """Whether the replay recorded the step as the leg did, boundary by boundary."""
    local = RunLocation.open(str(work / start.leg / "run"), seal=seal)
    traces = local.traces(start.leg)
    differ: dict[str, list[int]] = {}
    for rank, original in sorted(start.records.items()):
        replayed = [r for r in traces.records(rank)
                    if isinstance(r, StepRecord) and r.step == step]
        if not replayed:
            return False, f"the replay recorded no step {step} on rank {rank}"
        for boundary in BOUNDARIES:
            if boundary_value(original, boundary) != boundary_value(replayed[-1], boundary):
                differ.setdefault(boundary, []).append(rank)
    if not differ:
        return True, f"the replay's step {step} equals the leg's at every boundary"
    parts = ", ".join(f"{b} (rank {', '.join(map(str, r))})" for b, r in differ.items())
    return False, (f"the replay's step {step} differs from the leg's at {parts}: the leg "
                   "did not run the step as a fresh replay does")


def _inventory_differences(a: InventoryRecord | None, b: InventoryRecord | None
                           ) -> dict[str, Any]:
    if a is None or b is None:
        return {}
    da, db = a.model_dump(mode="json"), b.model_dump(mode="json")
    out: dict[str, Any] = {}
    for key in sorted(set(da) | set(db)):
        if key in _NOT_COMPARABLE:
            continue
        va, vb = da.get(key), db.get(key)
        if key == "env" and isinstance(va, dict) and isinstance(vb, dict):
            for name in sorted(set(va) | set(vb)):
                if va.get(name) != vb.get(name):
                    out[f"env.{name}"] = {"control": va.get(name), "preempted": vb.get(name)}
        elif va != vb:
            out[key] = {"control": va, "preempted": vb}
    return out


def zoom_run(location: RunLocation, spec: QualificationSpec, *, step: int, rank: int,
             boundary: str | None, leg: str = MAIN_LEG, work: Path,
             python: str = sys.executable) -> Zoom:
    """Replay ``step`` of the control leg and ``leg`` and compare them (no files written)."""
    starts = [replay_start(location, spec, name, step, rank) for name in (REFERENCE_LEG, leg)]
    if any(s.start is not None for s in starts):
        key_from_env()  # no replay starts without the key that authenticates checkpoints
    if starts[0].world_size != starts[1].world_size:
        raise ReportError(f"step {step} ran on {starts[0].world_size} ranks in the control "
                          f"leg and {starts[1].world_size} in the {leg} leg: zoom compares "
                          "equal worlds")
    captures = []
    replays = []
    for start in starts:
        log.info("replaying step %d of the %s leg (attempt %d, from %s, %d ranks)", step,
                 start.leg, start.attempt, start.start or "the beginning", start.world_size)
        captures.append(_replay(start, step, location, spec, work, python))
        ok, detail = _reproduced(start, work, step, location.seal)
        replays.append(ZoomReplay(leg=start.leg, attempt=start.attempt, start=start.start,
                                  world_size=start.world_size, reproduced=ok, detail=detail))
    found = compare_captures(captures[0], captures[1])
    return Zoom(
        step=step, boundary=boundary, replays=replays, origin_kind=found.origin_kind,
        origins=found.origins,
        summary=summary(step, found, replays),
        modules_total=found.modules_total, modules=found.modules, stages=found.stages,
        buckets=found.buckets,
        inventory_differences=_inventory_differences(starts[0].inventory, starts[1].inventory),
    )


def zoom_of(location: RunLocation, spec: QualificationSpec, verdict: Verdict | None, *,
            step: int | None = None, leg: str = MAIN_LEG,
            python: str = sys.executable) -> Zoom:
    """Replay ``step`` (default: ``verdict``'s first divergence) of the run at ``location``."""
    divergence = verdict.first_divergence if verdict is not None else None
    # A difference in the restored state shows in the first step the resumed attempt ran,
    # as state its modules began that step with.
    diverged_in = None if divergence is None else \
        divergence.step + 1 if divergence.at_restore else divergence.step
    if step is None:
        if diverged_in is None:
            why = "no verdict yet" if verdict is None else f"the verdict is {verdict.result}"
            raise UsageError(f"{location.uri} has no first divergence to zoom into ({why}); "
                             "name a step with --step")
        step = diverged_in
    if not 1 <= step <= spec.training.steps:
        raise UsageError(f"--step {step}: the run trains steps 1 to {spec.training.steps}")
    on_divergence = divergence is not None and diverged_in == step
    rank = divergence.rank if divergence is not None and on_divergence else 0
    work = Path(tempfile.mkdtemp(prefix="resumequal-zoom-"))
    try:
        return zoom_run(location, spec, step=step, rank=rank, leg=leg, work=work,
                        boundary=divergence.boundary if divergence and on_divergence else None,
                        python=python)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def write_zoom(location: RunLocation, zoom: Zoom) -> str:
    """Put ``zoom.json`` into the run location; its URI."""
    return location.put_result(ZOOM_JSON, zoom.model_dump_json(indent=1).encode())


def zoomed(report: Report, location: RunLocation, spec: QualificationSpec,
           console: Console) -> Report:
    """``report`` with a zoom into its first divergence (``spec.zoom: onFail``); a zoom that
    cannot run is said, and the verdict stands without it."""
    say(console, "zooming into the first divergence (spec.zoom: onFail)")
    try:
        zoom = zoom_of(location, spec, report.verdict)
        write_zoom(location, zoom)
    except ResumequalError as e:
        log.warning("zoom failed: %s", e)
        say(console, printable(f"zoom: error: {e}"))
        return report
    return report.model_copy(update={"zoom": zoom})
