"""The verdict and report schema (versioned): what a qualification concluded and why.

Written by the comparator and the qualification runner, read by the reports, the metrics,
the operator (into a QualificationRun's status) and by people. Pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from resumequal.built import BuiltOptimizer
from resumequal.spec.boundaries import Boundary

SCHEMA_VERSION = "resumequal.dev/report/v1"


class Result(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    NONDETERMINISTIC = "NONDETERMINISTIC"
    INVALID = "INVALID"


class _Model(BaseModel):
    # Drift of a NaN or an all-zero reference is NaN or infinite; "strings" keeps the JSON
    # strict ("NaN", "Infinity") and validates back to the same float.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class ModuleDifference(_Model):
    """How many of one module's tensors differ at a boundary."""

    module: str = Field(description="module path (the tensor name without its last part)")
    differ: int
    total: int


class TensorDifference(_Model):
    """Which tensors of a per-tensor boundary differ at the first divergence."""

    total: int = Field(description="tensors at this boundary")
    differ: int = Field(description="tensors whose digests differ between the legs")
    order: Literal["backward", "parameter"] = Field(
        description="the order of `differing`: backward (gradients, the order they become "
        "ready: the model's parameter order reversed) or the model's parameter order")
    first: str | None = Field(description="the first differing tensor in that order")
    differing: list[str] = Field(description="the differing tensors in that order (at most "
                                 "the first 1000)")
    modules: list[ModuleDifference] = Field(
        description="per module, in the same order: differing and total tensors")


class Bucket(_Model):
    """One DDP gradient bucket: its index, its parameters in order, its elements."""

    index: int
    params: list[str]
    numel: int


RestoreCause = Literal["per_rank", "not_saved", "not_as_saved"]


class RestoredTensor(_Model):
    """A tensor a resumed rank did not get back as it saved it, and why."""

    name: str
    kind: Literal["parameter", "buffer", "optimizer_state"]
    ranks: list[int] = Field(description="ranks that restored something else than they saved")
    cause: RestoreCause = Field(
        description="per_rank: it differed between the ranks when saved, and the "
        "checkpoint keeps one copy for all; not_saved: the checkpoint does not hold it "
        "(a non-persistent buffer); not_as_saved: restored unlike any rank's saved value")
    kept_rank: int | None = Field(
        default=None, description="per_rank: the rank whose copy every rank got back")


class Divergence(_Model):
    """Where two legs first differ, in execution order of boundaries."""

    step: int
    boundary: Boundary
    rank: int
    control: Any = Field(description="the control leg's value at this boundary (summarised)")
    preempted: Any
    before_cut: bool = Field(description="true when the step ran before the kill in both "
                             "legs; false when the resumed attempt ran it")
    # None for boundaries without per-tensor digests, and for traces written before them.
    tensors: TensorDifference | None = None
    step_tensors: dict[str, TensorDifference] = Field(
        default_factory=dict, description="every per-tensor boundary of this step and rank, "
        "equal or not: where the difference starts and how far it spreads")
    buckets: dict[str, list[Bucket]] | None = Field(
        default=None, description="DDP's bucket layout of each leg at this step and rank "
        "(control, preempted), when the layouts differ")
    # A resume can go wrong before any step runs: the right checkpoint, restored, does not
    # give a rank back the state it saved (control: saved, preempted: restored).
    at_restore: bool = Field(
        default=False, description="true when the difference is in the state the resumed "
        "attempt restored (step: the checkpoint's), against what the same rank saved then")
    restored: list[RestoredTensor] = Field(
        default_factory=list, description="at_restore: each tensor not restored as saved")
    cause: str | None = Field(default=None, description="why, where the traces show it")
    fix: str | None = Field(default=None, description="what makes the resume exact")

    def when_words(self) -> str:
        """'before the cut', or 'after the resume' for a step the resumed attempt ran (which
        may come before the cut's step: the resume restores the checkpoint before it)."""
        if self.at_restore:
            return "at the restore"
        return "before the cut" if self.before_cut else "after the resume"

    def tensor_words(self) -> str:
        """'261 of 320 tensors differ (first in backward order: a.b.weight)', or ''."""
        return "" if self.tensors is None else _tensor_words(self.tensors)

    def spread_words(self) -> str:
        """For a boundary without per-tensor digests, the step's first per-tensor boundary
        that differs: 'reduced_grads: 5 of 6 tensors differ (...)', or ''."""
        if self.tensors is not None:
            return ""
        later = [(b, d) for b, d in self.step_tensors.items() if d.differ]
        return f"{later[0][0]}: {_tensor_words(later[0][1])}" if later else ""


