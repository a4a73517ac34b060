"""An elastic resize on a cluster (``preemption.resize``): the Worker replicas that shrink
and grow a leg's world, and the ranks that finish it.

Pure functions over plans and PyTorchJob objects; :mod:`.backend` makes the requests. The
training operator v1.9 deletes the pods whose replica index is >= ``replicas`` when they are
lowered, and creates the missing indices, under the same names, when they are raised
(``ReconcilePods``, pkg/controller.v1/common/pod.go); the torchrun agents, launched with
``PET_NNODES=toNodes:nnodes``, re-rendezvous at the size the pods give them. The ranks
mirror :class:`resumequal.local.backend.LocalBackend` (``_final_world``, ``_resumed_world``).
"""

from __future__ import annotations

from typing import Any

from resumequal.plan import LegPlan
from resumequal.spec import ResizeSpec

Obj = dict[str, Any]
WORKER = "Worker"


def leg_resize(plan: LegPlan) -> ResizeSpec | None:
    """The resize ``plan`` goes through: a cut leg's. The reference leg carries the same
    spec (and so the same elastic launch) but is never killed, so never shrunk."""
    return plan.spec.preemption.resize if plan.cut else None


def final_world(plan: LegPlan) -> int:
    """The ranks that finish the leg: fewer after a resize that does not grow back."""
    w, resize = plan.spec.world, leg_resize(plan)
    if resize is None or resize.grow_after_step is not None:
        return w.world_size
    return resize.to_nodes * w.nproc_per_node


def resumed_world(plan: LegPlan) -> int:
    """The ranks of the first attempt after the kill (whose progress dates the resume)."""
    w, resize = plan.spec.world, leg_resize(plan)
    return w.world_size if resize is None else resize.to_nodes * w.nproc_per_node


def worker_replicas(job: Obj) -> int:
    """``spec.pytorchReplicaSpecs.Worker.replicas`` (1 when unset: the CRD's default)."""
    worker = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get(WORKER) or {}
    return int(worker.get("replicas", 1))


def replicas_patch(replicas: int) -> Obj:
    """The JSON merge patch that sets the Worker replicas (a custom resource takes no
    strategic merge patch)."""
    return {"spec": {"pytorchReplicaSpecs": {WORKER: {"replicas": replicas}}}}

