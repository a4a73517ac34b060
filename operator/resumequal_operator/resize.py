"""An elastic resize on a cluster (``preemption.resize``): the Worker replicas that shrink
and grow a leg's world, and the ranks that finish it.

Pure functions over plans and PyTorchJob objects; :mod:`.backend` makes the requests. The
training operator v1.9 deletes the pods whose replica index is >= ``replicas`` when they are
lowered, and creates the missing indices, under the same names, when they are raised
(``ReconcilePods``, pkg/controller.v1/common/pod.go); the torchrun agents, launched with
``PET_NNODES=toNodes:nnodes``, re-rendezvous at the size the pods give them. Which legs
resize, and the ranks that finish them, are the plan's (:class:`resumequal.qualify.plan.LegPlan`).
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]
WORKER = "Worker"


def worker_replicas(job: Obj) -> int:
    """``spec.pytorchReplicaSpecs.Worker.replicas`` (1 when unset: the CRD's default)."""
    worker = ((job.get("spec") or {}).get("pytorchReplicaSpecs") or {}).get(WORKER) or {}
    return int(worker.get("replicas", 1))


def replicas_patch(replicas: int) -> Obj:
    """The JSON merge patch that sets the Worker replicas (a custom resource takes no
    strategic merge patch)."""
    return {"spec": {"pytorchReplicaSpecs": {WORKER: {"replicas": replicas}}}}