def _tensor_words(t: TensorDifference) -> str:
    first = f" (first in {t.order} order: {t.first})" if t.first is not None else ""
    return f"{t.differ} of {t.total} tensors differ{first}"


class ValidityCheck(_Model):
    """One precondition for the comparison to mean anything."""

    name: str
    ok: bool
    detail: str


class TensorDrift(_Model):
    name: str
    numel: int
    max_abs_diff: float
    rel_l2: float = Field(description="||a-b||_2 / ||a||_2 (0 when both are zero)")
    mismatch_fraction: float = Field(description="fraction of elements that differ in bits")


class DriftSummary(_Model):
    """Drift of one group of tensors (model or optimizer) between the final checkpoints."""

    group: Literal["model", "optimizer"]
    tensors: int
    numel: int
    max_abs_diff: float
    rel_l2: float
    mismatch_fraction: float
    worst: list[TensorDrift] = Field(description="the tensors with the largest drift")
    values: int = Field(
        default=0, description="non-tensor items compared (e.g. optimizer hyperparameters)"
    )
    values_differ: list[str] = Field(
        default_factory=list, description="non-tensor items that are not equal"
    )
    unmatched: list[str] = Field(
        default_factory=list,
        description="keys held by only one checkpoint, or with another shape or dtype",
    )


class StepDelta(_Model):
    """Per-step loss of both legs (mean over ranks and microbatches) and their difference."""

    step: int
    control_loss: float
    preempted_loss: float
    abs_diff: float


class BoundaryRow(_Model):
    """One step of the boundary table: which boundaries were equal on every rank."""

    step: int
    attempt: int = Field(description="attempt of the preempted leg that finally ran the step")
    status: dict[str, Literal["equal", "within_tolerance", "differs", "missing", "not_compared"]]


ResizePartName = Literal["before_resize", "handoff", "data_ledger", "drift"]
# Each part as the verdicts and reports name it, and the bar it must clear.
_RESIZE_PART_WORDS: dict[ResizePartName, tuple[str, str]] = {
    "before_resize": ("before the resize", "bitwise exact"),
    "handoff": ("handoff", "exact"),
    "data_ledger": ("data ledger", "exact"),
    "drift": ("drift", "within tolerance"),
}


class ResizePart(_Model):
    """One of the four things a resize verdict proves, and whether it held."""

    name: ResizePartName
    ok: bool
    detail: str

    def words(self) -> str:
        """The part as a reason names it, e.g. "data ledger"."""
        return _RESIZE_PART_WORDS[self.name][0]

    def label(self) -> str:
        """The part and the bar it must clear, e.g. "data ledger (exact)"."""
        words, bar = _RESIZE_PART_WORDS[self.name]
        return f"{words} ({bar})"


class ResizeHandoff(_Model):
    """One resumed attempt's restore: its handoff digest against the saved and control's."""

    attempt: int
    checkpoint: str
    step: int = Field(description="the checkpoint's step")
    saved_world_size: int | None
    world_size: int | None
    handoff: str | None = Field(description="the digest every rank of the attempt restored")
    equal_to_saved: bool = Field(description="equal to the handoff the saving attempt recorded")
    equal_to_control: bool | None = Field(
        default=None, description="equal to the control's at that step (the resize's restore)")


