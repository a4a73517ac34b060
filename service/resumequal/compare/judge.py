"""``compare_run``: from a finished run location to a verdict.

Order: validity checks on the traces; the final checkpoints' verification and drift
(tolerance mode needs the drift to judge digest boundaries); a walk over the steps the
preempted leg ran before the kill, which decides NONDETERMINISTIC; then the walk over the
steps both legs finally ran, which decides FAIL or PASS.
"""

from __future__ import annotations

from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.compare.drift import FinalCheckpointRefused, checkpoint_drift, is_exact
from resumequal.compare.files import LegTrace, final_checkpoint
from resumequal.compare.resize import judge_resize
from resumequal.compare.resizechecks import resize_checks
from resumequal.compare.restore import restore_divergence, restore_words, saved_records
from resumequal.compare.validity import (
    check_armed,
    check_control_uninterrupted,
    check_final_checkpoints,
    check_inventory,
    check_restarted,
    check_restored_checkpoint,
    check_steps,
    check_traces,
    resumed_attempt,
)
from resumequal.compare.walk import Rules, Walk, divergence, loss_deltas, walk
from resumequal.errors import CheckpointError, CheckpointMissing, StoreError
from resumequal.results.verdict import (
    Cut,
    Divergence,
    DriftSummary,
    Result,
    ValidityCheck,
    Verdict,
)
from resumequal.run.location import RunLocation
from resumequal.spec import REFERENCE_LEG, QualificationSpec
from resumequal.spec.boundaries import BOUNDARIES, Boundary
from resumequal.trace.records import CompiledRecord, RestoreRecord, StepRecord
from resumequal.words import count


def _cut(spec: QualificationSpec) -> Cut:
    p = spec.preemption
    return Cut(step=p.step, microstep=p.microstep, rank=p.rank, mode=p.mode, at=p.at)


def _precut_steps(preempted: LegTrace, resumed_step: int) -> dict[int, dict[int, StepRecord]]:
    """What the preempted leg did before the kill: attempt 0's steps, and any step before
    the resumed checkpoint's (those the restart did not redo)."""
    out = preempted.attempt_steps(0)
    for rank, steps in preempted.effective.items():
        for step, record in steps.items():
            if step < resumed_step:
                out.setdefault(rank, {}).setdefault(step, record)
    return out


def _drift_fault(drift: list[DriftSummary], rules: Rules) -> DriftSummary | None:
    """The first group whose final drift the comparison does not accept, if any."""
    for d in drift:
        boundary = "params" if d.group == "model" else "optimizer_state"
        if is_exact(d) or not rules.compares(boundary):
            continue
        tol = rules.tolerance(boundary)
        if tol is None or not rules.group_within(d.group, tol):
            return d
    return None


def _drift_words(drift: list[DriftSummary]) -> str:
    parts = []
    for d in drift:
        if is_exact(d):
            parts.append(f"{d.group} bitwise equal")
        else:
            extra = f", {len(d.values_differ)} value(s) differ" if d.values_differ else ""
            extra += f", {len(d.unmatched)} key(s) unmatched" if d.unmatched else ""
            parts.append(f"{d.group} max abs diff {d.max_abs_diff:.3g} "
                         f"({d.mismatch_fraction:.3g} of elements differ{extra})")
    return "final " + " and ".join(parts) if parts else "no final drift measured"


def _drift_divergence(fault: DriftSummary, steps: int) -> Divergence:
    worst = fault.worst[0].name if fault.worst else (fault.values_differ + fault.unmatched)[0]
    boundary: Boundary = "params" if fault.group == "model" else "optimizer_state"
    return Divergence(step=steps, boundary=boundary, rank=0,
                      control=f"{Position(steps).name}: {worst}",
                      preempted=f"max abs diff {fault.max_abs_diff:.3g}", before_cut=False)


