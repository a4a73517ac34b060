"""A simulated Kubeflow training operator (v1.9, PyTorchJob) and Job controller, plus kubelet.

It runs in-process against a :class:`KubeAPI` on its own thread, level-triggered: after
every change in the emulator it looks at every PyTorchJob, batch/v1 Job and their pods and
moves them along the way the real controllers do. What the containers *do* is up to the
test: callbacks announce that workers are running, and :meth:`succeed` / :meth:`fail`
end them::

    def workers_up(job, attempt):
        if attempt == 1:                       # restarted after the preemption
            operator.succeed(job["metadata"]["namespace"], job["metadata"]["name"])

    operator = SimulatedTrainingOperator(api, on_pods_running=workers_up)

PyTorchJob (kubeflow.org/v1):

- pods ``<job>-<replica type>-<index>`` (``worker``, ``master``) with the labels
  ``training.kubeflow.org/{job-name,replica-type,replica-index,operator-name}``, an
  ownerReference to the job (controller), the template's env followed by the env the
  operator injects (``PYTHONUNBUFFERED``; ``MASTER_ADDR``/``MASTER_PORT``/``WORLD_SIZE``/
  ``RANK`` when there is a Master; ``PET_*`` from ``elasticPolicy`` and ``nprocPerNode``),
  restartPolicy ``ExitCode`` mapped to the pod's ``Never``; one headless Service per pod.
- status: ``startTime``; conditions ``Created`` → ``Running`` (when every pod runs); a
  pod that fails or disappears while running → ``Restarting``, the pod is recreated and the
  attempt number grows (the elastic agents restart the whole group; surviving pods keep
  running) → ``Running``; ``replicaStatuses.<Type>`` counts active/succeeded/failed.
  Running and Restarting replace each other; the newest condition is last.
- restarts count against ``runPolicy.backoffLimit`` (then ``Failed``, reason
  ``BackoffLimitExceeded``); a failure that ``restartPolicy`` does not retry (``Never``,
  ``ExitCode`` with an exit code below 128) fails the job; ``activeDeadlineSeconds`` →
  ``Failed``/``DeadlineExceeded``; ``cleanPodPolicy`` (default ``None``) on completion;
  ``ttlSecondsAfterFinished`` deletes the job.
- admission as the operator's webhook does it: every replica template needs a container
  named ``pytorch``; an elastic job needs a rendezvous port (``rdzvPort`` or a container
  port named ``pytorchjob-port``, which is defaulted to 23456 on the pod).

batch/v1 Job: one pod ``<job>-<random>`` at a time; a failed or vanished pod counts as a
failure and is replaced until ``backoffLimit`` (→ ``FailureTarget`` + ``Failed``,
``BackoffLimitExceeded``); success → ``SuccessCriteriaMet`` + ``Complete``;
``activeDeadlineSeconds`` → ``DeadlineExceeded``.

Kubelet: pods go from Pending to Running ``start_delay`` seconds after creation. Not
simulated: suspend, Master-less elastic scale up/down, podFailurePolicy, completions > 1.
"""

from __future__ import annotations

import calendar
import copy
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .api import KubeAPI
from .errors import ApiError
from .patch import MERGE
from .store import Obj, now_rfc3339

log = logging.getLogger(__name__)

PTJ_KIND = "pytorchjobs.kubeflow.org"
JOB_KIND = "jobs.batch"
JOB_NAME = "training.kubeflow.org/job-name"
REPLICA_TYPE = "training.kubeflow.org/replica-type"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
OPERATOR_NAME = "training.kubeflow.org/operator-name"
JOB_ROLE = "training.kubeflow.org/job-role"
DEFAULT_PORT = 23456
PORT_NAME = "pytorchjob-port"
CONTAINER_NAME = "pytorch"
CAUSE = "training-operator"

PodsRunning = Callable[[Obj, int], None]
JobRunning = Callable[[Obj], None]


@dataclass
class _Tracked:
    """What the controllers remember about one job (the real ones keep it in expectations)."""

    attempt: int = 0
    restarts: int = 0
    launched: bool = False
    notified: int = -1
    launched_pods: set[str] = field(default_factory=set)
    failed_pods: set[str] = field(default_factory=set)
    announced: set[str] = field(default_factory=set)
    finished_at: float | None = None


