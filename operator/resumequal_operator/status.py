"""A QualificationRun's status from the qualification machine's memory, and back.

The status is derived, never edited in place: every reconcile computes it whole from the
machine (:class:`resumequal.qualify.machine.QualificationStatus`, kept in ``status.machine``) and
the previous status, which only contributes what the machine does not keep: condition
transition times and the verdict summary of a finished run.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError

from resumequal.qualify.machine import MAIN_LEG, Phase, QualificationStatus, failed_reason
from resumequal.qualify.timeline import restart_seconds
from resumequal.redact import redact
from resumequal.results.verdict import Result, Verdict
from resumequal.spec.launchers import caveats
from resumequal.words import clip
from resumequal_operator.runstatus import (
    Condition,
    FirstDivergence,
    LegStatus,
    PreemptionStatus,
    QualificationRunStatus,
    VerdictStatus,
    ZoomStatus,
)

ConditionStatus = Literal["True", "False", "Unknown"]
INVALID_SPEC = "InvalidSpec"
NOT_ALLOWED = "NotAllowed"  # refused by the operator's allowlists
NOT_SUPPORTED = "NotSupported"  # needs a feature its stack.torchVersion lacks


def machine_of(status: QualificationRunStatus | None) -> QualificationStatus | None:
    """The stored machine, or None for a run not started (or a machine this code cannot
    read, which then starts over: legs are idempotent to launch)."""
    if status is None or not status.machine:
        return None
    try:
        return QualificationStatus.model_validate(status.machine)
    except ValidationError:
        return None


# Key in ``status.machine`` of the spec a run started with: a started run keeps it, so an
# edit of the resource's spec cannot change a qualification halfway.
RUN_SPEC = "runSpec"


def stored_machine(machine: QualificationStatus, run_spec: dict[str, Any]) -> dict[str, Any]:
    """What goes into ``status.machine``: everything but the verdict, which can be large
    (boundary tables, per-step losses) and lives in the store's verdict.json; plus the
    spec the run started with. camelCase, like the rest of the status."""
    return {**machine.model_dump(mode="json", by_alias=True, exclude={"verdict"}),
            RUN_SPEC: run_spec}


def pinned_spec(status: QualificationRunStatus | None) -> dict[str, Any] | None:
    """The spec a started run keeps (see :data:`RUN_SPEC`), or None."""
    if status is None or not isinstance(status.machine.get(RUN_SPEC), dict):
        return None
    return dict(status.machine[RUN_SPEC])


def read_status(obj: dict[str, Any]) -> QualificationRunStatus | None:
    raw = obj.get("status")
    if not raw:
        return None
    try:
        return QualificationRunStatus.model_validate(raw)
    except ValidationError:
        return None  # written by another version: rebuilt from scratch


def verdict_summary(v: Verdict) -> VerdictStatus:
    d = v.first_divergence
    model = next((x for x in v.drift if x.group == "model"), None)
    losses = [x.abs_diff for x in v.loss_deltas]
    loss = None if not losses or any(not math.isfinite(x) for x in losses) else max(losses)
    return VerdictStatus(
        result=v.result,
        reason=None if v.reason is None else clip(redact(v.reason)),
        first_divergence=None if d is None else FirstDivergence(step=d.step,
                                                                 boundary=d.boundary,
                                                                 rank=d.rank),
        first_divergence_summary="none" if d is None else f"step {d.step} {d.boundary} "
                                                          f"rank {d.rank}"
                                                          + (" at the restore"
                                                             if d.at_restore else ""),
        exact_through_step=v.exact_through_step,
        param_max_abs_diff=None if model is None else model.max_abs_diff,
        param_rel_l2_diff=None if model is None else model.rel_l2,
        param_mismatch_fraction=None if model is None else model.mismatch_fraction,
        loss_max_abs_diff=loss,
        controls_detected=v.controls_detected,
        controls_total=v.controls_total,
    )


def _condition(previous: QualificationRunStatus | None, type_: Literal["Ready", "Qualified"],
               status: ConditionStatus, reason: str, message: str,
               generation: int | None) -> Condition:
    """A condition whose lastTransitionTime moves only when its status changes."""
    old = next((c for c in (previous.conditions if previous else []) if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else None
    return Condition(type=type_, status=status, reason=reason, message=clip(redact(message)),
                     last_transition_time=since or datetime.now(UTC),
                     observed_generation=generation)


def conditions(previous: QualificationRunStatus | None, phase: Phase, reason: str | None,
               message: str | None, verdict: VerdictStatus | None,
               generation: int | None) -> list[Condition]:
    """Ready: True once finished with a verdict, False when it failed, Unknown meanwhile.
    Qualified: True for a PASS, False for any other verdict or a failure, else Unknown."""
    if phase == Phase.SUCCEEDED:
        ready: tuple[ConditionStatus, str, str] = ("True", reason or "Completed",
                                                   message or "finished")
    elif phase == Phase.FAILED:
        ready = ("False", reason or "Failed", message or "failed")
    else:
        ready = ("Unknown", phase.value, f"the qualification is in phase {phase.value}")
    if verdict is not None:
        ok = verdict.result == Result.PASS
        qualified: tuple[ConditionStatus, str, str] = (
            "True" if ok else "False", verdict.result.value, verdict.reason or "")
    elif phase == Phase.FAILED:
        qualified = ("False", reason or "Failed", message or "failed")
    else:
        qualified = ("Unknown", "NoVerdict", "no verdict yet")
    return [_condition(previous, "Ready", *ready, generation),
            _condition(previous, "Qualified", *qualified, generation)]


def run_status(
    machine: QualificationStatus,
    *,
    previous: QualificationRunStatus | None,
    generation: int | None,
    pin: str,
    run_uri: str,
    report_url: str | None,
    leg_jobs: dict[str, str],
    comparator_job: str | None,
    preemption_mode: Literal["hard", "graceful"],
    run_spec: dict[str, Any],
    zoom: ZoomStatus | None = None,
    backend: str | None = None,
    launcher: str | None = None,
    checkpoint_key_secret: str | None = None,
) -> QualificationRunStatus:
    """The whole status of a run from its machine (see the module docstring)."""
    verdict = (verdict_summary(machine.verdict) if machine.verdict is not None
               else previous.verdict if previous is not None else None)
    done = machine.done
    history = machine.history
    return QualificationRunStatus.model_validate({
        "phase": machine.phase,
        "observedGeneration": generation,
        "backend": backend,
        "launcher": launcher,
        "launcherCaveats": (caveats(launcher) if launcher is not None else []) or None,
        "checkpointKeySecret": checkpoint_key_secret,
        "conditions": conditions(previous, machine.phase,
                                 machine.reason.value if machine.reason else None,
                                 machine.message, verdict, generation),
        "pin": pin,
        "runUri": run_uri,
        "reportUrl": report_url,
        "legs": _leg_statuses(machine, leg_jobs),
        "preemption": _preemption(machine, preemption_mode),
        "comparatorJob": comparator_job,
        "verdict": _shown_verdict(machine, verdict),
        "zoom": zoom if zoom is not None else previous.zoom if previous is not None else None,
        "startedAt": history[0].at if history else None,
        "completedAt": history[-1].at if done and history else None,
        "machine": stored_machine(machine, run_spec),
    })


def _leg_statuses(machine: QualificationStatus,
                  leg_jobs: dict[str, str]) -> dict[str, LegStatus]:
    """Each leg's progress, naming its Job once it was launched."""
    return {name: LegStatus.model_validate({
        "job": leg_jobs.get(name) if leg.launched_at is not None else None,
        "attempts": leg.attempts, "steps": leg.steps, "launchedAt": leg.launched_at,
        "killedAt": leg.killed_at, "resumedAt": leg.resumed_at,
        "finishedAt": leg.finished_at,
        "restartSeconds": restart_seconds(leg.killed_at, leg.resumed_at),
    }) for name, leg in machine.legs.items()}


