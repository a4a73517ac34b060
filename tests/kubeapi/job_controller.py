"""The batch/v1 Job controller for what the comparator Job uses (kubernetes/kubernetes
pkg/controller/job/job_controller.go, k8s 1.31): one pod at a time (parallelism and
completions 1), ``<job>-<random>``; a pod that fails, or vanishes before it finished (job
tracking finalizers), counts as failed and is replaced while ``status.failed <=
backoffLimit``, else ``FailureTarget`` + ``Failed`` (``BackoffLimitExceeded``); a pod that
succeeds gives ``SuccessCriteriaMet`` + ``Complete`` (``CompletionsReached``);
``activeDeadlineSeconds`` (a real timer there) deletes the active pod and fails the Job
with ``DeadlineExceeded``; ``ttlSecondsAfterFinished`` (pkg/controller/ttlafterfinished)
deletes a finished Job. Not simulated: suspend, podFailurePolicy, successPolicy, indexes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .kubeflow import is_true, owner_reference
from .objects import clone, now_rfc3339, parse_rfc3339
from .store import Store

Obj = dict[str, Any]
CAUSE = "job-controller"


@dataclass
class _Job:
    launched: set[str] = field(default_factory=set)  # uids of pods it created
    failed: set[str] = field(default_factory=set)
    finished_at: float | None = None


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def _condition(status: Obj, ctype: str, reason: str, message: str) -> None:
    now = now_rfc3339()
    status["conditions"] = [*(status.get("conditions") or []), {
        "type": ctype, "status": "True", "reason": reason, "message": message,
        "lastProbeTime": now, "lastTransitionTime": now}]


class JobController:
    """Reconciles batch/v1 Jobs (see the module docstring); called on every pass."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.jobs_kind = store.registry.lookup("batch", "v1", "jobs")
        self.pods_kind = store.registry.lookup("", "v1", "pods")
        self._jobs: dict[str, _Job] = {}

    def reconcile(self, job: Obj) -> None:
        """One pass over one Job."""
        meta, spec = job["metadata"], job["spec"]
        if meta.get("deletionTimestamp") or spec.get("suspend"):
            return
        state = self._jobs.setdefault(meta["uid"], _Job())
        status = clone(job.get("status") or {})
        if is_true(status, "Complete") or is_true(status, "Failed"):
            state.finished_at = state.finished_at or time.time()
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and time.time() >= state.finished_at + float(ttl):
                self._delete(self.jobs_kind, job)
            return
        status.setdefault("startTime", now_rfc3339())
        pods = [p for p in self.store.select(self.pods_kind, meta["namespace"])[0]
                if any(r.get("uid") == meta["uid"] for r in p["metadata"].get(
                    "ownerReferences") or [])]
        present = {p["metadata"]["uid"] for p in pods}
        state.failed |= {p["metadata"]["uid"] for p in pods if _phase(p) == "Failed"}
        state.failed |= state.launched - present
        active = [p for p in pods if _phase(p) in ("Pending", "Running")
                  and not p["metadata"].get("deletionTimestamp")]
        if state.failed:
            status["failed"] = len(state.failed)
        if any(_phase(p) == "Succeeded" for p in pods):
            done = "Reached expected number of succeeded pods"
            _condition(status, "SuccessCriteriaMet", "CompletionsReached", done)
            _condition(status, "Complete", "CompletionsReached", done)
            status.update(active=0, ready=0, succeeded=1, completionTime=now_rfc3339())
            return self._write(job, status)
        failure = None
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None and time.time() >= parse_rfc3339(status["startTime"]) + deadline:
            failure = ("DeadlineExceeded", "Job was active longer than specified deadline")
        elif len(state.failed) > int(spec.get("backoffLimit", 6)):
            failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        if failure is not None:
            for pod in active:
                self._delete(self.pods_kind, pod)
            _condition(status, "FailureTarget", *failure)
            _condition(status, "Failed", *failure)
            status.update(active=0, ready=0)
            return self._write(job, status)
        if not active:
            created = self._create_pod(job)
            if created is not None:
                state.launched.add(created["metadata"]["uid"])
                active = [created]
        status.update(active=len(active), ready=sum(_phase(p) == "Running" for p in active))
        self._write(job, status)

    def forget(self, live: set[str]) -> None:
        """Drop what is remembered of Jobs that are gone."""
        for uid in set(self._jobs) - live:
            del self._jobs[uid]

    def _create_pod(self, job: Obj) -> Obj | None:
        template = job["spec"].get("template") or {}
        tmeta = template.get("metadata") or {}
        try:
            created: Obj = self.store.create(self.pods_kind, None, {
                "apiVersion": "v1", "kind": "Pod", "metadata": {
                    "generateName": f"{job['metadata']['name']}-",
                    "namespace": job["metadata"]["namespace"],
                    "labels": dict(tmeta.get("labels") or {}),
                    "annotations": dict(tmeta.get("annotations") or {}),
                    "ownerReferences": [owner_reference(job)]},
                "spec": clone(template.get("spec") or {})})
            return created
        except ApiError as e:
            if e.code in (409, 422):
                return None
            raise

    def _delete(self, kind: Any, obj: Obj) -> None:
        meta = obj["metadata"]
        try:
            self.store.delete(kind, meta["namespace"], meta["name"],
                              propagation_policy="Background", cause=CAUSE)
        except ApiError as e:
            if e.code != 404:
                raise

    def _write(self, job: Obj, status: Obj) -> None:
        if status == job.get("status"):
            return
        meta = job["metadata"]
        try:
            self.store.update(self.jobs_kind, meta["namespace"], meta["name"],
                              {**job, "status": status}, subresource="status")
        except ApiError as e:
            if e.code not in (404, 409):
                raise
