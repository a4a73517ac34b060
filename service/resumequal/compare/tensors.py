"""Which tensors differ at a boundary with per-tensor digests, grouped by module.

Steps record a digest per tensor at the tensor boundaries (``StepRecord.tensors``): the
rank-local and reduced gradients, the clipped gradients the optimizer takes, parameters and
buffers, the optimizer state per parameter. When such a boundary differs, this says how many
of its tensors differ, which first, and in which modules. Gradients are listed in backward
order, the order in which they become ready (the model's parameter order reversed), so the
first named is the one nearest the loss; everything else in the model's parameter order.
"""

from __future__ import annotations

from typing import Final

from resumequal.results.verdict import Bucket, ModuleDifference, TensorDifference
from resumequal.spec.boundaries import BOUNDARIES, TABLE, Boundary
from resumequal.trace.records import StepRecord, TensorDigests

# The boundaries whose tensors are digested one by one (TensorDigests has a field of each).
PER_TENSOR: Final = frozenset(b.name for b in TABLE if b.kind == "tensors")
_GRADIENTS: Final = frozenset(b.name for b in TABLE if b.gradient)
# The differing tensors a divergence lists by name.
MAX_LISTED: Final = 1000


def _tensors(digests: TensorDigests, boundary: Boundary) -> dict[str, str]:
    found: dict[str, str] = getattr(digests, boundary)
    return found


def module_of(name: str) -> str:
    """The module a tensor belongs to: its name without the last part (``(model)`` for a
    top-level tensor, as is an optimizer's ``param_groups``)."""
    module, dot, _ = name.rpartition(".")
    return module if dot else "(model)"


def tensor_difference(boundary: Boundary, control: StepRecord,
                      preempted: StepRecord) -> TensorDifference | None:
    """The differing tensors of ``boundary`` between two records of one step and rank; None
    where the boundary has no per-tensor digests or a record has none."""
    if boundary not in PER_TENSOR or control.tensors is None or preempted.tensors is None:
        return None
    a, b = _tensors(control.tensors, boundary), _tensors(preempted.tensors, boundary)
    if not a and not b:
        return None
    names = list(a) + [n for n in b if n not in a]
    backward = boundary in _GRADIENTS
    if backward:
        names.reverse()
    differing = [n for n in names if a.get(n) != b.get(n)]
    modules: dict[str, list[int]] = {}
    for name in names:
        counts = modules.setdefault(module_of(name), [0, 0])
        counts[1] += 1
        if a.get(name) != b.get(name):
            counts[0] += 1
    return TensorDifference(
        total=len(names), differ=len(differing), order="backward" if backward else "parameter",
        first=differing[0] if differing else None, differing=differing[:MAX_LISTED],
        modules=[ModuleDifference(module=m, differ=d, total=t) for m, (d, t) in modules.items()])


def step_tensors(control: StepRecord, preempted: StepRecord) -> dict[str, TensorDifference]:
    """Every per-tensor boundary of one step and rank, in execution order."""
    out: dict[str, TensorDifference] = {}
    for boundary in BOUNDARIES:
        diff = tensor_difference(boundary, control, preempted)
        if diff is not None:
            out[boundary] = diff
    return out


def bucket_layouts(control: StepRecord,
                   preempted: StepRecord) -> dict[str, list[Bucket]] | None:
    """Both legs' DDP bucket layouts at one step and rank, when they differ."""
    if control.bucket_layout == preempted.bucket_layout:
        return None
    return {leg: [Bucket(index=b.index, params=b.params, numel=b.numel) for b in r.buckets]
            for leg, r in (("control", control), ("preempted", preempted))}
