"""The negative controls: one descriptor per deliberately broken resume.

A negative control is a preempted-and-restarted leg whose resume leaves one part of the
training state out (or, for a resize, plants one rank-keyed bug). Its descriptor says what
it leaves out of a restore (:mod:`resumequal.train.state`), what it plants in a resized world's
data (:mod:`resumequal.train.globaldata`), when it cannot apply to a spec and why
(:mod:`resumequal.qualify.plan`: no leg runs), which kill it needs, where leaving it out first
shows, and what in the reference leg's trace shows that the state never mattered
(:mod:`resumequal.compare.controls`: not applicable rather than blind).

Adding a control is one entry in :data:`CONTROLS` (its name also in
:data:`resumequal.spec.sections.Omission`) plus, for a new part of the state, its restore.

Pure data and functions of the spec and of what a trace recorded: no torch, nor the trace.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, Protocol, get_args

from resumequal.spec.boundaries import Boundary
from resumequal.spec.qualification import QualificationSpec
from resumequal.spec.sections import OMISSIONS, Omission

__all__ = ["CONTROLS", "Inapplicable", "NegativeControl", "Planted", "StatePart",
           "TracedLossScale", "TracedMicrostep", "TracedRestore", "TracedStep", "control",
           "left_out", "planted"]

# The parts of a rank's state a restore may leave out (resumequal.train.state.restore).
StatePart = Literal["rng", "data_cursor", "loader", "scheduler", "optimizer", "scaler",
                    "pending_grads"]
# What a rank-keyed control takes by rank and microstep in a resized world, as if it had
# never resized: a microbatch's samples, or its random streams.
Planted = Literal["data", "rng"]


# What evidence reads of the trace's records (resumequal.trace.records): the trace imports
# the spec, so the spec names the fields it reads rather than the records.
class TracedMicrostep(Protocol):
    """A microbatch of a traced step: the samples it consumed."""

    @property
    def sample_ids(self) -> Sequence[int]: ...


class TracedLossScale(Protocol):
    """A traced step's loss scaler."""

    @property
    def scale(self) -> float: ...
    @property
    def growth_tracker(self) -> int: ...


class TracedStep(Protocol):
    """A traced optimizer step of one rank (a ``StepRecord``)."""

    @property
    def rng(self) -> Mapping[str, str]: ...
    @property
    def lr(self) -> Sequence[float]: ...
    @property
    def microsteps(self) -> Sequence[TracedMicrostep]: ...
    @property
    def optimizer_state(self) -> str: ...
    @property
    def loss_scale(self) -> TracedLossScale | None: ...