def _condition(conditions: list[Obj], ctype: str, reason: str, message: str,
               status: str = "True") -> list[Obj]:
    """The training operator's setCondition: Running and Restarting replace each other,
    Succeeded/Failed turn Running false; the new condition goes last."""
    now = now_rfc3339()
    out = []
    for c in conditions:
        if c.get("type") == ctype and c.get("status") == status and c.get("reason") == reason:
            return conditions
        if c.get("type") == ctype or {c.get("type"), ctype} == {"Running", "Restarting"}:
            continue
        if ctype in ("Succeeded", "Failed") and c.get("type") == "Running":
            c = {**c, "status": "False", "lastUpdateTime": now, "lastTransitionTime": now}
        out.append(c)
    out.append({"type": ctype, "status": status, "reason": reason, "message": message,
                "lastUpdateTime": now, "lastTransitionTime": now})
    return out


def _is_true(status: Obj, ctype: str) -> bool:
    return any(c.get("type") == ctype and c.get("status") == "True"
               for c in status.get("conditions") or [])


def _finished(status: Obj, kind: str) -> bool:
    done = ("Succeeded", "Failed") if kind == PTJ_KIND else ("Complete", "Failed")
    return any(_is_true(status, c) for c in done)


def _exit_code(pod: Obj) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode"):
            return int(terminated["exitCode"])
    return 1


def _owned_by(pod: Obj, uid: str) -> bool:
    return any(r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or [])


def validate_pytorchjob(obj: Obj) -> str | None:
    """The training operator's admission checks (its validating webhook)."""
    if obj.get("kind") != "PyTorchJob":
        return None
    spec = obj.get("spec") or {}
    replicas = spec.get("pytorchReplicaSpecs") or {}
    if not replicas:
        return "spec.pytorchReplicaSpecs: Required value"
    for rtype, rspec in replicas.items():
        if rtype not in ("Master", "Worker"):
            return f"spec.pytorchReplicaSpecs: unknown replica type {rtype!r}"
        containers = (((rspec or {}).get("template") or {}).get("spec") or {}).get(
            "containers") or []
        if not any(c.get("name") == CONTAINER_NAME for c in containers):
            return (f"spec.pytorchReplicaSpecs[{rtype}].template.spec.containers: there is "
                    f"no container named {CONTAINER_NAME}")
        if rtype == "Master" and rspec.get("replicas", 1) != 1:
            return "spec.pytorchReplicaSpecs[Master].replicas: must be 1"
    return None