class ResizeStepRow(_Model):
    """One step of a resize run: where it ran, its data ledger and its drift."""

    step: int
    world_size: int
    attempt: int = Field(description="attempt whose records of the step are authoritative")
    ledger_ok: bool
    loss_max_abs_diff: float | None = Field(
        description="over the step's microbatches, matched by global index")
    grad_norm_abs_diff: float | None
    within_tolerance: bool


class ResizeOutcome(_Model):
    """What the resize verdict checked: four parts, the handoffs and every step."""

    world_sizes: list[int] = Field(description="ranks of the leg in order, e.g. [2, 1, 2]")
    resize_step: int = Field(description="the checkpoint step the smaller world resumed from")
    grow_step: int | None = Field(description="the checkpoint step the grown world resumed "
                                              "from (None: no grow)")
    parts: list[ResizePart]
    handoffs: list[ResizeHandoff] = Field(default_factory=list)
    steps: list[ResizeStepRow] = Field(default_factory=list)

    def part(self, name: ResizePartName) -> ResizePart | None:
        return next((p for p in self.parts if p.name == name), None)


class Cut(_Model):
    step: int
    microstep: int
    rank: int
    mode: Literal["hard", "graceful"]
    at: Literal["microbatch", "checkpoint_commit"] = "microbatch"


class Verdict(_Model):
    """The conclusion of one comparison of a control and a preempted leg."""

    schema_version: str = SCHEMA_VERSION
    result: Result
    reason: str = Field(description="one sentence a person can act on")
    cut: Cut
    resumed_from: str | None = Field(description="checkpoint the resumed attempt restored")
    first_divergence: Divergence | None
    exact_through_step: int = Field(
        description="last step up to which every boundary on every rank was equal (0: none)"
    )
    checks: list[ValidityCheck]
    drift: list[DriftSummary] = Field(default_factory=list)
    loss_deltas: list[StepDelta] = Field(default_factory=list)
    boundary_table: list[BoundaryRow] = Field(default_factory=list)
    steps_compared: int = 0
    ranks_compared: int = 0
    controls: list[ControlOutcome] = Field(default_factory=list)
    # Only for preemption.resize; None in reports written before resizes existed.
    resize: ResizeOutcome | None = None

    @property
    def control_counts(self) -> ControlCounts:
        """The controls counted once, for every place that shows or exports them."""
        return ControlCounts.of(self.controls)

    @property
    def controls_detected(self) -> int:
        return self.control_counts.detected

    @property
    def controls_total(self) -> int:
        """Controls that had to be detected (not applicable and not judged ones excluded)."""
        return self.control_counts.applicable

    @property
    def controls_not_judged(self) -> int:
        """Controls left unjudged: the legs differed before the kill (NONDETERMINISTIC)."""
        return self.control_counts.not_judged


# Control outcomes that are not owed a detection: the state could not matter, or nothing
# could be judged (the main pair is not run-to-run deterministic).
UNCOUNTED = frozenset({"not_applicable", "not_judged"})


class ControlCounts(_Model):
    """How many negative controls were detected, owed a detection, not applicable and not
    judged: the one count the terminal, the HTML and the metrics show."""

    detected: int
    applicable: int = Field(description="owed a detection: every status but not_applicable "
                            "and not_judged")
    not_applicable: int
    not_judged: int

    @classmethod
    def of(cls, controls: Sequence[ControlOutcome]) -> ControlCounts:
        def n(status: str) -> int:
            return sum(c.status == status for c in controls)

        return cls(detected=n("detected"),
                   applicable=sum(c.status not in UNCOUNTED for c in controls),
                   not_applicable=n("not_applicable"), not_judged=n("not_judged"))

    @property
    def all_detected(self) -> bool:
        return self.detected == self.applicable

    def words(self) -> str:
        """'6 of 7 applicable controls detected (3 not applicable)'."""
        text = f"{self.detected} of {self.applicable} applicable controls detected"
        if self.not_applicable:
            text += f" ({self.not_applicable} not applicable)"
        if self.not_judged:
            text += f" ({self.not_judged} not judged: the legs differ before the kill)"
        return text


