"""Hand-built Reports for the report and metrics tests: one per verdict, plus negative
controls and a seed matrix."""

from __future__ import annotations

import math

from resumequal.results.verdict import (
    BoundaryRow,
    Bucket,
    ControlOutcome,
    Cut,
    Divergence,
    DriftSummary,
    LegSummary,
    Matrix,
    MatrixCell,
    MatrixRow,
    PhaseEvent,
    Report,
    ResizeHandoff,
    ResizeOutcome,
    ResizePart,
    ResizeStepRow,
    Result,
    StepDelta,
    TensorDifference,
    TensorDrift,
    ValidityCheck,
    Verdict,
    Zoom,
    ZoomModule,
    ZoomReplay,
    ZoomStage,
    ZoomTensor,
)
from resumequal.spec import SCENARIOS
from resumequal.spec.boundaries import BOUNDARIES

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


# -- negative controls -------------------------------------------------------------------

CONTROL_METHOD = "a real preempted-and-restarted leg resuming without the omitted state"
# The blind control of make_controls(blind=True); its name is markup-like on purpose.
BLIND_OMISSION = "data_cursor"


def make_controls(*, blind: bool) -> list[ControlOutcome]:
    """rng, scheduler and model_optimizer_only detected; data_cursor detected or blind;
    pending_grads not applicable (the cut is not mid-accumulation in this sample)."""
    detected = [
        ControlOutcome(
            omission=omission,
            leg=f"control-{omission.replace('_', '-')}",
            method=CONTROL_METHOD,
            status="detected",
            first_divergence=Divergence(
                step=RESUME_STEP + 1,
                boundary=boundary,
                rank=rank,
                control="a1",
                preempted="b2",
                before_cut=False,
            ),
            max_param_diff=diff,
            mechanism=f"{boundary} differs at the first resumed step; loss and params follow",
        )
        for omission, boundary, rank, diff in (
            ("rng", "rng", 0, 3.1e-3),
            ("scheduler", "lr", 0, 7.5e-4),
            ("model_optimizer_only", "inputs", 1, 2.0e-2),
        )
    ]
    cursor = ControlOutcome(
        omission=BLIND_OMISSION,
        leg="control-data-cursor",
        method=CONTROL_METHOD,
        status="detected",
        first_divergence=Divergence(
            step=RESUME_STEP + 1,
            boundary="inputs",
            rank=0,
            control=[8, 9],
            preempted=[0, 1],
            before_cut=False,
        ),
        max_param_diff=1.2e-2,
        mechanism="the resumed leg replays samples 0.. instead of continuing at sample 8",
    )
    if blind:
        cursor = cursor.model_copy(
            update={
                "status": "blind",
                "first_divergence": None,
                "max_param_diff": 0.0,
                "mechanism": "every compared boundary equal: <inputs> were not compared",
            }
        )
    pending = ControlOutcome(
        omission="pending_grads",
        leg=None,
        method="not run: the cut is at an accumulation boundary",
        status="not_applicable",
        mechanism="no gradients are pending at an accumulation boundary",
        evidence="cut microstep 0: the window's first backward had not run",
    )
    return [*detected, cursor, pending]


def make_controls_report(*, blind: bool = True) -> Report:
    """A report whose verdict carries controls; a blind one makes the verdict INVALID."""
    if not blind:
        report = make_report(Result.PASS)
        report.verdict.controls = make_controls(blind=False)
        return report
    report = make_report(Result.PASS)
    report.verdict.result = Result.INVALID
    report.verdict.reason = (
        f"The comparator is blind to {BLIND_OMISSION}: a resume without it looked exact."
    )
    report.verdict.controls = make_controls(blind=True)
    # Blind because the spec's comparison.boundaries leaves "inputs" out.
    for row in report.verdict.boundary_table:
        row.status["inputs"] = "not_compared"
    return report


# -- seed matrix -------------------------------------------------------------------------

MATRIX_SEEDS = (0, 1, 2, 3, 4)
FAILING_CELL = ("mid-graceful", 3)
FAILING_STEP = 9
FAILING_BOUNDARY = "reduced_grads"


def make_matrix() -> Matrix:
    """The four positive scenarios x five seeds; one cell (mid-graceful, seed 3) fails."""
    cells: list[MatrixCell] = []
    for scenario in SCENARIOS:
        for seed in MATRIX_SEEDS:
            if (scenario, seed) == FAILING_CELL:
                cells.append(
                    MatrixCell(
                        scenario=scenario,
                        seed=seed,
                        result=Result.FAIL,
                        first_divergent_step=FAILING_STEP,
                        first_divergent_boundary=FAILING_BOUNDARY,
                        reason="reduced gradients differ: bucket layout <rebuilt> after resume",
                    )
                )
            else:
                cells.append(
                    MatrixCell(scenario=scenario, seed=seed, result=Result.PASS, reason="exact")
                )
    summary = [
        MatrixRow(
            scenario=scenario,
            exact=sum(
                c.result is Result.PASS and c.first_divergent_step is None
                for c in cells
                if c.scenario == scenario
            ),
            total=len(MATRIX_SEEDS),
        )
        for scenario in SCENARIOS
    ]
    return Matrix(seeds=list(MATRIX_SEEDS), scenarios=list(SCENARIOS), cells=cells, summary=summary)


def make_matrix_report() -> Report:
    """A FAIL report (the main comparison exact, one matrix cell not) with the matrix."""
    report = make_report(Result.PASS)
    report.verdict.result = Result.FAIL
    scenario, seed = FAILING_CELL
    report.verdict.reason = (
        f"Scenario {scenario} with seed {seed} diverged at step {FAILING_STEP} "
        f"({FAILING_BOUNDARY})."
    )
    report.verdict.controls = make_controls(blind=False)
    report.matrix = make_matrix()
    return report