class SimulatedTrainingOperator:
    """PyTorchJob + Job controllers and kubelet for a :class:`KubeAPI` (module docstring).

    ``on_pods_running(job, attempt)`` runs once per attempt when every pod of a PyTorchJob
    runs (attempt 0 first, +1 after each restart); ``on_job_running(job)`` once per pod of
    a batch Job. Callbacks run in order on one thread of their own, so they may call
    :meth:`succeed`, :meth:`fail` or the API; an exception in one is re-raised by :meth:`stop`.
    """

    def __init__(self, api: KubeAPI, *, on_pods_running: PodsRunning | None = None,
                 on_job_running: JobRunning | None = None, start_delay: float = 0.0,
                 webhook: bool = True, tick: float = 0.05) -> None:
        self.api = api
        self.on_pods_running = on_pods_running
        self.on_job_running = on_job_running
        self.start_delay = start_delay
        self.tick = tick
        self.errors: list[BaseException] = []
        self._lock = threading.RLock()
        self._tracked: dict[str, _Tracked] = {}
        self._start_at: dict[str, float] = {}
        self._callbacks: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.Queue())
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        if webhook:
            api.add_validator(validate_pytorchjob)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> SimulatedTrainingOperator:
        """Start reconciling and running callbacks."""
        self._stopping.clear()
        self._threads = [threading.Thread(target=self._loop, name="training-operator",
                                          daemon=True),
                         threading.Thread(target=self._callback_loop, name="training-workers",
                                          daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop both threads; re-raise the first error a callback or reconcile raised."""
        self._stopping.set()
        self._callbacks.put(None)
        with self.api.store.changed:
            self.api.store.changed.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
        if self.errors:
            raise RuntimeError("the simulated training operator failed") from self.errors[0]

    def __enter__(self) -> SimulatedTrainingOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        store = self.api.store
        seen = -1
        while not self._stopping.is_set():
            seen = store.resource_version
            try:
                self.reconcile()
            except Exception as e:
                log.exception("simulated training operator failed")
                self.errors.append(e)
                return
            store.wait_for(lambda last=seen: (self._stopping.is_set()  # type: ignore[misc]
                                              or store.resource_version != last), self.tick)

    def _callback_loop(self) -> None:
        while True:
            item = self._callbacks.get()
            if item is None or self._stopping.is_set():
                return
            fn, args = item
            try:
                fn(*args)
            except Exception as e:
                log.exception("a worker callback failed")
                self.errors.append(e)

    def _announce(self, fn: Callable[..., None] | None, *args: Any) -> None:
        if fn is not None:
            self._callbacks.put((fn, copy.deepcopy(args)))

    # ----------------------------------------------------------------- scripting

    def attempt(self, namespace: str, name: str, kind: str = PTJ_KIND) -> int:
        """The current attempt of a job (0 until its first restart)."""
        job = self._job(namespace, name, kind)
        with self._lock:
            return self._state(job).attempt

    def pods(self, namespace: str, name: str, kind: str | None = None) -> list[Obj]:
        """The job's pods as they are now."""
        job = self._job(namespace, name, kind)
        uid = job["metadata"]["uid"]
        return [p for p in self.api.list("pods", namespace) if _owned_by(p, uid)]

    def succeed(self, namespace: str, name: str, kind: str | None = None) -> None:
        """Every container of the job exits 0; the job completes."""
        with self._lock:
            job = self._job(namespace, name, kind)
            if _finished(job.get("status") or {}, self._kind_of(job)):
                return
            pods = [p for p in self.pods(namespace, name, self._kind_of(job))
                    if p["status"].get("phase") in ("Pending", "Running")]
            for pod in pods:
                self._terminate(pod, "Succeeded", 0, "Completed", "")
            if self._kind_of(job) == PTJ_KIND:
                self._finish_ptj(job, "Succeeded", "PyTorchJobSucceeded",
                                 f"PyTorchJob {name} is successfully completed.")
            else:
                status = copy.deepcopy(job.get("status") or {})
                conds = _condition(status.get("conditions") or [], "SuccessCriteriaMet",
                                   "CompletionsReached", "Reached expected number of "
                                   "succeeded pods")
                conds = _condition(conds, "Complete", "CompletionsReached",
                                   "Reached expected number of succeeded pods")
                status.update(conditions=conds, active=0, ready=0,
                              succeeded=int(status.get("succeeded", 0)) + 1,
                              completionTime=now_rfc3339())
                self._write_status(JOB_KIND, job, status)
                self._state(job).finished_at = time.monotonic()

    def fail(self, namespace: str, name: str, message: str = "worker failed", *,
             exit_code: int = 1, replica: str = "Worker", index: int = 0,
             kind: str | None = None) -> None:
        """One pod's container exits with ``exit_code``; the controllers then restart or fail
        the job exactly as they would for a real failure (see the module docstring)."""
        with self._lock:
            job = self._job(namespace, name, kind)
            pods = self.pods(namespace, name, self._kind_of(job))
            if self._kind_of(job) == PTJ_KIND:
                wanted = f"{name}-{replica.lower()}-{index}"
                pods = [p for p in pods if p["metadata"]["name"] == wanted]
            else:
                pods = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")]
            if not pods:
                raise LookupError(f"no live pod to fail for {namespace}/{name}")
            self._terminate(pods[0], "Failed", exit_code, "Error", message)
        self._wake()

    # ----------------------------------------------------------------- helpers

    def _wake(self) -> None:
        with self.api.store.changed:
            self.api.store.changed.notify_all()

    def _job(self, namespace: str, name: str, kind: str | None) -> Obj:
        for k in ([kind] if kind else [PTJ_KIND, JOB_KIND]):
            job = self.api.get(k, namespace, name)
            if job is not None:
                return job
        raise LookupError(f"no job {namespace}/{name}")

    @staticmethod
    def _kind_of(job: Obj) -> str:
        return PTJ_KIND if job.get("kind") == "PyTorchJob" else JOB_KIND

    def _state(self, job: Obj) -> _Tracked:
        return self._tracked.setdefault(job["metadata"]["uid"], _Tracked())

    def _write_status(self, kind: str, job: Obj, status: Obj) -> None:
        if status == job.get("status"):
            return
        meta = job["metadata"]
        try:
            self.api.store.patch(self.api.kind(kind), meta["namespace"], meta["name"],
                                 {"status": status}, MERGE, subresource="status")
        except ApiError as e:
            if e.code != 404:
                raise

    def _delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            self.api.store.delete(self.api.kind(kind), namespace, name, grace_period_seconds=0,
                                  propagation_policy="Background", cause=CAUSE)
        except ApiError as e:
            if e.code != 404:
                raise

    def _create(self, kind: str, obj: Obj) -> Obj | None:
        try:
            return self.api.store.create(self.api.kind(kind), None, obj)
        except ApiError as e:
            if e.code == 409:
                return None
            raise

    def _terminate(self, pod: Obj, phase: str, exit_code: int, reason: str,
                   message: str) -> None:
        now = now_rfc3339()
        statuses = [{"name": c["name"], "ready": False, "restartCount": 0,
                     "image": c.get("image", ""), "imageID": "",
                     "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                              "message": message, "finishedAt": now,
                                              "startedAt": pod["status"].get("startTime", now)}}}
                    for c in pod["spec"].get("containers") or []]
        status = {"phase": phase, "containerStatuses": statuses,
                  "conditions": [{"type": "Ready", "status": "False",
                                  "reason": "PodCompleted" if phase == "Succeeded" else reason,
                                  "lastTransitionTime": now}]}
        if message:
            status["message"] = message
        meta = pod["metadata"]
        try:
            self.api.store.patch(self.api.kind("pods"), meta["namespace"], meta["name"],
                                 {"status": status}, MERGE, subresource="status")
        except ApiError as e:
            if e.code != 404:
                raise

    # ----------------------------------------------------------------- reconcile

    def reconcile(self) -> None:
        """One level-triggered pass over every job and pod (the thread calls this)."""
        with self._lock:
            live: set[str] = set()
            for job in self.api.list(PTJ_KIND):
                live.add(job["metadata"]["uid"])
                self._guarded(self._reconcile_ptj, job)
            for job in self.api.list(JOB_KIND):
                live.add(job["metadata"]["uid"])
                self._guarded(self._reconcile_job, job)
            self._kubelet()
            for uid in set(self._tracked) - live:
                del self._tracked[uid]

    def _guarded(self, fn: Callable[[Obj], None], job: Obj) -> None:
        try:
            fn(job)
        except ApiError as e:
            # A write raced with the test or the controller under test; the next pass retries.
            log.debug("reconcile of %s retried: %s", job["metadata"]["name"], e)

    def _kubelet(self) -> None:
        """Pending pods of the jobs we run start ``start_delay`` s after creation."""
        now = time.monotonic()
        for pod in self.api.list("pods"):
            uid = pod["metadata"]["uid"]
            if uid not in self._start_at or pod["status"].get("phase") != "Pending":
                continue
            if pod["metadata"].get("deletionTimestamp") or now < self._start_at[uid]:
                continue
            stamp = now_rfc3339()
            statuses = [{"name": c["name"], "ready": True, "started": True, "restartCount": 0,
                         "image": c.get("image", ""), "imageID": "",
                         "containerID": f"containerd://{uid}",
                         "state": {"running": {"startedAt": stamp}}}
                        for c in pod["spec"].get("containers") or []]
            octet = len(self._start_at) % 250 + 1
            status = {"phase": "Running", "startTime": stamp, "podIP": f"10.0.0.{octet}",
                      "hostIP": "192.168.0.1", "containerStatuses": statuses,
                      "conditions": [{"type": t, "status": "True", "lastTransitionTime": stamp}
                                     for t in ("PodScheduled", "Initialized",
                                               "ContainersReady", "Ready")]}
            meta = pod["metadata"]
            try:
                self.api.store.patch(self.api.kind("pods"), meta["namespace"], meta["name"],
                                     {"status": status}, MERGE, subresource="status")
            except ApiError as e:
                if e.code != 404:
                    raise

    def _track_pod(self, pod: Obj | None) -> None:
        if pod is not None:
            self._start_at[pod["metadata"]["uid"]] = time.monotonic() + self.start_delay

    def _after_finish(self, kind: str, job: Obj, state: _Tracked) -> None:
        ttl = (job["spec"].get("runPolicy") or {}).get("ttlSecondsAfterFinished") \
            if kind == PTJ_KIND else job["spec"].get("ttlSecondsAfterFinished")
        if state.finished_at is None:
            state.finished_at = time.monotonic()
        if ttl is not None and time.monotonic() >= state.finished_at + float(ttl):
            self._delete(kind, job["metadata"]["namespace"], job["metadata"]["name"])

    # PyTorchJob ---------------------------------------------------------------

    def _expected(self, job: Obj) -> list[tuple[str, int, Obj]]:
        specs = job["spec"].get("pytorchReplicaSpecs") or {}
        return [(rtype, i, (rspec.get("template") or {}))
                for rtype in ("Master", "Worker") if (rspec := specs.get(rtype))
                for i in range(int(rspec.get("replicas", 1)))]

    def _reconcile_ptj(self, job: Obj) -> None:
        meta, spec = job["metadata"], job.get("spec") or {}
        if meta.get("deletionTimestamp"):
            return
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        state = self._state(job)
        status = copy.deepcopy(job.get("status") or {})
        if _finished(status, PTJ_KIND):
            self._after_finish(PTJ_KIND, job, state)
            return
        run_policy = spec.get("runPolicy") or {}
        conds = status.get("conditions") or []
        if not any(c.get("type") == "Created" for c in conds):
            conds = _condition(conds, "Created", "PyTorchJobCreated",
                               f"PyTorchJob {name} is created.")
        status["conditions"] = conds
        status.setdefault("startTime", now_rfc3339())
        if not status.get("replicaStatuses"):
            status["replicaStatuses"] = {}
        if self._past_deadline(status, run_policy.get("activeDeadlineSeconds")):
            self._write_status(PTJ_KIND, job, status)
            self._finish_ptj(self.api.get(PTJ_KIND, ns, name) or job, "Failed",
                             "DeadlineExceeded", f"PyTorchJob {name} has failed because it "
                             "was active longer than specified deadline")
            return
        expected = self._expected(job)
        pods = {p["metadata"]["name"]: p for p in self.api.list("pods", ns)
                if _owned_by(p, uid)}
        failed = [p for p in pods.values() if p["status"].get("phase") == "Failed"]
        missing = [e for e in expected if self._pod_name(name, e) not in pods]
        if state.launched and (failed or missing):
            specs = spec.get("pytorchReplicaSpecs") or {}
            permanent = [p for p in failed if not self._retryable(
                specs, p["metadata"]["labels"].get(REPLICA_TYPE, "worker"), _exit_code(p))]
            rtype = failed[0]["metadata"]["labels"].get(REPLICA_TYPE, "worker").capitalize() \
                if failed else missing[0][0]
            count = len(failed) + len(missing)
            if permanent:
                self._write_status(PTJ_KIND, job, status)
                self._finish_ptj(self.api.get(PTJ_KIND, ns, name) or job, "Failed",
                                 "PyTorchJobFailed", f"PyTorchJob {name} is failed because "
                                 f"{len(permanent)} {rtype} replica(s) failed.")
                return
            state.restarts += 1
            limit = run_policy.get("backoffLimit")
            if limit is not None and state.restarts > int(limit):
                self._write_status(PTJ_KIND, job, status)
                self._finish_ptj(self.api.get(PTJ_KIND, ns, name) or job, "Failed",
                                 "BackoffLimitExceeded", f"PyTorchJob {name} has failed "
                                 "because it has reached the specified backoff limit")
                return
            state.attempt += 1
            status["conditions"] = _condition(
                status["conditions"], "Restarting", "PyTorchJobRestarting",
                f"PyTorchJob {name} is restarting because {count} {rtype} replica(s) failed.")
            for pod in failed:
                self._delete("pods", ns, pod["metadata"]["name"])
                pods.pop(pod["metadata"]["name"], None)
        for entry in expected:
            pod_name = self._pod_name(name, entry)
            if pod_name not in pods:
                created = self._create("pods", self._pod(job, *entry))
                self._track_pod(created)
                if created is not None:
                    pods[pod_name] = created
            self._create("services", self._service(job, entry[0], entry[1]))
        state.launched = True
        phases = [pods[self._pod_name(name, e)]["status"].get("phase") for e in expected
                  if self._pod_name(name, e) in pods]
        for rtype in {e[0] for e in expected}:
            mine = [p for p in pods.values()
                    if p["metadata"]["labels"].get(REPLICA_TYPE) == rtype.lower()]
            status["replicaStatuses"][rtype] = {
                "active": sum(p["status"].get("phase") == "Running" for p in mine),
                "succeeded": sum(p["status"].get("phase") == "Succeeded" for p in mine),
                "failed": sum(p["status"].get("phase") == "Failed" for p in mine),
                "selector": f"{JOB_NAME}={name},{OPERATOR_NAME}=pytorchjob-controller,"
                            f"{REPLICA_TYPE}={rtype.lower()}",
            }
        all_running = len(phases) == len(expected) and all(p == "Running" for p in phases)
        if all_running:
            status["conditions"] = _condition(status["conditions"], "Running",
                                              "PyTorchJobRunning", f"PyTorchJob {name} is running.")
        self._write_status(PTJ_KIND, job, status)
        if all_running and state.notified < state.attempt:
            state.notified = state.attempt
            self._announce(self.on_pods_running, self.api.get(PTJ_KIND, ns, name) or job,
                           state.attempt)

    @staticmethod
    def _past_deadline(status: Obj, deadline: Any) -> bool:
        if deadline is None or not status.get("startTime"):
            return False
        started = calendar.timegm(time.strptime(status["startTime"], "%Y-%m-%dT%H:%M:%SZ"))
        return time.time() >= started + float(deadline)

    @staticmethod
    def _retryable(specs: Obj, rtype: str, exit_code: int) -> bool:
        rspec = specs.get(rtype.capitalize()) or {}
        policy = rspec.get("restartPolicy", "Never")
        if policy == "ExitCode":
            return exit_code >= 128
        return policy in ("OnFailure", "Always")

    @staticmethod
    def _pod_name(job_name: str, entry: tuple[str, int, Obj]) -> str:
        return f"{job_name}-{entry[0].lower()}-{entry[1]}"

    def _finish_ptj(self, job: Obj, ctype: str, reason: str, message: str) -> None:
        meta = job["metadata"]
        status = copy.deepcopy(job.get("status") or {})
        status["conditions"] = _condition(status.get("conditions") or [], ctype, reason,
                                          message)
        status["completionTime"] = now_rfc3339()
        pods = [p for p in self.api.list("pods", meta["namespace"])
                if _owned_by(p, meta["uid"])]
        for rtype, rstatus in (status.get("replicaStatuses") or {}).items():
            mine = [p for p in pods if p["metadata"]["labels"].get(REPLICA_TYPE) == rtype.lower()]
            rstatus.update(active=sum(p["status"].get("phase") == "Running" for p in mine),
                           succeeded=sum(p["status"].get("phase") == "Succeeded" for p in mine),
                           failed=sum(p["status"].get("phase") == "Failed" for p in mine))
        self._write_status(PTJ_KIND, job, status)
        self._state(job).finished_at = time.monotonic()
        policy = (job["spec"].get("runPolicy") or {}).get("cleanPodPolicy", "None")
        for pod in pods:
            running = pod["status"].get("phase") in ("Pending", "Running")
            if policy == "All" or (policy == "Running" and running):
                self._delete("pods", meta["namespace"], pod["metadata"]["name"])
                self._delete("services", meta["namespace"], pod["metadata"]["name"])

    def _env(self, job: Obj, rtype: str, index: int) -> list[Obj]:
        spec, name = job["spec"], job["metadata"]["name"]
        specs = spec.get("pytorchReplicaSpecs") or {}
        env: list[Obj] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
        nproc = spec.get("nprocPerNode")
        if "Master" in specs:
            port = self._port(specs["Master"])
            total = sum(int(s.get("replicas", 1)) for s in specs.values())
            rank = index + 1 if rtype == "Worker" else index
            env += [{"name": "MASTER_PORT", "value": str(port)},
                    {"name": "PET_MASTER_PORT", "value": str(port)},
                    {"name": "MASTER_ADDR", "value": f"{name}-master-0"},
                    {"name": "PET_MASTER_ADDR", "value": f"{name}-master-0"},
                    {"name": "WORLD_SIZE", "value": str(total)},
                    {"name": "RANK", "value": str(rank)},
                    {"name": "PET_NNODES", "value": str(total)},
                    {"name": "PET_NODE_RANK", "value": str(rank)}]
        elastic = spec.get("elasticPolicy")
        if elastic is not None:
            host = elastic.get("rdzvHost") or f"{name}-worker-0"
            port = elastic.get("rdzvPort") or self._port(specs.get("Worker") or {})
            if elastic.get("minReplicas") is None and elastic.get("maxReplicas") is None:
                nnodes = str((specs.get("Worker") or {}).get("replicas", 1))
            else:
                nnodes = f"{elastic.get('minReplicas')}:{elastic.get('maxReplicas')}"
            env += [{"name": "PET_RDZV_ENDPOINT", "value": f"{host}:{port}"},
                    {"name": "PET_RDZV_BACKEND", "value": elastic.get("rdzvBackend", "c10d")},
                    {"name": "PET_NNODES", "value": nnodes}]
            if elastic.get("maxRestarts") is not None:
                env.append({"name": "PET_MAX_RESTARTS", "value": str(elastic["maxRestarts"])})
            nproc = elastic.get("nProcPerNode", nproc)
            if elastic.get("rdzvId") is not None:
                env.append({"name": "PET_RDZV_ID", "value": str(elastic["rdzvId"])})
            conf = elastic.get("rdzvConf") or []
            if conf:
                env.append({"name": "PET_RDZV_CONF",
                            "value": ",".join(f"{c['key']}={c['value']}" for c in conf)})
            if elastic.get("standalone"):
                env.append({"name": "PET_STANDALONE", "value": ""})
        if nproc is not None:
            env.append({"name": "PET_NPROC_PER_NODE", "value": str(nproc)})
        return env

    @staticmethod
    def _port(rspec: Obj) -> int:
        for c in ((rspec.get("template") or {}).get("spec") or {}).get("containers") or []:
            if c.get("name") == CONTAINER_NAME:
                for port in c.get("ports") or []:
                    if port.get("name") == PORT_NAME:
                        return int(port["containerPort"])
        return DEFAULT_PORT

    def _labels(self, job: Obj, rtype: str, index: int) -> dict[str, str]:
        labels = {JOB_NAME: job["metadata"]["name"], OPERATOR_NAME: "pytorchjob-controller",
                  REPLICA_TYPE: rtype.lower(), REPLICA_INDEX: str(index)}
        if rtype == "Master":
            labels[JOB_ROLE] = "master"
        return labels

    def _owner(self, job: Obj) -> Obj:
        return {"apiVersion": job["apiVersion"], "kind": job["kind"],
                "name": job["metadata"]["name"], "uid": job["metadata"]["uid"],
                "controller": True, "blockOwnerDeletion": True}

    def _pod(self, job: Obj, rtype: str, index: int, template: Obj) -> Obj:
        tmeta = template.get("metadata") or {}
        pod_spec = copy.deepcopy(template.get("spec") or {})
        rspec = job["spec"]["pytorchReplicaSpecs"][rtype]
        policy = rspec.get("restartPolicy", "Never")
        pod_spec["restartPolicy"] = "Never" if policy == "ExitCode" else policy
        injected = self._env(job, rtype, index)
        for container in pod_spec.get("containers") or []:
            container["env"] = list(container.get("env") or []) + copy.deepcopy(injected)
            if container.get("name") == CONTAINER_NAME and not any(
                    p.get("name") == PORT_NAME for p in container.get("ports") or []):
                container.setdefault("ports", []).append(
                    {"name": PORT_NAME, "containerPort": DEFAULT_PORT, "protocol": "TCP"})
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": f"{job['metadata']['name']}-{rtype.lower()}-{index}",
            "namespace": job["metadata"]["namespace"],
            "labels": {**(tmeta.get("labels") or {}), **self._labels(job, rtype, index)},
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [self._owner(job)]}, "spec": pod_spec}

    def _service(self, job: Obj, rtype: str, index: int) -> Obj:
        labels = self._labels(job, rtype, index)
        port = self._port(job["spec"]["pytorchReplicaSpecs"][rtype])
        return {"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": f"{job['metadata']['name']}-{rtype.lower()}-{index}",
            "namespace": job["metadata"]["namespace"], "labels": labels,
            "ownerReferences": [self._owner(job)]},
            "spec": {"clusterIP": "None", "selector": labels,
                     "ports": [{"name": PORT_NAME, "port": port}]}}

    # batch/v1 Job -------------------------------------------------------------

    def _reconcile_job(self, job: Obj) -> None:
        meta, spec = job["metadata"], job.get("spec") or {}
        if meta.get("deletionTimestamp"):
            return
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        state = self._state(job)
        status = copy.deepcopy(job.get("status") or {})
        if _finished(status, JOB_KIND):
            self._after_finish(JOB_KIND, job, state)
            return
        if spec.get("suspend"):
            return
        status.setdefault("startTime", now_rfc3339())
        pods = [p for p in self.api.list("pods", ns) if _owned_by(p, uid)]
        live = [p for p in pods if p["status"].get("phase") in ("Pending", "Running")]
        present = {p["metadata"]["uid"] for p in pods}
        state.failed_pods |= {p["metadata"]["uid"] for p in pods
                              if p["status"].get("phase") == "Failed"}
        # A pod that vanished before it finished counts as failed (job tracking finalizers).
        state.failed_pods |= state.launched_pods - present
        failures = len(state.failed_pods)
        if failures:
            status["failed"] = failures
        reason = None
        if self._past_deadline(status, spec.get("activeDeadlineSeconds")):
            reason = ("DeadlineExceeded", "Job was active longer than specified deadline")
        elif failures > int(spec.get("backoffLimit", 6)):
            reason = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        if reason is not None:
            for pod in live:
                self._delete("pods", ns, pod["metadata"]["name"])
            conds = _condition(status.get("conditions") or [], "FailureTarget", *reason)
            status.update(conditions=_condition(conds, "Failed", *reason), active=0, ready=0)
            self._write_status(JOB_KIND, job, status)
            state.finished_at = time.monotonic()
            return
        if not live:
            created = self._create("pods", self._job_pod(job))
            self._track_pod(created)
            if created is not None:
                live = [created]
                state.launched_pods.add(created["metadata"]["uid"])
        running = [p for p in live if p["status"].get("phase") == "Running"]
        status.update(active=len(live), ready=len(running))
        self._write_status(JOB_KIND, job, status)
        for pod in running:
            if pod["metadata"]["uid"] not in state.announced:
                state.announced.add(pod["metadata"]["uid"])
                self._announce(self.on_job_running, self.api.get(JOB_KIND, ns, name) or job)

    def _job_pod(self, job: Obj) -> Obj:
        template = job["spec"].get("template") or {}
        tmeta = template.get("metadata") or {}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": f"{job['metadata']['name']}-",
            "namespace": job["metadata"]["namespace"],
            "labels": dict(tmeta.get("labels") or {}),
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [self._owner(job)]},
            "spec": copy.deepcopy(template.get("spec") or {})}