class ControlOutcome(_Model):
    """One negative control: a deliberately broken resume the comparator must catch."""

    omission: str
    leg: str | None = Field(description="the leg that ran it (None when not run)")
    method: str = Field(description="how it ran, e.g. a real preempted-and-restarted leg")
    expected: Literal["diverge"] = "diverge"
    status: Literal["detected", "blind", "not_applicable", "invalid", "not_judged"]
    first_divergence: Divergence | None = None
    max_param_diff: float | None = Field(
        default=None, description="max abs parameter difference at the end (model drift)"
    )
    mechanism: str = Field(description="what diverged first and what followed, in words")
    evidence: str | None = Field(
        default=None, description="for not_applicable: what shows the state was never used"
    )


class MatrixCell(_Model):
    scenario: str
    seed: int
    result: Result
    first_divergent_step: int | None = None
    first_divergent_boundary: str | None = None
    reason: str


class MatrixRow(_Model):
    scenario: str
    exact: int
    total: int


class Matrix(_Model):
    """Positive scenarios repeated across seeds: scenario x seed -> exact or where not."""

    seeds: list[int]
    scenarios: list[str]
    cells: list[MatrixCell]
    summary: list[MatrixRow]


class PhaseEvent(_Model):
    phase: str
    at: float
    reason: str | None = None
    message: str | None = None


class AttemptCompile(_Model):
    """What torch.compile cost one attempt of a leg (compile.enabled)."""

    attempt: int
    seconds: float = Field(description="compile seconds of the slowest rank")
    fx_cache_hits: int = Field(description="inductor FX graph cache hits, all ranks")
    fx_cache_misses: int
    autotuned: int = Field(description="kernels chosen by benchmarking, all ranks")


class LegSummary(_Model):
    name: Literal["control", "preempted"]
    attempts: int
    exit_code: int | None
    started_at: float | None
    finished_at: float | None
    losses: list[float] = Field(description="per-step loss, mean over ranks and microbatches")
    compiled: list[AttemptCompile] = Field(default_factory=list,
                                           description="per attempt, where the model compiled")


ZoomKind = Literal["origin", "propagation", "encloses_origin", "state"]
ZoomOriginKind = Literal["input", "loss_fn", "module", "reduction", "clipping", "optimizer",
                         "state", "none"]


class ZoomTensor(_Model):
    """One captured tensor that differs between the two replays."""

    name: str = Field(description="module input/output position, gradient or state name")
    rank: int
    numel: int
    differ: int = Field(description="elements whose bits differ")
    max_abs_diff: float | None = Field(description="None when shapes or dtypes differ")


class ZoomModule(_Model):
    """A module whose captured tensors differ, and why (``zoom.json``)."""

    module: str = Field(description="module path; (model) is the whole model")
    kind: ZoomKind = Field(description="origin: its inputs and parameters equal, its outputs "
                           "not; propagation: its inputs already differed; encloses_origin: "
                           "a module inside it is the origin; state: its own parameters or "
                           "buffers differed before the step")
    phase: Literal["forward", "backward"] = Field(
        description="where it first differs: its forward outputs, or (forward equal) the "
                    "gradients it passes back")
    first_call: int = Field(description="position of its first differing call in the step")
    ranks: list[int] = Field(description="ranks where it differs")
    inputs_differ: bool
    outputs_differ: bool
    grads_in_differ: bool = Field(description="gradients reaching its outputs differ")
    grads_out_differ: bool = Field(description="gradients it sends to its inputs differ")
    params_differ: bool = Field(description="its own parameters/buffers before the step")
    max_abs_diff: float | None = Field(description="largest difference of its outputs (or, "
                                       "backward, of the gradients it sends)")
    tensors: list[ZoomTensor] = Field(default_factory=list,
                                      description="its first differing tensors (at most 8)")


