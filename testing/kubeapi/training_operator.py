"""The PyTorchJob controller of the Kubeflow training operator v1.9.0, one reconcile at a time.

:meth:`PyTorchJobController.reconcile` follows ``ReconcileJobs`` (pkg/controller.v1/common/
job.go), ``ReconcilePods`` (common/pod.go) and ``UpdateJobStatus``
(pkg/controller.v1/pytorch/pytorchjob_controller.go). The caller runs it only when an event
about the job or one of its pods arrives: the controller's delayed requeues go to a
``FakeWorkQueue`` whose ``AddAfter`` does nothing (pytorchjob_controller.go ~82,
kubeflow/trainer#3358), so ``activeDeadlineSeconds`` and ``ttlSecondsAfterFinished`` are
checked only then. Services are not simulated: nothing under test resolves their names.
"""

from __future__ import annotations

import calendar
import time
from typing import Any

from . import kubeflow
from .errors import ApiError
from .objects import clone, now_rfc3339
from .recorder import Recorder
from .store import Store

Obj = dict[str, Any]
KIND = "pytorchjobs.kubeflow.org"
CAUSE = "training-operator"  # Deletion.cause of what this controller deletes


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def _seconds_since(stamp: str) -> float:
    return time.time() - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))


class PyTorchJobController:
    """Reconciles PyTorchJobs against the emulator's store (see the module docstring)."""

    def __init__(self, store: Store, recorder: Recorder) -> None:
        self.store, self.recorder = store, recorder
        self.pods_kind = store.registry.lookup("", "v1", "pods")

    def reconcile(self, stored: Obj) -> None:
        """One pass of ReconcileJobs over the job as stored now."""
        if stored["metadata"].get("deletionTimestamp"):
            return
        kubeflow.check_supported(stored)
        job = kubeflow.with_defaults(stored)  # r.Scheme.Default: never written back
        meta, spec = job["metadata"], job["spec"]
        run_policy = spec["runPolicy"]
        status = clone(job.get("status") or {})
        status.setdefault("replicaStatuses", {})
        # Read as stored (its informer's cache): nothing here changes a pod in place.
        pods, _ = self.store.select(self.pods_kind, meta["namespace"], controller=meta["uid"],
                                    copy=False)
        if not any(c["type"] == "Created" for c in status.get("conditions") or []):
            # onOwnerCreateFunc (pytorchjob_controller.go)
            kubeflow.set_condition(status, "Created", "PyTorchJobCreated",
                                   f"PyTorchJob {meta['name']} is created.")
        if kubeflow.is_true(status, "Succeeded") or kubeflow.is_true(status, "Failed"):
            self._clean_up(stored, run_policy, status, pods, finished=True)
            if kubeflow.is_true(status, "Succeeded"):  # job.go: the active ones "succeeded"
                for counts in status["replicaStatuses"].values():
                    counts["succeeded"] = counts.get("succeeded", 0) + counts.pop("active", 0)
            self._write(stored, status)
            return
        failure = self._limit_exceeded(job, status, pods)
        if failure is not None:
            status.setdefault("completionTime", now_rfc3339())
            self._clean_up(stored, run_policy, status, pods, finished=False)
            self.recorder.event(stored, "Normal", "PyTorchJobFailed", failure)
            kubeflow.set_condition(status, "Failed", "PyTorchJobFailed", failure)
            self._write(stored, status)
            return
        for rtype in spec["pytorchReplicaSpecs"]:
            self._reconcile_pods(stored, job, status, pods, rtype)
        self._update_status(stored, job, status)
        self._write(stored, status)

    # ----------------------------------------------------------------- ReconcileJobs

    def _limit_exceeded(self, job: Obj, status: Obj, pods: list[Obj]) -> str | None:
        """The backoff and deadline checks of ReconcileJobs (common/job.go)."""
        run_policy, name = job["spec"]["runPolicy"], job["metadata"]["name"]
        if run_policy.get("backoffLimit") is not None:
            failed = sum(_phase(p) == "Failed" for p in pods)
            active = sum(_phase(p) not in ("Succeeded", "Failed")
                         and not p["metadata"].get("deletionTimestamp") for p in pods)
            previous = sum(c.get("failed", 0) for c in status["replicaStatuses"].values())
            total = sum(r["replicas"] for r in job["spec"]["pytorchReplicaSpecs"].values())
            # previousRetry is FakeWorkQueue.NumRequeues, always 0: only backoffLimit 0 can
            # be exceeded. PastBackoffLimit counts container restarts of OnFailure/Always
            # replicas only (pkg/core/job.go ~95-133), and the kubelet here restarts none.
            if failed > previous and active != total and run_policy["backoffLimit"] < 0 + 1:
                return f"Job {name} has failed because it has reached the specified backoff limit"
        deadline = run_policy.get("activeDeadlineSeconds")
        if deadline is not None and status.get("startTime") and _seconds_since(
                status["startTime"]) >= deadline:  # core.PastActiveDeadline
            return f"Job {name} has failed because it was active longer than specified deadline"
        return None

    def _clean_up(self, stored: Obj, run_policy: Obj, status: Obj, pods: list[Obj], *,
                  finished: bool) -> None:
        """DeletePodsAndServices (common/job.go ~122-124), then CleanupJob (the TTL)."""
        policy = run_policy["cleanPodPolicy"]
        if not (finished and policy == "None"):
            for pod in pods:
                if finished and policy == "Running" and _phase(pod) not in ("Running",
                                                                               "Pending"):
                    continue
                self._delete_pod(pod)
        ttl = run_policy.get("ttlSecondsAfterFinished")
        if ttl is not None and status.get("completionTime") and _seconds_since(
                status["completionTime"]) > ttl:
            meta = stored["metadata"]
            try:
                self.store.delete(self.store.registry.resolve(KIND), meta["namespace"],
                                  meta["name"], cause=CAUSE)
            except ApiError as e:
                if e.code != 404:
                    raise

    # ----------------------------------------------------------------- ReconcilePods

    def _reconcile_pods(self, stored: Obj, job: Obj, status: Obj, pods: list[Obj],
                        rtype: str) -> None:
        """ReconcilePods (common/pod.go): create the missing indices, judge the ended pods."""
        rspec = job["spec"]["pytorchReplicaSpecs"][rtype]
        counts: Obj = {}  # initializeReplicaStatuses
        mine = [p for p in pods if p["metadata"]["labels"].get(kubeflow.REPLICA_TYPE)
                == rtype.lower()]
        slices: dict[int, list[Obj]] = {}
        for pod in mine:
            slices.setdefault(int(pod["metadata"]["labels"][kubeflow.REPLICA_INDEX]),
                              []).append(pod)
        # GetPodSlices and CalculatePodSliceSize (pkg/core/pod.go): as many slices as the
        # larger of replicas and the highest index + 1, so raised replicas create the new
        # indices and lowered ones still visit the pods above them.
        for index in range(max([rspec["replicas"], *(i + 1 for i in slices)])):
            found = slices.get(index, [])
            if len(found) > 1:
                continue  # "We have too many pods for %s %d"
            if not found:
                # A replaced pod keeps its name, so it is created only once the old object
                # is gone (pod.go ~313-324): a terminating one still fills its slice.
                self._create_pod(stored, job, rtype, index)
                continue
            pod = found[0]
            if index >= rspec["replicas"]:
                # Out of range after the replicas were lowered: deleted (pod.go ReconcilePods,
                # "check if the index is in the valid range"), then judged like any other.
                self._delete_pod(pod)
            code = kubeflow.exit_code(pod)
            if code != kubeflow.NO_EXIT_CODE:
                self.recorder.event(stored, "Normal", "ExitedWithCode",
                                    f"Pod: {pod['metadata']['namespace']}."
                                    f"{pod['metadata']['name']} exited with code {code}")
            if _phase(pod) == "Failed":
                policy = rspec["restartPolicy"]
                if ((policy == "ExitCode" and kubeflow.retryable(code))
                        or policy in ("OnFailure", "Always")):
                    self._delete_pod(pod)
                    msg = f"job {job['metadata']['name']} is restarting because {rtype} " \
                          "replica(s) failed."
                    self.recorder.event(stored, "Warning", "PyTorchJobRestarting", msg)
                    kubeflow.set_condition(status, "Restarting", "PyTorchJobRestarting", msg)
                elif policy == "ExitCode":
                    msg = f'job "{job["metadata"]["name"]}" is failing because "{rtype}" ' \
                          "replica(s) failed."
                    self.recorder.event(stored, "Warning", "PyTorchJobFailed", msg)
                    kubeflow.set_condition(status, "Failed", "PyTorchJobFailed", msg)
            kubeflow.count_pod(counts, pod)
        status["replicaStatuses"][rtype] = counts

    def _create_pod(self, stored: Obj, job: Obj, rtype: str, index: int) -> None:
        pod, overridden = kubeflow.replica_pod(job, rtype, index)
        if overridden:
            self.recorder.event(stored, "Warning", *kubeflow.RESTART_POLICY_WARNING)
        try:
            self.store.create(self.pods_kind, None, pod)
        except ApiError as e:
            if e.code != 409:
                raise

    def _delete_pod(self, pod: Obj) -> None:
        """PodControl.DeletePod: default DeleteOptions, so the pod's own grace period."""
        meta = pod["metadata"]
        try:
            self.store.delete(self.pods_kind, meta["namespace"], meta["name"],
                              preconditions={"uid": meta["uid"]}, cause=CAUSE)
        except ApiError as e:
            if e.code not in (404, 409):
                raise

    # ----------------------------------------------------------------- UpdateJobStatus

    def _update_status(self, stored: Obj, job: Obj, status: Obj) -> None:
        """UpdateJobStatus (pytorchjob_controller.go), Worker-only jobs."""
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        status.setdefault("startTime", now_rfc3339())  # its AddAfter(deadline) is a no-op
        for rtype, rspec in job["spec"]["pytorchReplicaSpecs"].items():
            counts = status["replicaStatuses"][rtype]
            counts["selector"] = (f"{kubeflow.OPERATOR_NAME}=pytorchjob-controller,"
                                  f"{kubeflow.JOB_NAME}={name},"
                                  f"{kubeflow.REPLICA_TYPE}={rtype.lower()}")
            succeeded, running = counts.get("succeeded", 0), counts.get("active", 0)
            failed = counts.get("failed", 0)
            # An elastic job succeeds with its first successful worker (~409, PR #1752).
            if rspec["replicas"] - succeeded == 0 or (
                    job["spec"].get("elasticPolicy") is not None and succeeded > 0):
                msg = f"PyTorchJob {ns}/{name} successfully completed."
                self.recorder.event(stored, "Normal", "PyTorchJobSucceeded", msg)
                status.setdefault("completionTime", now_rfc3339())
                kubeflow.set_condition(status, "Succeeded", "PyTorchJobSucceeded", msg)
            elif running > 0:
                kubeflow.set_condition(status, "Running", "PyTorchJobRunning",
                                       f"PyTorchJob {ns}/{name} is running.")
            if failed > 0 and rspec["replicas"] > succeeded + running:
                if rspec["restartPolicy"] != "Never":
                    msg = f"PyTorchJob {name} is restarting because {failed} {rtype} " \
                          "replica(s) failed."
                    self.recorder.event(stored, "Warning", "PyTorchJobRestarting", msg)
                    kubeflow.set_condition(status, "Restarting", "PyTorchJobRestarting", msg)
                else:
                    msg = f"PyTorchJob {name} is failed because {failed} {rtype} " \
                          "replica(s) failed."
                    self.recorder.event(stored, "Normal", "PyTorchJobFailed", msg)
                    status.setdefault("completionTime", now_rfc3339())
                    kubeflow.set_condition(status, "Failed", "PyTorchJobFailed", msg)

    def _write(self, stored: Obj, status: Obj) -> None:
        """UpdateJobStatusInApiServer: a PUT of the status subresource (409 on a stale job)."""
        if status == stored.get("status"):
            return
        meta = stored["metadata"]
        try:
            self.store.update(self.store.registry.resolve(KIND), meta["namespace"],
                              meta["name"], {**stored, "status": status}, subresource="status")
        except ApiError as e:
            if e.code not in (404, 409):
                raise