# -- resize --------------------------------------------------------------------------------

RESIZED_FROM, GROWN_FROM = 4, 8


def make_resize_report(*, ledger_step: int | None = None, steps: int = STEPS) -> Report:
    """A 2 → 1 → 2 resize with KILL_STEP's cut; a wrong ledger at ``ledger_step`` FAILs."""
    base = make_report(Result.PASS)
    worlds = [2 if s <= RESIZED_FROM or s > GROWN_FROM else 1 for s in range(1, steps + 1)]
    rows = [ResizeStepRow(step=s, world_size=w, attempt=0 if s <= RESIZED_FROM
                          else 1 if s <= GROWN_FROM else 2,
                          ledger_ok=s != ledger_step,
                          loss_max_abs_diff=0.0 if s <= RESIZED_FROM else 3e-7,
                          grad_norm_abs_diff=0.0 if s <= RESIZED_FROM else 1e-6,
                          within_tolerance=True)
            for s, w in zip(range(1, steps + 1), worlds, strict=True)]
    ledger = ("every step ran global microbatches 0..7 once each" if ledger_step is None
              else f"step {ledger_step}: 4 sample ids missing (e.g. 601, 602, 603 …)")
    outcome = ResizeOutcome(
        world_sizes=[2, 1, 2], resize_step=RESIZED_FROM, grow_step=GROWN_FROM,
        parts=[
            ResizePart(name="before_resize", ok=True, detail="attempt 0's 6 steps equal"),
            ResizePart(name="handoff", ok=True, detail="2 restores took over the state saved"),
            ResizePart(name="data_ledger", ok=ledger_step is None, detail=ledger),
            ResizePart(name="drift", ok=True, detail="loss ≤ 3e-07 (tolerance 1e-05)"),
        ],
        handoffs=[
            ResizeHandoff(attempt=1, checkpoint=f"step-{RESIZED_FROM:08d}", step=RESIZED_FROM,
                          saved_world_size=2, world_size=1, handoff="xxh3_128:ab",
                          equal_to_saved=True, equal_to_control=True),
            ResizeHandoff(attempt=2, checkpoint=f"step-{GROWN_FROM:08d}", step=GROWN_FROM,
                          saved_world_size=1, world_size=2, handoff="xxh3_128:cd",
                          equal_to_saved=True),
        ],
        steps=rows)
    result = Result.PASS if ledger_step is None else Result.FAIL
    verdict = base.verdict.model_copy(update={
        "result": result, "resize": outcome, "resumed_from": f"step-{RESIZED_FROM:08d}",
        "reason": "resize: 2→1→2 ranks; exact through step 4 before the resize; ..."})
    return base.model_copy(update={"verdict": verdict})


# -- forensics -----------------------------------------------------------------------------


def make_zoom(step: int = KILL_STEP) -> Zoom:
    """A zoom whose origin is one module; the others propagate or enclose it."""

    def module(path: str, kind: str, *, inputs: bool, phase: str = "forward") -> ZoomModule:
        return ZoomModule.model_validate({
            "module": path, "kind": kind, "phase": phase, "first_call": 3, "ranks": [0, 1],
            "inputs_differ": inputs, "outputs_differ": phase == "forward",
            "grads_in_differ": phase == "backward", "grads_out_differ": True,
            "params_differ": False, "max_abs_diff": 5.96e-08,
            "tensors": [ZoomTensor(name="output[0]", rank=0, numel=512, differ=37,
                                   max_abs_diff=5.96e-08)]})

    return Zoom(
        step=step, boundary="local_grads",
        replays=[ZoomReplay(leg="control", attempt=0, start=None, world_size=2,
                            reproduced=True, detail="equal at every boundary"),
                 ZoomReplay(leg="preempted", attempt=1, start=f"step-{RESUME_STEP:08d}",
                            world_size=2, reproduced=True, detail="equal at every boundary")],
        origin_kind="module", origins=["blocks.1.<mix>"],
        summary="step 7 first differs in 1 module (blocks.1.<mix>)", modules_total=9,
        modules=[module("blocks.1.<mix>", "origin", inputs=False),
                 module("blocks.1.act", "propagation", inputs=True),
                 module("(model)", "encloses_origin", inputs=False),
                 module("blocks.0", "propagation", inputs=False, phase="backward")],
        stages=[ZoomStage(name="local_grads", total=12, differ=11, max_abs_diff=1e-9,
                          tensors=[ZoomTensor(name="blocks.0.weight", rank=1, numel=64,
                                              differ=3, max_abs_diff=1e-9)])],
        buckets={"control": [Bucket(index=0, params=["a", "b"], numel=10)],
                 "preempted": [Bucket(index=0, params=["a"], numel=5),
                               Bucket(index=1, params=["b"], numel=5)]},
        inventory_differences={"num_threads": {"control": 1, "preempted": 2}},
    )


def with_forensics(report: Report) -> Report:
    """``report`` (a FAIL) with per-tensor counts at its first divergence and a zoom."""
    first = report.verdict.first_divergence
    assert first is not None
    tensors = TensorDifference(total=12, differ=11, order="backward", first="blocks.1.w",
                               differing=["blocks.1.w"], modules=[])
    verdict = report.verdict.model_copy(update={
        "first_divergence": first.model_copy(update={"tensors": tensors})})
    return report.model_copy(update={"verdict": verdict, "zoom": make_zoom(first.step)})
