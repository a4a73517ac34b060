"""A small stand-in for the Kubeflow training operator and the Job controller.

Watches PyTorchJobs and Jobs in the emulator, creates the pods a PyTorchJob's Worker
replicas ask for (``<job>-worker-<i>``, owned by the job, with the training operator's
labels), runs each pod's container as :class:`tests.operator.workers.Workers` says, and
moves conditions as the real controllers do: a deleted pod is recreated and, like the
torch elastic agent, every rank of the leg restarts as the next attempt; a job whose
ranks all exit 0 Succeeds, one whose restarts are used up Fails. A Job's pod runs the
comparator; the Job completes on exit 0 and fails otherwise (backoffLimit 0).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.kubeapi import KubeAPI
from tests.kubeapi.store import now_rfc3339
from tests.operator.workers import Workers, arg_after, container_args

Obj = dict[str, Any]


def _set_condition(api: KubeAPI, plural: str, obj: Obj, type_: str, reason: str,
                   message: str = "", extra: Obj | None = None) -> None:
    status = obj.get("status") or {}
    conditions = [c for c in status.get("conditions") or [] if c["type"] != type_]
    for c in conditions:
        if type_ in ("Succeeded", "Failed", "Complete") or (
                type_ == "Running" and c["type"] == "Restarting"):
            c["status"] = "False"
    now = now_rfc3339()
    # batch/v1 JobCondition has lastProbeTime where Kubeflow's has lastUpdateTime.
    probe = "lastProbeTime" if plural == "jobs" else "lastUpdateTime"
    conditions.append({"type": type_, "status": "True", "reason": reason, "message": message,
                       probe: now, "lastTransitionTime": now})
    m = obj["metadata"]
    api.patch_status(plural, m["namespace"], m["name"],
                     {"conditions": conditions, **(extra or {})})


@dataclass
class _Leg:
    job: Obj
    attempt: int = 0
    ranks: dict[int, threading.Thread] = field(default_factory=dict)
    exits: dict[tuple[int, int], bool] = field(default_factory=dict)  # (attempt, rank)
    killed: threading.Event = field(default_factory=threading.Event)
    pods: dict[int, str] = field(default_factory=dict)  # rank -> pod uid
    done: bool = False


class SimulatedTraining:
    """Runs against ``api`` in a thread until :meth:`stop`."""

    def __init__(self, api: KubeAPI, workers: Workers, interval: float = 0.02) -> None:
        self.api, self.workers, self.interval = api, workers, interval
        self._legs: dict[str, _Leg] = {}
        self._jobs: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-training", daemon=True)

    def start(self) -> SimulatedTraining:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for leg in self._legs.values():
            leg.killed.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._step()
            except Exception:  # the emulator stopped under us at teardown
                if not self._stop.is_set():
                    raise

    def _step(self) -> None:
        for job in self.api.list("pytorchjobs.kubeflow.org"):
            uid = job["metadata"]["uid"]
            leg = self._legs.get(uid)
            if leg is None:
                leg = self._legs[uid] = _Leg(job)
                self._start_attempt(leg)
                _set_condition(self.api, "pytorchjobs.kubeflow.org", job, "Running",
                               "PyTorchJobRunning")
            elif not leg.done:
                self._watch_leg(leg)
        for job in self.api.list("jobs"):
            uid = job["metadata"]["uid"]
            if uid not in self._jobs:
                self._jobs.add(uid)
                threading.Thread(target=self._compare, args=(job,), daemon=True).start()

    # -- PyTorchJob ----------------------------------------------------------------------

    def _replicas(self, job: Obj) -> int:
        return int(job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])

    def _pod_name(self, job: Obj, rank: int) -> str:
        return f"{job['metadata']['name']}-worker-{rank}"

    def _ensure_pod(self, leg: _Leg, rank: int) -> None:
        job = leg.job
        m = job["metadata"]
        name = self._pod_name(job, rank)
        pod = self.api.get("pods", m["namespace"], name)
        if pod is None:
            template = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
            pod = self.api.create("pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {
                    "name": name, "namespace": m["namespace"],
                    "labels": {**(template.get("metadata") or {}).get("labels", {}),
                               "training.kubeflow.org/job-name": m["name"],
                               "training.kubeflow.org/replica-type": "worker",
                               "training.kubeflow.org/replica-index": str(rank)},
                    "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                         "name": m["name"], "uid": m["uid"],
                                         "controller": True, "blockOwnerDeletion": True}],
                },
                "spec": template["spec"],
            }, m["namespace"])
        leg.pods[rank] = pod["metadata"]["uid"]

    def _start_attempt(self, leg: _Leg) -> None:
        job = leg.job
        args = container_args(job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"])
        uri, name = arg_after(args, "--run"), arg_after(args, "--leg")
        leg.killed = threading.Event()
        attempt, killed = leg.attempt, leg.killed
        for rank in range(self._replicas(job)):
            self._ensure_pod(leg, rank)
            pod = self._pod_name(job, rank)

            def play(rank: int = rank, pod: str = pod) -> None:
                try:
                    ok = self.workers.run_rank(uri, name, rank, attempt, pod, killed)
                except Exception:
                    ok = False
                leg.exits[(attempt, rank)] = ok

            t = threading.Thread(target=play, daemon=True, name=f"{pod}-a{attempt}")
            leg.ranks[rank] = t
            t.start()

    def _watch_leg(self, leg: _Leg) -> None:
        job = leg.job
        m = job["metadata"]
        if self.api.get("pytorchjobs.kubeflow.org", m["namespace"], m["name"]) is None:
            leg.done = True
            leg.killed.set()
            return
        replicas = self._replicas(job)
        lost = [r for r in range(replicas)
                if (p := self.api.get("pods", m["namespace"], self._pod_name(job, r))) is None
                or p["metadata"]["uid"] != leg.pods.get(r)]
        if lost:
            leg.killed.set()
            for t in leg.ranks.values():
                t.join(timeout=5)
            restarts = int(job["spec"]["elasticPolicy"].get("maxRestarts") or 0)
            if leg.attempt >= restarts:
                leg.done = True
                _set_condition(self.api, "pytorchjobs.kubeflow.org", job, "Failed",
                               "PyTorchJobFailed", "restarts exhausted")
                return
            _set_condition(self.api, "pytorchjobs.kubeflow.org", job, "Restarting",
                           "PyTorchJobRestarting", f"pod worker-{lost[0]} was deleted")
            leg.attempt += 1
            self._start_attempt(leg)
            _set_condition(self.api, "pytorchjobs.kubeflow.org", job, "Running",
                           "PyTorchJobRunning")
            return
        exits = [leg.exits.get((leg.attempt, r)) for r in range(replicas)]
        if all(e is True for e in exits):
            leg.done = True
            _set_condition(self.api, "pytorchjobs.kubeflow.org", job, "Succeeded",
                           "PyTorchJobSucceeded", "",
                           {"replicaStatuses": {"Worker": {"succeeded": replicas}}})
        elif any(e is False for e in exits) and not leg.killed.is_set():
            leg.done = True
            _set_condition(self.api, "pytorchjobs.kubeflow.org", job, "Failed",
                           "PyTorchJobFailed", "a worker exited 1")

    # -- Job -----------------------------------------------------------------------------

    def _compare(self, job: Obj) -> None:
        args = container_args(job["spec"]["template"])
        uri = args[args.index("compare") + 1]
        time.sleep(0.05)
        code = self.workers.compare(uri)
        current = self.api.get("jobs", job["metadata"]["namespace"], job["metadata"]["name"])
        if current is None:
            return
        if code == 0:
            _set_condition(self.api, "jobs", current, "Complete", "Completed", "",
                           {"succeeded": 1})
        else:
            _set_condition(self.api, "jobs", current, "Failed", "BackoffLimitExceeded",
                           "Job has reached the specified backoff limit", {"failed": 1})