def _final_drift(
    spec: QualificationSpec, location: RunLocation, leg: str
) -> tuple[ValidityCheck, list[DriftSummary] | None]:
    """Open both legs' final checkpoints and measure their drift (None: not measured).

    Each is read where it lies, through its authenticated manifest: every chunk the drift
    reads is checked as it is read; nothing is copied.
    """
    name = "final_checkpoints"
    final_name = Position(spec.training.steps).name
    finals: dict[str, VerifiedCheckpoint | None] = {}
    for role, leg_name in (("control", REFERENCE_LEG), ("preempted", leg)):
        try:
            finals[role] = final_checkpoint(spec, location, leg_name)
        except CheckpointMissing:
            return ValidityCheck(name=name, ok=False, detail=(
                f"the {role} leg has no final checkpoint {final_name}")), None
        except CheckpointError as e:
            what = ("cannot be read" if isinstance(e.__cause__, StoreError)
                    else "fails verification")
            return ValidityCheck(name=name, ok=False,
                                 detail=f"the {role} leg's final checkpoint {what}: {e}"), None
    final_check, final = check_final_checkpoints(finals, spec.training.steps)
    if final is None:
        return final_check, None
    try:
        return final_check, checkpoint_drift(final.control, final.preempted)
    except FinalCheckpointRefused as e:
        return ValidityCheck(name=final_check.name, ok=False, detail=str(e)), None
    except CheckpointError as e:
        return ValidityCheck(name=final_check.name, ok=False,
                             detail=f"the final checkpoints cannot be compared: {e}"), None


def compare_run(
    location: RunLocation, spec: QualificationSpec | None = None, *, leg: str = "preempted"
) -> Verdict:
    """Compare the reference leg of ``location`` with a preempted leg (default: "preempted").

    ``spec`` defaults to the run's own (:meth:`RunLocation.read_spec`); for another leg (a
    scenario or a negative control) pass the spec that leg ran with, so its cut and kill
    mode are the ones judged.
    """
    spec = spec if spec is not None else location.read_spec()
    world = spec.world.world_size
    control = LegTrace.read(location, REFERENCE_LEG, world)
    preempted = LegTrace.read(location, leg, world)
    attempt = resumed_attempt(preempted)
    restore = next((r for r in preempted.of(RestoreRecord) if r.attempt == attempt), None)
    resumed_from = restore.checkpoint if restore is not None else None

    def invalid(checks: list[ValidityCheck]) -> Verdict:
        failed = next(c for c in checks if not c.ok)
        return Verdict(result=Result.INVALID, reason=f"invalid: {failed.detail}", cut=_cut(spec),
                       resumed_from=resumed_from, first_divergence=None, exact_through_step=0,
                       checks=checks)

    checks = [check_traces(control, preempted), check_control_uninterrupted(control),
              check_armed(spec, preempted, location), check_restarted(preempted)]
    if spec.preemption.resize is not None:
        # A world that changes size: restores, steps and state judged per world, not rank.
        if all(c.ok for c in checks):
            checks += resize_checks(spec, control, preempted)
    else:
        run = location.seal.run if location.seal is not None else None
        checks += [check_restored_checkpoint(spec, preempted, attempt, run),
                   check_steps(control, preempted, spec.training.steps)]
    checks.append(check_inventory(control, preempted))
    if not all(c.ok for c in checks):
        return invalid(checks)
    final_check, drift = _final_drift(spec, location, leg)
    checks.append(final_check)
    if drift is None:
        return invalid(checks)
    if spec.preemption.resize is not None:
        return judge_resize(spec, control, preempted, drift, checks, _cut(spec))
    assert restore is not None  # check_restored_checkpoint passed
    return _judge(spec, control, preempted, restore, drift, checks)


def autotune_differences(control: LegTrace, preempted: LegTrace) -> list[str]:
    """Where a preempted process's autotuner chose another kernel than the control leg's
    for the same op and input sizes on the same rank (each difference once, in words)."""
    out: list[str] = []
    for rank in sorted(control.ranks):
        chosen = {(c.op, tuple(c.inputs)): c.choice
                  for r in control.of(CompiledRecord, rank) for c in r.autotuned}
        for record in preempted.of(CompiledRecord, rank):
            for c in record.autotuned:
                theirs = chosen.get((c.op, tuple(c.inputs)))
                if theirs is not None and theirs != c.choice:
                    words = (f"{c.op} {' x '.join(c.inputs)} on rank {rank}: {theirs} in the "
                             f"control leg, {c.choice} in attempt {record.attempt}")
                    if words not in out:
                        out.append(words)
    return out


def _compile_cause(control: LegTrace, preempted: LegTrace) -> str:
    """A FAIL reason's suffix naming autotuned kernels that differ between the legs."""
    differences = autotune_differences(control, preempted)
    if not differences:
        return ""
    return ("; inductor's autotuner chose different kernels in a fresh process: "
            + "; ".join(differences))