def _preemption(machine: QualificationStatus,
                mode: Literal["hard", "graceful"]) -> PreemptionStatus | None:
    """The kill of the main preempted leg: which pod and rank, and when; None before it."""
    main = machine.legs.get(MAIN_LEG)
    if main is None or main.beacon is None or main.killed_at is None:
        return None
    return PreemptionStatus.model_validate({
        "leg": MAIN_LEG, "pod": main.beacon.pod, "rank": main.beacon.rank,
        "mode": mode, "injectedAt": main.killed_at})


def _shown_verdict(machine: QualificationStatus,
                   verdict: VerdictStatus | None) -> VerdictStatus | None:
    """The verdict the status shows: the run's, or INVALID for a run that failed first."""
    if verdict is None and machine.phase == Phase.FAILED:
        # A run that failed before its comparison tested nothing: INVALID, as the metrics
        # and the local runner say, so `kubectl get qr` shows a verdict for every finished run.
        return VerdictStatus(result=Result.INVALID, reason=clip(failed_reason(machine)))
    return verdict


def invalid_status(previous: QualificationRunStatus | None, generation: int | None,
                   message: str, *, reason: str = INVALID_SPEC) -> QualificationRunStatus:
    """A run whose spec cannot run (or may not: ``reason`` NotAllowed): Failed,
    Ready=False naming the field; no machine."""
    now = datetime.now(UTC)
    return QualificationRunStatus.model_validate({
        "phase": Phase.FAILED,
        "observedGeneration": generation,
        "conditions": [
            _condition(previous, "Ready", "False", reason, message, generation),
            _condition(previous, "Qualified", "False", reason, message, generation),
        ],
        "verdict": VerdictStatus(result=Result.INVALID,
                                 reason=clip(redact(f"{reason}: {message}"))),
        "startedAt": previous.started_at if previous and previous.started_at else now,
        "completedAt": now if previous is None or previous.completed_at is None
        else previous.completed_at,
        # A run stopped after it started keeps naming its Secret (deleted with the run).
        "checkpointKeySecret": previous.checkpoint_key_secret if previous else None,
    })
