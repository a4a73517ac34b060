"""Negative controls: each deliberately broken resume must be caught, or shown irrelevant.

A negative control is *detected* when its leg, compared with the reference leg like any
preempted leg, FAILs. It is *not applicable* when the reference leg's own trace shows the
omitted state was never used in the compared window (the RNG states never advanced, the
learning rate never changed, no gradient was pending at the resume, the loss scaler was
still in its initial state where the resume picked up) — the report gives that evidence,
which each control's descriptor (:data:`resumequal.spec.omissions.CONTROLS`) looks for.
Otherwise the comparator is *blind* to that omission and the whole qualification is
INVALID: its PASS has not been shown to mean anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from resumequal.compare.files import LegTrace
from resumequal.compare.judge import compare_run
from resumequal.qualify.plan import LegPlan, NotRun, qualification_plan
from resumequal.results.verdict import BoundaryRow, ControlOutcome, Result, Verdict
from resumequal.run.location import RunLocation
from resumequal.spec import REFERENCE_LEG, QualificationSpec
from resumequal.spec.boundaries import TABLE
from resumequal.spec.omissions import control
from resumequal.trace.records import RestoreRecord

# "learning rate differed from step 6": each boundary as a sentence names it.
_NAMES: Final[Mapping[str, str]] = {b.name: b.label for b in TABLE}


def compare_qualification(location: RunLocation,
                          spec: QualificationSpec | None = None) -> Verdict:
    """The main verdict of ``location`` plus its negative controls, judged together."""
    spec = spec if spec is not None else location.read_spec()
    plan = qualification_plan(spec)
    verdict = compare_run(location, spec, leg="preempted")
    if verdict.result == Result.NONDETERMINISTIC:
        # The legs already differ before the kill: the stack is not run-to-run
        # reproducible, so no resume can be judged exact or broken, a control's neither.
        # The answer is NONDETERMINISTIC, whatever the controls did.
        judged = [ControlOutcome(
            omission=leg.omit[0], leg=leg.name, method=leg.method, status="not_judged",
            mechanism="not judged: the main legs already differ before the kill")
            for leg in plan.negative_controls]
        return verdict.model_copy(update={
            "controls": judged + [_not_run(n) for n in plan.not_run]})
    outcomes = [evaluate_control(location, leg) for leg in plan.negative_controls]
    outcomes += [_not_run(n) for n in plan.not_run]
    if not outcomes:
        return verdict
    verdict = verdict.model_copy(update={"controls": outcomes})
    if verdict.result == Result.INVALID:
        return verdict
    blind = [c.omission for c in outcomes if c.status == "blind"]
    broken = [c for c in outcomes if c.status == "invalid"]
    if blind:
        return verdict.model_copy(update={
            "result": Result.INVALID,
            "reason": f"invalid: comparator blind to {', '.join(blind)} — a resume without "
                      f"that state matched the control, so this {verdict.result.value} "
                      "has not been shown to mean anything",
        })
    if broken:
        c = broken[0]
        return verdict.model_copy(update={
            "result": Result.INVALID,
            "reason": f"invalid: the negative control {c.omission} did not run as planned: "
                      f"{c.mechanism}",
        })
    return verdict


def _not_run(n: NotRun) -> ControlOutcome:
    return ControlOutcome(omission=n.omission, leg=None, method="not run", status="not_applicable",
                          mechanism=n.mechanism,
                          evidence=n.evidence)


def evaluate_control(location: RunLocation, plan: LegPlan) -> ControlOutcome:
    """Compare one negative control's leg with the reference leg and classify the outcome."""
    (omission,) = plan.omit
    v = compare_run(location, plan.spec, leg=plan.name)
    def outcome(status: str, mechanism_: str, **extra: object) -> ControlOutcome:
        return ControlOutcome.model_validate({
            "omission": omission, "leg": plan.name, "method": plan.method, "status": status,
            "mechanism": mechanism_, "max_param_diff": _param_drift(v), **extra,
        })

    if v.result == Result.FAIL and v.first_divergence is not None:
        return outcome("detected", mechanism(v), first_divergence=v.first_divergence)
    if v.result != Result.PASS:
        return outcome("invalid", v.reason)
    evidence = not_applicable_evidence(location, plan, omission)
    if evidence is not None:
        return outcome("not_applicable", "no boundary differed", evidence=evidence)
    return outcome("blind", _blind(omission, plan.spec))


def _blind(omission: str, spec: QualificationSpec) -> str:
    """The mechanism of a control no compared boundary caught; it names the boundary where
    the omission shows first when the spec leaves that boundary out."""
    words = f"no compared boundary differed: the comparator is blind to {omission}"
    shows = control(omission).shows_at
    if shows not in spec.comparison.boundaries:
        words += (f" ({_NAMES[shows]}, where leaving it out shows first, is not among "
                  "comparison.boundaries)")
    return words


def _param_drift(v: Verdict) -> float | None:
    return next((d.max_abs_diff for d in v.drift if d.group == "model"), None)


def _first_steps(rows: list[BoundaryRow]) -> dict[str, int]:
    first: dict[str, int] = {}
    for row in rows:
        for boundary, status in row.status.items():
            if status == "differs":
                first.setdefault(boundary, row.step)
    return first


def mechanism(v: Verdict) -> str:
    """E.g. "learning rate differed from step 6 (rank 0); parameters from step 6", or for a
    resize the parts that failed: "data ledger: step 5: ...; drift: step 5 ..."."""
    d = v.first_divergence
    assert d is not None
    if v.resize is not None:
        failed = [p for p in v.resize.parts if not p.ok]
        if failed:
            words = [f"{p.words()}: {p.detail}" for p in failed]
            drift = _param_drift(v)
            if drift is not None:
                words.append(f"final max parameter difference {drift:.3g}")
            return "; ".join(words)
    name = _NAMES.get(d.boundary, d.boundary)
    words = [f"restored {name} differed from the saved after step {d.step} (rank {d.rank})"
             if d.at_restore else f"{name} differed from step {d.step} (rank {d.rank})"]
    first = _first_steps(v.boundary_table)
    for boundary in ("loss", "params"):
        if boundary != d.boundary and boundary in first:
            words.append(f"{_NAMES[boundary]} from step {first[boundary]}")
    drift = _param_drift(v)
    if drift is not None:
        words.append(f"final max parameter difference {drift:.3g}")
    return "; ".join(words)


def not_applicable_evidence(location: RunLocation, plan: LegPlan, omission: str) -> str | None:
    """What in the reference leg's trace shows the omitted state never mattered, if anything
    (the control's descriptor says what would)."""
    evidence = control(omission).evidence
    if evidence is None:
        return None
    world = plan.spec.world.world_size
    reference = LegTrace.read(location, REFERENCE_LEG, world)
    leg = LegTrace.read(location, plan.name, world)
    restores = [r for r in leg.of(RestoreRecord) if r.attempt >= 1]
    return evidence(reference.effective, restores, plan.spec)
