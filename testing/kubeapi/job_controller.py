"""The batch/v1 Job controller (kubernetes/kubernetes pkg/controller/job, k8s 1.31), for the
comparator's and zoom's Jobs (one pod each).

- Pods: ``<job>-<random>`` (controller_utils.go GetPodFromTemplate, getPodsPrefix). Every
  pod carries the ``batch.kubernetes.io/job-tracking`` finalizer
  (appendJobCompletionFinalizerIfNotFound), removed once the pod is counted, or once its Job
  is gone (syncOrphanPod): a pod deleted with grace 0 stays until its exit is counted.
- A pod is failed when its phase is Failed or, unless only failed pods are replaced
  (``podReplacementPolicy: Failed``, which a ``podFailurePolicy`` forces), when it is
  terminating (isPodFailed; controller_utils.go IsPodActive). Each is counted once, matched
  against the ``podFailurePolicy`` rules in order (pod_failure_policy.go
  matchPodFailurePolicy: ``onExitCodes`` over non-zero terminated containers, ``onPodConditions``):
  ``FailJob`` fails the Job (reason PodFailurePolicy), ``Ignore`` is not counted, ``Count``
  (and no rule, and no policy) adds to ``status.failed``.
- A missing pod is created while ``status.failed <= backoffLimit``, but only after the pod
  failure backoff: 10 s after the last failure, doubling per failure, at most 10 min
  (backoff_utils.go DefaultJobPodFailureBackOff, MaxJobPodFailureBackOff). A terminating
  pod is waited for only when only failed pods are replaced (manageJob: ``diff :=
  wantActive - terminating - active``).
- Success: the one completion succeeded and none is active:
  ``SuccessCriteriaMet`` then ``Complete``. Failure (backoffLimit exceeded, a FailJob rule,
  ``activeDeadlineSeconds``, a real timer there): ``FailureTarget``, the active pods deleted,
  then ``Failed`` once none is terminating (enactJobFinished).
- ``ttlSecondsAfterFinished`` (pkg/controller/ttlafterfinished) deletes a finished Job.

Not simulated (refused): suspend, successPolicy, backoffLimitPerIndex (FailIndex), a Job of
more than one pod, Indexed Jobs (a JobSet's: the real JobSet and Job controller run them in
the local cluster, :mod:`testing.cluster`).
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
TRACKING = "batch.kubernetes.io/job-tracking"
BACKOFF_S, MAX_BACKOFF_S = 10.0, 600.0


@dataclass
class _Job:
    counted: set[str] = field(default_factory=set)  # uids of pods counted
    launched: set[str] = field(default_factory=set)  # uids of the pods it created
    succeeded: bool = False
    failed: int = 0
    last_failure: float | None = None
    failure: tuple[str, str] | None = None  # reason and message, once FailureTarget is set
    finished_at: float | None = None


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def _condition(status: Obj, ctype: str, reason: str, message: str) -> None:
    now = now_rfc3339()
    status["conditions"] = [*(status.get("conditions") or []), {
        "type": ctype, "status": "True", "reason": reason, "message": message,
        "lastProbeTime": now, "lastTransitionTime": now}]


def match_failure_policy(policy: Obj, pod: Obj) -> tuple[str, str | None]:
    """The action of the first rule matching a failed pod, with the FailJob message
    (pod_failure_policy.go matchPodFailurePolicy, getFailJobMessage); ``Count`` when none."""
    meta = pod["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for i, rule in enumerate(policy.get("rules") or []):
        action = rule["action"]
        codes = rule.get("onExitCodes")
        if codes is not None:
            for s in statuses:
                terminated = (s.get("state") or {}).get("terminated")
                if terminated is None or int(terminated.get("exitCode", 0)) == 0:
                    continue
                if codes.get("containerName") not in (None, s["name"]):
                    continue
                code = int(terminated["exitCode"])
                if (code in codes["values"]) == (codes["operator"] == "In"):
                    return action, (f"Container {s['name']} for pod {where} failed with exit "
                                    f"code {code} matching {action} rule at index {i}")
        for pattern in rule.get("onPodConditions") or []:
            for c in (pod.get("status") or {}).get("conditions") or []:
                if c.get("type") == pattern["type"] and c.get("status") == pattern.get(
                        "status", "True"):
                    return action, (f"Pod {where} has condition {c['type']} matching "
                                    f"{action} rule at index {i}")
    return "Count", None


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
        if meta.get("deletionTimestamp"):
            return
        self._check_supported(job)
        state = self._jobs.setdefault(meta["uid"], _Job())
        status = clone(job.get("status") or {})
        # Read as stored (its informer's cache): nothing here changes a pod in place.
        pods, _ = self.store.select(self.pods_kind, meta["namespace"], controller=meta["uid"],
                                    copy=False)
        if is_true(status, "Complete") or is_true(status, "Failed"):
            self._release(pods, ended_only=True)
            state.finished_at = state.finished_at or time.time()
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and time.time() >= state.finished_at + float(ttl):
                self._delete(self.jobs_kind, job)
            return
        status.setdefault("startTime", now_rfc3339())
        policy = spec.get("podFailurePolicy")
        only_failed = policy is not None or spec.get("podReplacementPolicy") == "Failed"
        fail_job = self._count(state, pods, policy, only_failed)
        self._release([p for p in pods if p["metadata"]["uid"] in state.counted])
        active = [p for p in pods if _phase(p) not in ("Succeeded", "Failed")
                  and not p["metadata"].get("deletionTimestamp")]
        terminating = [p for p in pods if _phase(p) not in ("Succeeded", "Failed")
                       and p["metadata"].get("deletionTimestamp")]
        if state.failed:
            status["failed"] = state.failed
        status["succeeded"] = int(state.succeeded)
        status["terminating"] = len(terminating)
        if state.failure is None:
            if state.succeeded and not active:
                done = "Reached expected number of succeeded pods"
                _condition(status, "SuccessCriteriaMet", "CompletionsReached", done)
                _condition(status, "Complete", "CompletionsReached", done)
                status.update(active=0, ready=0, completionTime=now_rfc3339())
                return self._write(job, status)
            deadline = spec.get("activeDeadlineSeconds")
            if deadline is not None and time.time() >= parse_rfc3339(
                    status["startTime"]) + deadline:
                state.failure = ("DeadlineExceeded", "Job was active longer than specified "
                                 "deadline")
            elif state.failed > int(spec.get("backoffLimit", 6)):
                state.failure = ("BackoffLimitExceeded", "Job has reached the specified "
                                 "backoff limit")
            elif fail_job is not None:
                state.failure = ("PodFailurePolicy", fail_job)
            if state.failure is not None:
                _condition(status, "FailureTarget", *state.failure)
        if state.failure is not None:
            for pod in active:
                self._delete(self.pods_kind, pod)
            if not terminating and not active:
                _condition(status, "Failed", *state.failure)
            status.update(active=0, ready=0)
            return self._write(job, status)
        self._create_missing(job, state, active, terminating if only_failed else [])
        status.update(active=len(active), ready=sum(_phase(p) == "Running" for p in active))
        self._write(job, status)

    def forget(self, live: set[str]) -> None:
        """Drop what is remembered of Jobs that are gone; let go of their pods (syncOrphanPod:
        a pod whose Job is gone loses its tracking finalizer once it ended or is deleted)."""
        for uid in set(self._jobs) - live:
            del self._jobs[uid]
        # Read as stored, not copied (a controller's informer cache); _release only reads.
        orphans = [p for p in self.store.snapshot(self.pods_kind, None, None)[0]
                   if TRACKING in (p["metadata"].get("finalizers") or [])
                   and not any(r.get("uid") in live
                               for r in p["metadata"].get("ownerReferences") or [])]
        self._release(orphans, ended_only=True)

    # ----------------------------------------------------------------- helpers

    @staticmethod
    def _check_supported(job: Obj) -> None:
        spec, name = job["spec"], job["metadata"]["name"]
        refused = [k for k in ("suspend", "successPolicy", "backoffLimitPerIndex",
                               "maxFailedIndexes") if spec.get(k)]
        if spec.get("completionMode") == "Indexed":
            refused.append("an Indexed Job")
        if int(spec.get("completions", 1)) != 1 or int(spec.get("parallelism", 1)) != 1:
            refused.append("a Job of more than one pod")
        if refused:
            raise NotImplementedError(f"Job {name}: {', '.join(refused)} not simulated")

    def _count(self, state: _Job, pods: list[Obj], policy: Obj | None,
               only_failed: bool) -> str | None:
        """Count every pod that ended since the last pass; the message of a FailJob match."""
        fail_job = None
        present = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            present.add(uid)
            if uid in state.counted:
                continue
            phase = _phase(pod)
            if phase == "Succeeded":
                state.counted.add(uid)
                state.succeeded = True
                continue
            if phase != "Failed" and not (pod["metadata"].get("deletionTimestamp")
                                          and not only_failed):
                continue
            state.counted.add(uid)
            action, message = ("Count", None)
            if policy is not None:
                action, message = match_failure_policy(policy, pod)
            if action == "FailJob":
                fail_job = fail_job or message
            elif action != "Ignore":
                state.failed += 1
                state.last_failure = time.time()
        # Finalizers keep counted pods: one gone uncounted was force-deleted (still a failure).
        for uid in set(state.launched) - present - state.counted:
            state.counted.add(uid)
            state.failed += 1
            state.last_failure = time.time()
        return fail_job

    def _create_missing(self, job: Obj, state: _Job, active: list[Obj],
                        waiting: list[Obj]) -> None:
        if state.last_failure is not None:
            backoff = min(BACKOFF_S * 2 ** max(state.failed - 1, 0), MAX_BACKOFF_S)
            if time.time() < state.last_failure + backoff:
                return
        if not active and not waiting and not state.succeeded:
            self._create_pod(job, state)

    def _create_pod(self, job: Obj, state: _Job) -> None:
        meta = job["metadata"]
        template = job["spec"].get("template") or {}
        tmeta = template.get("metadata") or {}
        pod_meta: Obj = {
            "generateName": f"{meta['name']}-",
            "namespace": meta["namespace"],
            "labels": dict(tmeta.get("labels") or {}),
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [owner_reference(job)],
            "finalizers": [TRACKING],
        }
        pod_spec = clone(template.get("spec") or {})
        try:
            created: Obj = self.store.create(self.pods_kind, None, {
                "apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": pod_spec})
        except ApiError as e:
            if e.code in (409, 422):
                return
            raise
        state.launched.add(created["metadata"]["uid"])

    def _release(self, pods: list[Obj], *, ended_only: bool = False) -> None:
        """Remove the tracking finalizer of ``pods`` (with ``ended_only``: of those that
        ended or are being deleted)."""
        for pod in pods:
            finalizers = pod["metadata"].get("finalizers") or []
            if TRACKING not in finalizers:
                continue
            if ended_only and _phase(pod) not in ("Succeeded", "Failed") \
                    and not pod["metadata"].get("deletionTimestamp"):
                continue
            meta = pod["metadata"]
            try:
                self.store.patch(self.pods_kind, meta["namespace"], meta["name"], {
                    "metadata": {"finalizers": [f for f in finalizers if f != TRACKING],
                                 "resourceVersion": meta["resourceVersion"]}},
                    "application/merge-patch+json")
            except ApiError as e:
                if e.code not in (404, 409):
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
