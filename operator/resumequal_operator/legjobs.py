"""What a leg runs as on the cluster (``spec.backend``): a Kubeflow training operator v1
PyTorchJob or a Kubeflow Trainer v2 TrainJob.

Each backend is one small class behind :class:`LegJobs`: the kind of a leg's job and its
manifest (:mod:`.pytorchjob`, :mod:`.trainjob`), and which pods are a leg's and what node
index each runs (for kill targeting). Everything else — launching, completion from the
ranks' markers in the store, kills by pod name and uid, the comparator and zoom Jobs,
cleanup, events and status — is the same for both (:mod:`.backend`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from resumequal.qualify.plan import LegPlan
from resumequal_operator import pytorchjob, trainjob
from resumequal_operator.kube import JOBS, PYTORCHJOBS, TRAINJOBS, Kind, Obj
from resumequal_operator.resource import Backend, QualificationRunSpec

# Set by the training operator on every pod of a PyTorchJob.
REPLICA_INDEX = "training.kubeflow.org/replica-index"


@dataclass(frozen=True)
class TrainerSettings:
    """The runtime the TrainJobs of qualification legs name (the chart installs it)."""

    runtime: str = trainjob.DEFAULT_RUNTIME
    runtime_kind: trainjob.RuntimeKind = trainjob.DEFAULT_RUNTIME_KIND


class LegJobs(Protocol):
    """One backend's leg jobs."""

    backend: Backend
    kind: Kind
    label: str  # the kind as messages name it

    def manifest(self, run_name: str, namespace: str, uid: str, spec: QualificationRunSpec,
                 leg: LegPlan, run_uri: str, *, key_secret: str | None = None) -> Obj:
        """The leg's job; its pods read the checkpoint key from Secret ``key_secret``."""
        ...

    def job_of(self, pod: Obj) -> str | None:
        """The name of the leg job ``pod`` runs for, if any."""
        ...

    def node_index(self, pod: Obj) -> str | None:
        """The node index ``pod`` runs (``"0"`` hosts the c10d rendezvous)."""
        ...


def _controller_owner(pod: Obj, kind: str) -> str | None:
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == kind and ref.get("controller"):
            return str(ref.get("name"))
    return None


class PyTorchJobLegs:
    """Legs as elastic PyTorchJobs: pods ``<job>-worker-<index>``, recreated under their
    names, indexed by the training operator's replica-index label."""

    backend: Backend = "pytorchjob"
    kind = PYTORCHJOBS
    label = "PyTorchJob"

    def manifest(self, run_name: str, namespace: str, uid: str, spec: QualificationRunSpec,
                 leg: LegPlan, run_uri: str, *, key_secret: str | None = None) -> Obj:
        return pytorchjob.leg_job(run_name, namespace, uid, spec, leg, run_uri,
                                  key_secret=key_secret)

    def job_of(self, pod: Obj) -> str | None:
        return _controller_owner(pod, "PyTorchJob")

    def node_index(self, pod: Obj) -> str | None:
        meta = pod["metadata"]
        index = (meta.get("labels") or {}).get(REPLICA_INDEX)
        if index is None and meta["name"].rsplit("-", 2)[-2:-1] == ["worker"]:
            index = meta["name"].rsplit("-", 1)[-1]
        return index


class TrainJobLegs:
    """Legs as TrainJobs on the chart's runtime: pods of the JobSet's Indexed Job
    ``<trainjob>-node-0``, replaced under new names, indexed by their completion index."""

    backend: Backend = "trainjob"
    kind = TRAINJOBS
    label = "TrainJob"

    def __init__(self, settings: TrainerSettings | None = None) -> None:
        self.settings = settings or TrainerSettings()

    def manifest(self, run_name: str, namespace: str, uid: str, spec: QualificationRunSpec,
                 leg: LegPlan, run_uri: str, *, key_secret: str | None = None) -> Obj:
        return trainjob.leg_trainjob(run_name, namespace, uid, spec, leg, run_uri,
                                     runtime=self.settings.runtime,
                                     runtime_kind=self.settings.runtime_kind,
                                     key_secret=key_secret)

    def job_of(self, pod: Obj) -> str | None:
        # Pod -> Job <trainjob>-node-0 -> JobSet <trainjob> -> TrainJob <trainjob>.
        name = (pod["metadata"].get("labels") or {}).get(trainjob.JOBSET_NAME)
        owner = _controller_owner(pod, "Job")
        if not isinstance(name, str) or owner != trainjob.node_job_name(name):
            return None
        return name

    def node_index(self, pod: Obj) -> str | None:
        meta = pod["metadata"]
        return ((meta.get("annotations") or {}).get(trainjob.COMPLETION_INDEX)
                or (meta.get("labels") or {}).get(trainjob.COMPLETION_INDEX))


def leg_jobs(backend: Backend, trainer: TrainerSettings | None = None) -> LegJobs:
    """The leg jobs of ``backend``."""
    if backend == "trainjob":
        return TrainJobLegs(trainer or TrainerSettings())
    return PyTorchJobLegs()


def job_kinds(trainer: TrainerSettings | None) -> tuple[Kind, ...]:
    """Every kind of job a run can own: TrainJobs only where the backend is enabled (their
    API may not be served elsewhere)."""
    return (PYTORCHJOBS, JOBS) if trainer is None else (PYTORCHJOBS, TRAINJOBS, JOBS)


__all__ = ["LegJobs", "PyTorchJobLegs", "TrainJobLegs", "TrainerSettings", "job_kinds",
           "leg_jobs"]
