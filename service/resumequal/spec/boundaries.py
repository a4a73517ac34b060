"""The boundaries of an optimizer step: one table, from which every list of them derives.

A boundary is a point of one update where each rank's trace records a value (a digest of a
group of tensors, numbers, or other state) that the comparator holds equal between the
legs. :data:`TABLE` says, for each, what the spec, the trace, the comparator, the report
and a zoom replay need to know; the spec validates names against :data:`Boundary`.

Adding a boundary is one entry here (its name also in :data:`Boundary`, in the same
place: the order is the execution order) plus its capture: the
:class:`~resumequal.trace.records.StepRecord` field, the training loop that fills it and,
for a tensor boundary, its per-tensor digests and its zoom stage.

Pure data: imports nothing of ours, nor torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal, get_args

__all__ = ["BOUNDARIES", "BY_NAME", "TABLE", "Boundary", "BoundaryInfo", "DriftGroup", "Kind",
           "StageOrigin", "of_kind"]

Boundary = Literal[
    "inputs",
    "rng",
    "loss",
    "loss_scale",
    "local_grads",
    "bucket_layout",
    "reduced_grads",
    "grad_norm",
    "clipped_grads",
    "lr",
    "params",
    "optimizer_state",
]

# tensors: a digest of a group of tensors, with a digest per tensor (TensorDigests) and a
#   group of the final checkpoints whose drift judges it under a tolerance.
# numeric: numbers (per microbatch or param group), held to a tolerance directly.
# exact: other state (sample ids, RNG digests, the loss scaler, the bucket layout), held
#   equal whatever the tolerances.
Kind = Literal["tensors", "numeric", "exact"]
DriftGroup = Literal["model", "optimizer"]
# Where a replay names a difference that first shows at a boundary's stage, the stage
# before it being equal: in the reduction, in clipping and unscaling, in the optimizer.
StageOrigin = Literal["reduction", "clipping", "optimizer"]


@dataclass(frozen=True)
class BoundaryInfo:
    """One boundary: its names, where the trace keeps it, and how it is judged and zoomed."""

    name: Boundary
    label: str  # in sentences: "gradient norm differed from step 6"
    field: str  # the StepRecord field holding its value
    kind: Kind
    # The value is this attribute of each of the step's microbatch records (``field`` is
    # then ``microsteps``).
    item: str | None = None
    # Gradients, whose tensors are listed in backward order (the order they become ready).
    gradient: bool = False
    # tensors: the final checkpoints' group whose drift judges it under a tolerance, and
    # the boundary whose tolerance holds when it declares none.
    drift_group: DriftGroup | None = None
    tolerance_from: Boundary | None = None
    # tensors: the stage a zoom replay captures after it, and the one captured as the step
    # begins (state the step starts from); a difference there names StageOrigin "state".
    stage: str | None = None
    stage_before: str | None = None
    zoom: StageOrigin | None = None


TABLE: Final[tuple[BoundaryInfo, ...]] = (
    BoundaryInfo("inputs", "inputs (sample ids)", "microsteps", "exact", item="sample_ids"),
    BoundaryInfo("rng", "RNG states", "rng", "exact"),
    BoundaryInfo("loss", "loss", "microsteps", "numeric", item="loss"),
    BoundaryInfo("loss_scale", "loss scale", "loss_scale", "exact"),
    BoundaryInfo("local_grads", "local gradients", "local_grads", "tensors", gradient=True,
                 drift_group="model", tolerance_from="params", stage="local_grads"),
    BoundaryInfo("bucket_layout", "DDP bucket layout", "bucket_layout", "exact"),
    BoundaryInfo("reduced_grads", "reduced gradients", "reduced_grads", "tensors",
                 gradient=True, drift_group="model", tolerance_from="params",
                 stage="reduced_grads", zoom="reduction"),
    BoundaryInfo("grad_norm", "gradient norm", "grad_norm", "numeric"),
    BoundaryInfo("clipped_grads", "clipped gradients", "clipped_grads", "tensors",
                 gradient=True, drift_group="model", tolerance_from="params",
                 stage="clipped_grads", zoom="clipping"),
    BoundaryInfo("lr", "learning rate", "lr", "numeric"),
    BoundaryInfo("params", "parameters", "params", "tensors", drift_group="model",
                 stage="params", stage_before="params_before", zoom="optimizer"),
    BoundaryInfo("optimizer_state", "optimizer state", "optimizer_state", "tensors",
                 drift_group="optimizer", stage="optimizer_state",
                 stage_before="optimizer_state_before", zoom="optimizer"),
)

# In execution order: the order the comparator walks them in.
BOUNDARIES: Final[tuple[Boundary, ...]] = tuple(b.name for b in TABLE)
# By name; keyed by str, as names read from traces and verdicts are.
BY_NAME: Final[Mapping[str, BoundaryInfo]] = MappingProxyType({b.name: b for b in TABLE})

# A table that drifted from the Literal would let a spec name a boundary nothing records.
if get_args(Boundary) != BOUNDARIES:
    raise ImportError(f"resumequal.spec.boundaries: TABLE names {BOUNDARIES}, the Boundary "
                      f"Literal {get_args(Boundary)}: one entry each, in the same order")


def of_kind(kind: Kind) -> tuple[Boundary, ...]:
    """The boundaries of one kind, in execution order."""
    return tuple(b.name for b in TABLE if b.kind == kind)