def _judge(spec: QualificationSpec, control: LegTrace, preempted: LegTrace,
           restore: RestoreRecord, drift: list[DriftSummary],
           checks: list[ValidityCheck]) -> Verdict:
    """The verdict of two valid legs: determinism before the cut, then the first divergence
    after the resume, then the final checkpoints' drift."""
    steps, world = spec.training.steps, spec.world.world_size
    ranks = list(range(world))
    rules = Rules(spec.comparison, {d.group: d for d in drift})
    ctrl, pre = control.effective, preempted.effective
    resume_label = f"after the resume from {restore.checkpoint}"
    precut = _precut_steps(preempted, restore.step)
    early = walk(ctrl, precut, sorted({s for r in precut.values() for s in r}), ranks, rules,
                 skip_missing=True).first
    result = walk(ctrl, pre, range(1, steps + 1), ranks, rules)
    deltas = loss_deltas(ctrl, pre, range(1, steps + 1))

    def verdict(outcome: Result, reason: str, first: Divergence | None, exact: int) -> Verdict:
        return Verdict(result=outcome, reason=reason, cut=_cut(spec),
                       resumed_from=restore.checkpoint, first_divergence=first,
                       exact_through_step=exact, checks=checks, drift=drift,
                       loss_deltas=deltas, boundary_table=result.rows, steps_compared=steps,
                       ranks_compared=world)

    if early is not None:
        div = divergence(early, ctrl, precut, before_cut=True)
        words = div.tensor_words() or div.spread_words()
        which = f"; {words}" if words else ""
        reason = (f"not run-to-run deterministic: legs already differ at step {early.step} "
                  f"({early.boundary}, rank {early.rank}{which}) before the kill")
        return verdict(Result.NONDETERMINISTIC, reason, div,
                       min(result.exact_through, early.step - 1))
    restores = {r.rank: r for r in preempted.of(RestoreRecord) if r.attempt == restore.attempt}
    at_restore = restore_divergence(restores, saved_records(control, preempted, restores))
    if at_restore is not None:
        reason = (restore_words(at_restore, restore.checkpoint)
                  + _after_restore(result, restore.step))
        return verdict(Result.FAIL, reason, at_restore,
                       min(result.exact_through, restore.step))
    if result.first is not None:
        p = result.first
        div = divergence(p, ctrl, pre, before_cut=pre[p.rank][p.step].attempt == 0)
        which = f" ({div.tensor_words()})" if div.tensor_words() else ""
        spread = f"; then {div.spread_words()}" if div.spread_words() else ""
        reason = (f"first divergence at step {p.step}, boundary {p.boundary}, rank {p.rank}"
                  f"{which}, {resume_label}{spread}{_compile_cause(control, preempted)}")
        return verdict(Result.FAIL, reason, div, result.exact_through)
    fault = _drift_fault(drift, rules)
    if fault is not None:
        reason = (f"every boundary of {steps} steps matched, but the final checkpoints differ "
                  f"{resume_label}: {_drift_words(drift)}{_compile_cause(control, preempted)}")
        return verdict(Result.FAIL, reason, _drift_divergence(fault, steps),
                       result.exact_through)
    return verdict(Result.PASS, _pass_reason(spec, result, drift), None, result.exact_through)


def _after_restore(result: Walk, step: int) -> str:
    """'; then params differ from step 5' for a FAIL at the restore: what it led to."""
    later = result.first
    if later is None or later.step <= step:
        return ""
    return f"; then {later.boundary} differs from step {later.step} (rank {later.rank})"


def _pass_reason(spec: QualificationSpec, result: Walk,
                 drift: list[DriftSummary]) -> str:
    """Why a PASS passed: exact, equal on fewer boundaries, or within the tolerances."""
    steps, world = spec.training.steps, spec.world.world_size
    compared = spec.comparison.boundaries
    if len(compared) < len(BOUNDARIES):
        return (f"equal on the compared boundaries ({', '.join(compared)}) of "
                f"{count(steps, 'step')} on {count(world, 'rank')}; the others were not "
                "looked at")
    if result.exact_through == steps and all(is_exact(d) for d in drift):
        return (f"exact: every boundary of {count(steps, 'step')} on {count(world, 'rank')} "
                "equal; final model and optimizer bitwise equal")
    relaxed = sorted({b for row in result.rows for b, s in row.status.items()
                      if s == "within_tolerance"})
    return (f"within tolerance: {count(steps, 'step')} on {count(world, 'rank')}, exact "
            f"through step {result.exact_through}; {', '.join(relaxed) or 'no boundary'} "
            f"within the declared tolerances; {_drift_words(drift)}")