class ZoomStage(_Model):
    """One stage of the step around the modules: gradients before and after the reduction
    and clipping, parameters and optimizer state before and after the update."""

    name: str
    total: int = Field(description="tensors captured, over ranks")
    differ: int
    max_abs_diff: float | None
    tensors: list[ZoomTensor] = Field(default_factory=list,
                                      description="differing tensors (at most 32)")


class ZoomReplay(_Model):
    """How one leg was replayed, and whether the replay reproduced what the leg recorded."""

    leg: str
    attempt: int = Field(description="the leg's attempt whose run of the step was replayed")
    start: str | None = Field(description="the checkpoint that attempt restored (None: it "
                              "started from the beginning)")
    world_size: int
    reproduced: bool = Field(description="the replay's digests of the step equal the leg's")
    detail: str


class Zoom(_Model):
    """``zoom.json``: a divergent step replayed in both legs with every tensor captured."""

    schema_version: str = SCHEMA_VERSION
    step: int
    boundary: str | None = Field(description="the verdict's first differing boundary, if any")
    replays: list[ZoomReplay]
    origin_kind: ZoomOriginKind = Field(
        description="where the difference starts: before the model (input: it is called "
                    "with different inputs, from the data path or loss_fn), in loss_fn "
                    "(equal outputs, different gradients back), in a module, in the gradient "
                    "reduction, in clipping/unscaling, in the optimizer update, in the state "
                    "the step began with, or nowhere the replays show")
    origins: list[str] = Field(description="origin modules (or the stage; inputs, loss_fn), "
                               "in execution order")
    summary: str = Field(description="one sentence a person can act on")
    modules_total: int
    modules: list[ZoomModule] = Field(description="every module that differs, in execution "
                                      "order")
    stages: list[ZoomStage]
    buckets: dict[str, list[Bucket]] | None = Field(
        default=None, description="the replays' DDP bucket layouts by leg, when they differ")
    inventory_differences: dict[str, Any] = Field(
        default_factory=dict, description="runtime inventory items that differ between the "
        "attempts that ran the step: name -> {control, preempted}")


class Report(_Model):
    """Everything ``report.json`` holds: the verdict plus what it is about."""

    schema_version: str = SCHEMA_VERSION
    run: str
    pin: str
    verdict: Verdict
    spec: dict[str, Any]
    phases: list[PhaseEvent] = Field(default_factory=list)
    legs: list[LegSummary] = Field(default_factory=list)
    kill_at: float | None = None
    restart_seconds: float | None = Field(
        default=None, description="kill -> first resumed step finished"
    )
    inventory: dict[str, Any] = Field(default_factory=dict)
    inventory_differences: dict[str, Any] = Field(default_factory=dict)
    # None in reports of traces written before workers recorded it.
    built: BuiltOptimizer | None = Field(
        default=None, description="the optimizer and scheduler the workload built (the "
        "control leg's rank 0); the spec's training.optimizer and training.schedule are left "
        "out of `spec` where they are not what it built")
    launcher: str = Field(default="torchrun", description="what started the legs' workers "
                          "(world.launcher): torchrun (fresh interpreters) or forked")
    caveats: list[str] = Field(default_factory=list,
                               description="what this verdict cannot see, and why")
    incomplete: str | None = Field(
        default=None, description="why the report lacks what it reads from the run "
        "location (the legs' summaries, their runtime inventory, what was built, a zoom): "
        "the store failed past timeouts.backendErrorSeconds while it was made. The verdict "
        "stands: it was reached before")
    matrix: Matrix | None = None
    zoom: Zoom | None = Field(default=None, description="resumequal zoom's replay of the "
                              "first divergent step, once it has run")