class TracedRestore(Protocol):
    """A traced restore of one rank (a ``RestoreRecord``): where it resumed."""

    @property
    def checkpoint(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def microstep(self) -> int: ...


# Rank -> step -> record: the reference leg's effective steps.
Steps = Mapping[int, Mapping[int, TracedStep]]
# (reference steps, the control leg's restores after the kill, spec) -> the evidence that
# the omitted state never mattered in the compared window, or None.
Evidence = Callable[[Steps, Sequence[TracedRestore], QualificationSpec], str | None]


@dataclass(frozen=True)
class Inapplicable:
    """Why a control cannot apply to a spec, and what became of its leg (none ran)."""

    evidence: str
    mechanism: str


Requirement = Callable[[QualificationSpec], Inapplicable | None]


@dataclass(frozen=True)
class NegativeControl:
    """One negative control: what it breaks, when it applies, how its absence is shown."""

    omission: Omission
    leaves_out: frozenset[StatePart]
    # The first boundary whose value the omitted state decides: where a resume without it
    # first differs when the state was in use (later boundaries follow from it).
    shows_at: Boundary
    planted: Planted | None = None
    # Checked in order; the first that refuses the spec says why no leg runs.
    requires: tuple[Requirement, ...] = ()
    # Set: its state exists only in a graceful stop's emergency checkpoint, so its leg is
    # killed gracefully whatever the spec's mode; says why.
    graceful: str | None = None
    evidence: Evidence | None = None

    def inapplicable(self, spec: QualificationSpec) -> Inapplicable | None:
        """Why this control cannot apply to ``spec`` (no leg runs), or None: it applies."""
        for requirement in self.requires:
            found = requirement(spec)
            if found is not None:
                return found
        return None


# --------------------------------------------------------------------------- requirements

_NO_PART = "not run: the omitted state plays no part in this run"
_GLOBAL_DATA = ("preemption.resize is set: every microbatch draws its samples and random "
                "streams from its global position, ")


def _without_resize(why: str) -> Requirement:
    """A resize draws every microbatch from its global position: no such state is restored."""
    def check(spec: QualificationSpec) -> Inapplicable | None:
        return Inapplicable(why, _NO_PART) if spec.preemption.resize is not None else None
    return check


def _resize_only(spec: QualificationSpec) -> Inapplicable | None:
    if spec.preemption.resize is not None:
        return None
    return Inapplicable("preemption.resize is not set: a world that never changes size takes "
                        "the same samples and streams by rank as by global position", _NO_PART)


def _fp16(spec: QualificationSpec) -> Inapplicable | None:
    precision = spec.training.precision
    if precision == "fp16":
        return None
    return Inapplicable(f"training.precision is {precision}: there is no GradScaler, so no "
                        "scaler state to leave out",
                        "not run: the omitted state does not exist in this precision")


def _loader(spec: QualificationSpec) -> Inapplicable | None:
    if spec.workload.loader is not None:
        return None
    return Inapplicable("workload.loader is not set: the data does not come through a "
                        "StatefulDataLoader, so no loader state to leave out",
                        "not run: the omitted state does not exist in this workload")


def _mid_accumulation(spec: QualificationSpec) -> Inapplicable | None:
    p = spec.preemption
    if p.microstep > 0 and p.at == "microbatch":
        return None
    return Inapplicable(f"the cut (step {p.step}, microstep {p.microstep}, {p.at}) is at an "
                        "optimizer-step boundary: no gradients are pending to be dropped",
                        "not run: the omitted state cannot exist at this cut")


# --------------------------------------------------------------------------- evidence


def _observed(steps: Steps) -> bool:
    """Whether the trace can show a state that never changed: two steps at least, for
    one step alone never changes (and shows nothing)."""
    return any(len(records) >= 2 for records in steps.values())


def _rng_still(steps: Steps) -> str | None:
    if not _observed(steps):
        return None
    for records in steps.values():
        states = {repr(sorted(r.rng.items())) for r in records.values()}
        if len(states) != 1:
            return None
    n = len(next(iter(steps.values()), {}))
    return (f"the RNG states never advanced: every one of {n} steps started from the same "
            "Python, NumPy and torch states on every rank")


def _lr_constant(steps: Steps) -> str | None:
    if not _observed(steps):
        return None
    values = {tuple(r.lr) for records in steps.values() for r in records.values()}
    if len(values) != 1:
        return None
    (lrs,) = values
    return f"the learning rate was {', '.join(f'{x:g}' for x in lrs)} at every step"


def _inputs_constant(steps: Steps) -> str | None:
    if not _observed(steps):
        return None
    for records in steps.values():
        ids = {repr([m.sample_ids for m in r.microsteps]) for r in records.values()}
        if len(ids) != 1:
            return None
    return "every step consumed the same sample ids on every rank"


def _optimizer_still(steps: Steps) -> str | None:
    """A stateless optimizer at a constant learning rate (plain SGD, say): a fresh one is the
    same, and its state digest never moves."""
    if not _observed(steps):
        return None
    for records in steps.values():
        if len({r.optimizer_state for r in records.values()}) != 1:
            return None
    return ("the optimizer's state never changed: every step ended with the same state on "
            "every rank")


def _scaler_initial(steps: Steps, restores: Sequence[TracedRestore],
                    spec: QualificationSpec) -> str | None:
    """A fresh scaler equals the one the resume dropped: at every resumed step, the
    reference's scaler was still in its initial state on every rank."""
    init_scale = spec.training.grad_scaler.init_scale
    resumed = sorted({r.step + 1 for r in restores})
    if not resumed:
        return None
    for step in resumed:
        for records in steps.values():
            record = records.get(step)
            scale = record.loss_scale if record is not None else None
            if scale is None or (scale.scale, scale.growth_tracker) != (init_scale, 0):
                return None
    return (f"at step {resumed[0]}, where the resume picked up, the reference's loss scaler "
            f"was still in its initial state (scale {init_scale:g}, growth tracker 0) on every "
            "rank: a fresh scaler is the same")


def _nothing_pending(steps: Steps, restores: Sequence[TracedRestore],
                     spec: QualificationSpec) -> str | None:
    if restores and all(r.microstep == 0 for r in restores):
        return (f"the resume restored {restores[0].checkpoint}, taken at an optimizer-step "
                "boundary: no gradients were pending")
    return None


def _of_steps(found: Callable[[Steps], str | None]) -> Evidence:
    """Evidence that needs the reference's steps alone."""
    def evidence(steps: Steps, restores: Sequence[TracedRestore],
                 spec: QualificationSpec) -> str | None:
        return found(steps)
    return evidence


def _all_unused(steps: Steps) -> str | None:
    """Everything but model and optimizer never mattered: RNG, learning rate and inputs."""
    parts = [_rng_still(steps), _lr_constant(steps), _inputs_constant(steps)]
    return "; ".join(p for p in parts if p) if all(parts) else None


# --------------------------------------------------------------------------- the table

_CURSOR_AND_LOADER: Final[frozenset[StatePart]] = frozenset({"data_cursor", "loader"})

CONTROLS: Final[tuple[NegativeControl, ...]] = (
    NegativeControl(
        "rng", frozenset({"rng"}), "rng",
        requires=(_without_resize(_GLOBAL_DATA + "so no per-rank RNG state is restored to "
                                                 "leave out"),),
        evidence=_of_steps(_rng_still)),
    # A StatefulDataLoader's state decides which samples come next: it is part of the
    # data cursor.
    NegativeControl(
        "data_cursor", _CURSOR_AND_LOADER, "inputs",
        requires=(_without_resize(_GLOBAL_DATA + "so the position is the step counter, not "
                                                 "a data cursor"),),
        evidence=_of_steps(_inputs_constant)),
    NegativeControl("scheduler", frozenset({"scheduler"}), "lr",
                    evidence=_of_steps(_lr_constant)),
    # The model is restored into a fresh optimizer (under fsdp2, without its sharded state),
    # whose param groups hold the initial learning rate, not the scheduled one.
    NegativeControl("optimizer", frozenset({"optimizer"}), "lr",
                    evidence=_of_steps(_optimizer_still)),
    # Counters are always restored: every resume implementation stores the step it
    # stopped at.
    NegativeControl(
        "model_optimizer_only",
        frozenset({"rng", "data_cursor", "loader", "scheduler", "scaler", "pending_grads"}),
        "inputs", evidence=_of_steps(_all_unused)),
    NegativeControl(
        "pending_grads", frozenset({"pending_grads"}), "local_grads",
        requires=(_without_resize("preemption.resize kills hard at a node: no checkpoint "
                                  "holds pending gradients to drop"), _mid_accumulation),
        graceful="its emergency checkpoint carries the pending gradients the control then "
                 "drops",
        evidence=_nothing_pending),
    NegativeControl("scaler", frozenset({"scaler"}), "loss_scale", requires=(_fp16,),
                    evidence=_scaler_initial),
    # Leaves out the loader's state_dict alone (the stream's epoch is still restored).
    NegativeControl("loader_state", frozenset({"loader"}), "inputs", requires=(_loader,),
                    evidence=_of_steps(_inputs_constant)),
    # Not left out of a restore: they change how a resized world takes its microbatches,
    # which is exact while the world keeps its size and wrong once it has resized.
    NegativeControl("rank_cursor", frozenset(), "inputs", planted="data",
                    requires=(_resize_only,)),
    NegativeControl("rank_rng", frozenset(), "loss", planted="rng", requires=(_resize_only,)),
)

_BY_OMISSION: Final[Mapping[str, NegativeControl]] = MappingProxyType(
    {c.omission: c for c in CONTROLS})

# A control missing here would be accepted by the spec and then fail a run's restore.
if tuple(_BY_OMISSION) != OMISSIONS or len(CONTROLS) != len(get_args(Omission)):
    raise ImportError(f"resumequal.spec.omissions: CONTROLS names {tuple(_BY_OMISSION)}, the "
                      f"Omission Literal {OMISSIONS}: one entry each, in the same order")


def control(omission: str) -> NegativeControl:
    """The descriptor of ``omission``; ValueError naming the allowed ones if it has none."""
    found = _BY_OMISSION.get(omission)
    if found is None:
        raise ValueError(f"unknown omission {omission!r}; allowed: {', '.join(OMISSIONS)}")
    return found


def left_out(omit: frozenset[str]) -> frozenset[StatePart]:
    """The state parts the given omissions leave out of a restore, together."""
    return frozenset(part for name in omit for part in control(name).leaves_out)


def planted(omit: frozenset[str], what: Planted) -> bool:
    """Whether one of the given omissions plants ``what`` in a resized world's data."""
    return any(control(name).planted == what for name in omit)
