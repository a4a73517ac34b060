"""Hand-built Reports for the report and metrics tests: one per verdict."""

from __future__ import annotations

import math

from resumequal.spec import BOUNDARIES
from resumequal.verdict import (
    BoundaryRow,
    Cut,
    Divergence,
    DriftSummary,
    LegSummary,
    PhaseEvent,
    Report,
    Result,
    StepDelta,
    TensorDrift,
    ValidityCheck,
    Verdict,
)

STEPS = 12
KILL_STEP = 7
RESUME_STEP = 6
T0 = 1_767_000_000.0
PHASES = (
    ("Pending", 0.0),
    ("Validating", 0.4),
    ("Launching", 1.5),
    ("Arming", 4.0),
    ("Killing", 19.0),
    ("Resuming", 19.5),
    ("Comparing", 31.0),
    ("Succeeded", 33.0),
)
CHECK_NAMES = (
    "kill_delivered",
    "restarted",
    "restored_expected_checkpoint",
    "inventories_equal",
)


def _losses() -> list[float]:
    return [2.5 * math.exp(-0.15 * i) + 0.05 * math.sin(i) for i in range(STEPS)]


def _drift(scale: float) -> list[DriftSummary]:
    worst = [
        TensorDrift(
            name=f"blocks.{i}.attn.weight",
            numel=4096,
            max_abs_diff=scale / (i + 1),
            rel_l2=scale / (10 * (i + 1)),
            mismatch_fraction=min(1.0, scale * 1e3 / (i + 1)),
        )
        for i in range(3)
    ]
    return [
        DriftSummary(
            group=group,
            tensors=24,
            numel=120_000,
            max_abs_diff=scale * factor,
            rel_l2=scale * factor / 10,
            mismatch_fraction=min(1.0, scale * 1e3),
            worst=worst if scale else [],
        )
        for group, factor in (("model", 1.0), ("optimizer", 3.0))
    ]


def make_report(result: Result, *, zero_deltas: bool = False) -> Report:
    """A plausible Report with the given verdict; FAIL and NONDETERMINISTIC diverge."""
    control = _losses()
    preempted = list(control)
    first: Divergence | None = None
    diverge_from = STEPS + 1
    checks = [ValidityCheck(name=n, ok=True, detail="as expected") for n in CHECK_NAMES]
    drift = _drift(0.0)
    resumed_from: str | None = f"step-{RESUME_STEP:08d}"
    inventory_differences: dict[str, object] = {}
    reason = "The resumed leg matched the control leg exactly at every boundary."

    if result is Result.FAIL:
        diverge_from = KILL_STEP
        first = Divergence(
            step=KILL_STEP,
            boundary="rng",
            rank=1,
            control={"torch_cpu": "9f1c22"},
            preempted={"torch_cpu": "03ab7e"},
            before_cut=False,
        )
        drift = _drift(2.5e-4)
        reason = "The RNG state differs at the first resumed step: the checkpoint omits it."
    elif result is Result.NONDETERMINISTIC:
        diverge_from = 2
        first = Divergence(
            step=2, boundary="loss", rank=0, control=1.25, preempted=1.2500001, before_cut=True
        )
        drift = _drift(1e-6)
        reason = "The legs differ at step 2, before the kill: the stack is not reproducible."
    elif result is Result.INVALID:
        checks[1] = ValidityCheck(
            name="restarted", ok=False, detail="the preempted leg ran a single attempt"
        )
        checks[3] = ValidityCheck(
            name="inventories_equal", ok=False, detail="torch.__version__ differs"
        )
        resumed_from = None
        drift = []
        inventory_differences = {"torch.__version__": {"control": "2.4.0", "preempted": "2.5.0"}}
        reason = "No restart happened, so nothing about resumption was tested."

    for i in range(diverge_from - 1, STEPS):
        preempted[i] = control[i] + 1e-7 * 3 ** (i - diverge_from + 1)
    if zero_deltas:
        preempted = list(control)

    boundary_table = []
    for step in range(1, STEPS + 1):
        status: dict[str, str] = {}
        for j, b in enumerate(BOUNDARIES):
            if step < diverge_from:
                status[b] = "equal"
            elif step == diverge_from:
                bound = BOUNDARIES.index(first.boundary) if first else len(BOUNDARIES)
                status[b] = "equal" if j < bound else "differs"
            else:
                status[b] = "equal" if b == "inputs" else "differs"
        if step == 3:
            status["bucket_layout"] = "within_tolerance" if step < diverge_from else "differs"
        attempt = 0 if step <= RESUME_STEP or result is Result.INVALID else 1
        row = BoundaryRow.model_validate({"step": step, "attempt": attempt, "status": status})
        boundary_table.append(row)
    if result is Result.INVALID:
        boundary_table = []

    deltas = [
        StepDelta(step=i + 1, control_loss=c, preempted_loss=p, abs_diff=abs(c - p))
        for i, (c, p) in enumerate(zip(control, preempted, strict=True))
    ]
    verdict = Verdict(
        result=result,
        reason=reason,
        cut=Cut(step=KILL_STEP, microstep=1, rank=1, mode="hard"),
        resumed_from=resumed_from,
        first_divergence=first,
        exact_through_step=(diverge_from - 1) if first else STEPS,
        checks=checks,
        drift=drift,
        loss_deltas=deltas,
        boundary_table=boundary_table,
        steps_compared=STEPS,
        ranks_compared=2,
    )
    return Report(
        run="nightly-<2026-05-09>",
        pin="registry.local/train:torch2.4 & cuda12.4",
        verdict=verdict,
        spec={"workload": {"name": "tiny-gpt"}, "training": {"steps": STEPS}},
        phases=[PhaseEvent(phase=p, at=T0 + dt) for p, dt in PHASES],
        legs=[
            LegSummary(
                name="control",
                attempts=1,
                exit_code=0,
                started_at=T0 + 1.5,
                finished_at=T0 + 29.0,
                losses=control,
            ),
            LegSummary(
                name="preempted",
                attempts=1 if result is Result.INVALID else 2,
                exit_code=0,
                started_at=T0 + 1.5,
                finished_at=T0 + 30.5,
                losses=preempted,
            ),
        ],
        kill_at=T0 + 19.0,
        restart_seconds=None if result is Result.INVALID else 8.25,
        inventory={
            "torch.__version__": "2.4.0",
            "cuda": None,
            "env": {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"},
            "deterministic_algorithms": True,
        },
        inventory_differences=inventory_differences,
    )
