"""A simulated Kubeflow training operator (v1.9, PyTorchJob), Job controller and kubelet.

It runs in-process against a :class:`KubeAPI` on its own thread, level-triggered: after
every change in the emulator it looks at every PyTorchJob, batch/v1 Job and their pods and
moves them along the way the real controllers do. What the containers *do* is the test's:

- ``run_container(container) -> exit code | None`` runs in a thread of its own for every
  pod once its group is running (every pod of a PyTorchJob; the pod of a Job), with the
  job, the pod, the replica index, the attempt and a ``killed`` event that is set when the
  pod is deleted or the elastic agents restart the group. Returning an exit code ends the
  container (0: Succeeded, else Failed); returning None leaves it running; what it returns
  after ``killed`` is ignored.
- or ``on_pods_running(job, attempt)`` / ``on_job_running(job)`` announce that workers run,
  and the test ends them with :meth:`~SimulatedTrainingOperator.succeed` /
  :meth:`~SimulatedTrainingOperator.fail`::

      def workers_up(job, attempt):
          if attempt == 1:                       # restarted after the preemption
              operator.succeed(job["metadata"]["namespace"], job["metadata"]["name"])

PyTorchJob (see :mod:`kubeflow` for pods, labels, env and services):

- status ``startTime``; conditions ``Created`` → ``Running`` once every pod runs. A pod
  that fails or disappears while the job runs → ``Restarting``; the pod is recreated (the
  surviving pods keep running; their agents restart the workers) and the attempt grows
  (``TORCHELASTIC_RESTART_COUNT``) → ``Running``. ``replicaStatuses.<Type>`` counts
  active/succeeded/failed. Success: the Master succeeded, or (no Master) every Worker did.
- restarts count against ``runPolicy.backoffLimit`` (→ ``Failed``/``BackoffLimitExceeded``)
  and ``elasticPolicy.maxRestarts`` (→ ``Failed``/``PyTorchJobFailed``);
  a failure ``restartPolicy`` does not retry (``Never``; ``ExitCode`` below 128) →
  ``Failed``/``PyTorchJobFailed``; ``activeDeadlineSeconds`` → ``Failed``/``DeadlineExceeded``;
  ``cleanPodPolicy`` (default ``None``) on completion; ``ttlSecondsAfterFinished``.
- admission as the operator's webhook (:func:`kubeflow.validate_pytorchjob`).

batch/v1 Job: one pod ``<job>-<random>`` at a time; a pod that fails or vanishes counts as
failed and is replaced until ``backoffLimit`` (→ ``FailureTarget`` + ``Failed``,
``BackoffLimitExceeded``); a pod that succeeds → ``SuccessCriteriaMet`` + ``Complete``;
``activeDeadlineSeconds`` → ``DeadlineExceeded``; ``ttlSecondsAfterFinished``.

Kubelet: pods go from Pending to Running ``start_delay`` seconds after creation; a failed
container is replaced by a new pod rather than restarted in place. Not simulated: suspend,
elastic scaling between min and max replicas, podFailurePolicy, completions > 1.
"""

from __future__ import annotations

import calendar
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import kubeflow
from .api import KubeAPI
from .errors import ApiError
from .objects import Obj, clone, now_rfc3339, parse_rfc3339
from .patch import MERGE

log = logging.getLogger(__name__)

PTJ_KIND = "pytorchjobs.kubeflow.org"
JOB_KIND = "jobs.batch"
CAUSE = "training-operator"  # Deletion.cause of pods this simulation deletes


@dataclass
class Container:
    """One run of a pod's container, handed to ``run_container``."""

    job: Obj
    pod: Obj
    replica_type: str  # Master, Worker, or Job for a batch Job's pod
    index: int  # replica index (a Job's pod: 0)
    attempt: int  # 0, then one more per restart of the group (a Job: per failed pod)
    killed: threading.Event  # SIGTERM/SIGKILL: the pod is being deleted or the group restarts
    exited: threading.Event = field(default_factory=threading.Event)

    @property
    def pod_name(self) -> str:
        """The pod's name."""
        return str(self.pod["metadata"]["name"])

    @property
    def env(self) -> dict[str, str]:
        """The first container's env as the pod has it (template env, then injected)."""
        containers = self.pod["spec"].get("containers") or [{}]
        return {e["name"]: str(e.get("value", "")) for e in containers[0].get("env") or []}

    @property
    def args(self) -> list[str]:
        """The first container's command followed by its args."""
        containers = self.pod["spec"].get("containers") or [{}]
        return [*(containers[0].get("command") or []), *(containers[0].get("args") or [])]


RunContainer = Callable[[Container], "int | None"]
PodsRunning = Callable[[Obj, int], None]
JobRunning = Callable[[Obj], None]


@dataclass
class _Tracked:
    """What the controllers remember about one job between passes."""

    attempt: int = 0
    restarts: int = 0
    launched: bool = False
    notified: int = -1
    started: int = -1  # the attempt whose containers run
    running: dict[str, Container] = field(default_factory=dict)  # pod uid -> container
    launched_pods: set[str] = field(default_factory=set)
    services: set[str] = field(default_factory=set)
    failed_pods: set[str] = field(default_factory=set)
    finished_at: float | None = None

    def kill(self) -> None:
        for container in self.running.values():
            container.killed.set()
        self.running.clear()


def _exit_code(pod: Obj) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (cs.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode"):
            return int(terminated["exitCode"])
    return 1


def _owned_by(pod: Obj, uid: str) -> bool:
    return any(r.get("uid") == uid for r in pod["metadata"].get("ownerReferences") or [])


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def _past_deadline(status: Obj, deadline: Any) -> bool:
    if deadline is None or not status.get("startTime"):
        return False
    started = calendar.timegm(time.strptime(status["startTime"], "%Y-%m-%dT%H:%M:%SZ"))
    return time.time() >= started + float(deadline)


class SimulatedTrainingOperator:
    """PyTorchJob + Job controllers and kubelet for a :class:`KubeAPI` (module docstring).

    Callbacks and containers run on threads of their own, so they may call :meth:`succeed`,
    :meth:`fail` or the API; an exception in one is re-raised by :meth:`stop`.
    """

    def __init__(self, api: KubeAPI, *, run_container: RunContainer | None = None,
                 on_pods_running: PodsRunning | None = None,
                 on_job_running: JobRunning | None = None, start_delay: float = 0.0,
                 webhook: bool = True, graceful: bool = True, tick: float = 0.05) -> None:
        self.api = api
        self.run_container = run_container
        self.on_pods_running = on_pods_running
        self.on_job_running = on_job_running
        self.start_delay = start_delay
        self.graceful = graceful
        self.tick = tick
        self.errors: list[BaseException] = []
        self._lock = threading.RLock()
        self._tracked: dict[str, _Tracked] = {}
        self._start_at: dict[str, float] = {}
        self._pod_containers: dict[str, Container] = {}  # pod uid -> its latest container
        self._callbacks: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]] | None] = (
            queue.Queue())
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._containers: list[threading.Thread] = []
        if webhook:
            api.add_validator(kubeflow.validate_pytorchjob)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> SimulatedTrainingOperator:
        """Start reconciling and running callbacks."""
        self._stopping.clear()
        self.api.store.graceful_pods = self.graceful
        self._threads = [threading.Thread(target=self._loop, name="training-operator",
                                          daemon=True),
                         threading.Thread(target=self._callback_loop, name="training-callbacks",
                                          daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Stop; kill every container; re-raise the first error of a callback or container."""
        self._stopping.set()
        self.api.store.graceful_pods = False
        self._callbacks.put(None)
        with self._lock:
            for state in self._tracked.values():
                state.kill()
        self._wake()
        for thread in self._threads + self._containers:
            thread.join(timeout=5)
        self._threads, self._containers = [], []
        if self.errors:
            raise RuntimeError("the simulated training operator failed") from self.errors[0]

    def __enter__(self) -> SimulatedTrainingOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        store = self.api.store
        while not self._stopping.is_set():
            seen = store.resource_version
            try:
                self.reconcile()
            except Exception as e:
                if self._stopping.is_set():
                    return
                log.exception("the simulated training operator failed")
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
            self._callbacks.put((fn, clone(args)))

    def _wake(self) -> None:
        with self.api.store.changed:
            self.api.store.changed.notify_all()

    # ----------------------------------------------------------------- scripting

    def attempt(self, namespace: str, name: str, kind: str = PTJ_KIND) -> int:
        """The current attempt of a job (0 until its first restart)."""
        job = self._job(namespace, name, kind)
        # No lock: this is meant for KubeAPI.wait_for predicates, which hold the store's lock.
        state = self._tracked.get(job["metadata"]["uid"])
        return state.attempt if state is not None else 0

    def pods(self, namespace: str, name: str, kind: str | None = None) -> list[Obj]:
        """The job's pods as they are now."""
        uid = self._job(namespace, name, kind)["metadata"]["uid"]
        return [p for p in self.api.list("pods", namespace) if _owned_by(p, uid)]

    def succeed(self, namespace: str, name: str, kind: str | None = None) -> None:
        """Every running container of the job exits 0, and the job completes."""
        with self._lock:
            job = self._job(namespace, name, kind)
            for pod in self.pods(namespace, name, self._kind(job)):
                if _phase(pod) in ("Pending", "Running"):
                    self._terminate(pod, 0, "")
            self._reconcile(job)

    def fail(self, namespace: str, name: str, message: str = "worker failed", *,
             exit_code: int = 1, replica: str = "Worker", index: int = 0,
             kind: str | None = None) -> None:
        """One pod's container exits ``exit_code``; the controllers then restart or fail the
        job as they would for a real failure (see the module docstring)."""
        with self._lock:
            job = self._job(namespace, name, kind)
            pods = [p for p in self.pods(namespace, name, self._kind(job))
                    if _phase(p) in ("Pending", "Running")]
            if job["kind"] == "PyTorchJob":
                wanted = kubeflow.pod_name(name, replica, index)
                pods = [p for p in pods if p["metadata"]["name"] == wanted]
            if not pods:
                raise LookupError(f"no live pod to fail for {namespace}/{name}")
            self._terminate(pods[0], exit_code, message)
            self._reconcile(job)

    # ----------------------------------------------------------------- helpers

    def _job(self, namespace: str, name: str, kind: str | None) -> Obj:
        for k in [kind] if kind else [PTJ_KIND, JOB_KIND]:
            job = self.api.get(k, namespace, name)
            if job is not None:
                return job
        raise LookupError(f"no job {namespace}/{name}")

    @staticmethod
    def _kind(job: Obj) -> str:
        return PTJ_KIND if job.get("kind") == "PyTorchJob" else JOB_KIND

    def _state(self, job: Obj) -> _Tracked:
        return self._tracked.setdefault(job["metadata"]["uid"], _Tracked())

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """An API write that tolerates the object having gone (404) or existing (409)."""
        try:
            return fn(*args, **kwargs)
        except ApiError as e:
            if e.code in (404, 409):
                return None
            raise

    def _write_status(self, job: Obj, status: Obj) -> None:
        if status != job.get("status"):
            meta = job["metadata"]
            self._call(self.api.store.patch, self.api.kind(self._kind(job)), meta["namespace"],
                       meta["name"], {"status": status}, MERGE, subresource="status")

    def _patch_pod_status(self, pod: Obj, status: Obj) -> None:
        meta = pod["metadata"]
        self._call(self.api.store.patch, self.api.kind("pods"), meta["namespace"], meta["name"],
                   {"status": status}, MERGE,
                   subresource="status")

    def _delete(self, kind: str, namespace: str, name: str) -> None:
        self._call(self.api.store.delete, self.api.kind(kind), namespace, name,
                   grace_period_seconds=0, propagation_policy="Background", cause=CAUSE)

    def _create_pod(self, pod: Obj) -> Obj | None:
        created: Obj | None = self._call(self.api.store.create, self.api.kind("pods"), None, pod)
        if created is not None:
            self._start_at[created["metadata"]["uid"]] = time.monotonic() + self.start_delay
        return created

    def _terminate(self, pod: Obj, exit_code: int, message: str) -> None:
        """The pod's containers exit with ``exit_code``: Succeeded on 0, Failed otherwise."""
        now = now_rfc3339()
        phase, reason = ("Succeeded", "Completed") if exit_code == 0 else ("Failed", "Error")
        statuses = [{"name": c["name"], "ready": False, "restartCount": 0,
                     "image": c.get("image", ""), "imageID": "",
                     "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                              "message": message, "finishedAt": now,
                                              "startedAt": pod["status"].get("startTime", now)}}}
                    for c in pod["spec"].get("containers") or []]
        status: Obj = {"phase": phase, "containerStatuses": statuses, "conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": now,
             "reason": "PodCompleted" if exit_code == 0 else "PodFailed"}]}
        if message:
            status["message"] = message
        self._patch_pod_status(pod, status)

    # ----------------------------------------------------------------- reconcile

    def reconcile(self) -> None:
        """One level-triggered pass over every job and pod (the thread calls this)."""
        with self._lock:
            live: set[str] = set()
            for kind in (PTJ_KIND, JOB_KIND):
                for job in self.api.list(kind):
                    live.add(job["metadata"]["uid"])
                    self._reconcile(job)
            self._kubelet()
            for uid in set(self._tracked) - live:
                self._tracked.pop(uid).kill()

    def _reconcile(self, job: Obj) -> None:
        current = self.api.get(self._kind(job), job["metadata"]["namespace"],
                               job["metadata"]["name"])
        if current is None or current["metadata"]["uid"] != job["metadata"]["uid"]:
            return
        try:
            if self._kind(current) == PTJ_KIND:
                self._reconcile_pytorchjob(current)
            else:
                self._reconcile_job(current)
        except ApiError as e:
            # A write raced with the test or the controller under test; the next pass retries.
            log.debug("reconcile of %s retried: %s", job["metadata"]["name"], e)

    def _kubelet(self) -> None:
        """Pending pods start ``start_delay`` s after creation; terminating pods stop."""
        now = time.monotonic()
        for pod in self.api.list("pods"):
            meta = pod["metadata"]
            uid = meta["uid"]
            start_at = self._start_at.setdefault(uid, now + self.start_delay)
            if meta.get("deletionTimestamp"):
                self._stop_pod(pod)
                continue
            if _phase(pod) != "Pending" or now < start_at:
                continue
            stamp = now_rfc3339()
            statuses = [{"name": c["name"], "ready": True, "started": True, "restartCount": 0,
                         "image": c.get("image", ""), "imageID": "",
                         "containerID": f"containerd://{uid}",
                         "state": {"running": {"startedAt": stamp}}}
                        for c in pod["spec"].get("containers") or []]
            self._patch_pod_status(pod, {
                "phase": "Running", "startTime": stamp, "hostIP": "192.168.0.1",
                "podIP": f"10.0.{len(self._start_at) // 250}.{len(self._start_at) % 250 + 1}",
                "containerStatuses": statuses,
                "conditions": [{"type": t, "status": "True", "lastTransitionTime": stamp}
                               for t in ("PodScheduled", "Initialized", "ContainersReady",
                                         "Ready")]})

    def _stop_pod(self, pod: Obj) -> None:
        """SIGTERM to the pod's container; the pod goes once it exited or its grace ran out."""
        meta = pod["metadata"]
        container = self._pod_containers.get(meta["uid"])
        if container is not None:
            container.killed.set()
        if (container is None or container.exited.is_set()
                or time.time() >= parse_rfc3339(meta["deletionTimestamp"])):
            self.api.store.finish_termination(self.api.kind("pods"), meta["namespace"],
                                              meta["name"])

    def _after_finish(self, job: Obj, state: _Tracked) -> None:
        state.kill()
        spec = job["spec"]
        ttl = (spec.get("runPolicy") or {}).get("ttlSecondsAfterFinished") \
            if job["kind"] == "PyTorchJob" else spec.get("ttlSecondsAfterFinished")
        if state.finished_at is None:
            state.finished_at = time.monotonic()
        if ttl is not None and time.monotonic() >= state.finished_at + float(ttl):
            self._delete(self._kind(job), job["metadata"]["namespace"], job["metadata"]["name"])

    def _launch(self, job: Obj, state: _Tracked, pods: list[Obj], rtype_of: Callable[[Obj], str],
                index_of: Callable[[Obj], int]) -> None:
        """Start ``run_container`` for every pod of the attempt."""
        if self.run_container is None:
            return
        for pod in pods:
            container = Container(clone(job), clone(pod), rtype_of(pod),
                                  index_of(pod), state.attempt, threading.Event())
            state.running[pod["metadata"]["uid"]] = container
            self._pod_containers[pod["metadata"]["uid"]] = container
            thread = threading.Thread(target=self._run_container, args=(container,),
                                      name=f"container-{container.pod_name}-{state.attempt}",
                                      daemon=True)
            self._containers.append(thread)
            thread.start()

    def _run_container(self, container: Container) -> None:
        assert self.run_container is not None
        try:
            code = self.run_container(container)
        except Exception as e:
            log.exception("container %s failed", container.pod_name)
            self.errors.append(e)
            code = 1
        finally:
            container.exited.set()
        self._wake()
        with self._lock:
            if code is None or container.killed.is_set() or self._stopping.is_set():
                return
            pod = self.api.get("pods", container.pod["metadata"]["namespace"],
                               container.pod_name)
            if pod is None or pod["metadata"]["uid"] != container.pod["metadata"]["uid"]:
                return
            self._terminate(pod, int(code), "" if code == 0 else f"exit code {code}")
        self._wake()

    # PyTorchJob ---------------------------------------------------------------

    def _reconcile_pytorchjob(self, job: Obj) -> None:
        meta, spec = job["metadata"], job["spec"]
        if meta.get("deletionTimestamp"):
            return
        ns, name, uid = meta["namespace"], meta["name"], meta["uid"]
        state = self._state(job)
        status = clone(job.get("status") or {})
        if kubeflow.is_true(status, "Succeeded") or kubeflow.is_true(status, "Failed"):
            self._after_finish(job, state)
            return
        run_policy = spec.get("runPolicy") or {}
        if not any(c.get("type") == "Created" for c in status.get("conditions") or []):
            status["conditions"] = kubeflow.set_condition(
                status.get("conditions") or [], "Created", "PyTorchJobCreated",
                f"PyTorchJob {name} is created.")
        status.setdefault("startTime", now_rfc3339())
        status.setdefault("replicaStatuses", {})
        if _past_deadline(status, run_policy.get("activeDeadlineSeconds")):
            self._finish_pytorchjob(job, status, "Failed", "DeadlineExceeded",
                                    f"PyTorchJob {name} has failed because it was active "
                                    "longer than specified deadline")
            return
        expected = kubeflow.replicas(job)
        pods = {p["metadata"]["name"]: p for p in self.api.list("pods", ns) if _owned_by(p, uid)}
        wanted = [kubeflow.pod_name(name, rtype, i) for rtype, i in expected]
        failed = [p for p in pods.values() if _phase(p) == "Failed"]
        missing = [n for n in wanted if n not in pods]
        if state.launched and (failed or missing):
            lost = failed[0]["metadata"]["labels"].get(kubeflow.REPLICA_TYPE, "worker") \
                if failed else missing[0].rsplit("-", 2)[-2]
            count = len(failed) + len(missing)
            permanent = [p for p in failed if not kubeflow.retryable(
                job, p["metadata"]["labels"].get(kubeflow.REPLICA_TYPE, "worker"),
                _exit_code(p))]
            if permanent:
                self._finish_pytorchjob(job, status, "Failed", "PyTorchJobFailed",
                                        f"PyTorchJob {name} is failed because {len(permanent)} "
                                        f"{lost.capitalize()} replica(s) failed.")
                return
            state.restarts += 1
            limit = run_policy.get("backoffLimit")
            if limit is not None and state.restarts > int(limit):
                self._finish_pytorchjob(job, status, "Failed", "BackoffLimitExceeded",
                                        f"PyTorchJob {name} has failed because it has reached "
                                        "the specified backoff limit")
                return
            max_restarts = (spec.get("elasticPolicy") or {}).get("maxRestarts")
            if max_restarts is not None and state.restarts > int(max_restarts):
                # The torch elastic agents give up and exit non-zero on every pod.
                self._finish_pytorchjob(job, status, "Failed", "PyTorchJobFailed",
                                        f"PyTorchJob {name} is failed because the elastic "
                                        f"agents exhausted maxRestarts ({max_restarts}).")
                return
            state.kill()  # the elastic agents stop every worker of the group
            state.attempt += 1
            status["conditions"] = kubeflow.set_condition(
                status["conditions"], "Restarting", "PyTorchJobRestarting",
                f"PyTorchJob {name} is restarting because {count} {lost.capitalize()} "
                "replica(s) failed.")
            for pod in failed:
                self._delete("pods", ns, pod["metadata"]["name"])
                pods.pop(pod["metadata"]["name"])
        for rtype, i in expected:
            pod_name = kubeflow.pod_name(name, rtype, i)
            if pod_name not in pods and (created := self._create_pod(
                    kubeflow.replica_pod(job, rtype, i))) is not None:
                pods[pod_name] = created
            if pod_name not in state.services:
                self._call(self.api.store.create, self.api.kind("services"), None,
                           kubeflow.replica_service(job, rtype, i))
                state.services.add(pod_name)
        state.launched = True
        status["replicaStatuses"] = kubeflow.replica_statuses(job, list(pods.values()))
        group = [pods[n] for n in wanted if n in pods]
        if self._pytorchjob_succeeded(job, group):
            self._finish_pytorchjob(job, status, "Succeeded", "PyTorchJobSucceeded",
                                    f"PyTorchJob {name} is successfully completed.")
            return
        all_running = len(group) == len(wanted) and all(_phase(p) == "Running" for p in group)
        if all_running:
            status["conditions"] = kubeflow.set_condition(
                status["conditions"], "Running", "PyTorchJobRunning",
                f"PyTorchJob {name} is running.")
        self._write_status(job, status)
        if all_running and state.started < state.attempt:
            state.started = state.attempt
            self._launch(job, state, group,
                         lambda p: p["metadata"]["labels"][kubeflow.REPLICA_TYPE].capitalize(),
                         lambda p: int(p["metadata"]["labels"][kubeflow.REPLICA_INDEX]))
        if all_running and state.notified < state.attempt:
            state.notified = state.attempt
            self._announce(self.on_pods_running, self.api.get(PTJ_KIND, ns, name) or job,
                           state.attempt)

    @staticmethod
    def _pytorchjob_succeeded(job: Obj, group: list[Obj]) -> bool:
        masters = [p for p in group
                   if p["metadata"]["labels"].get(kubeflow.REPLICA_TYPE) == "master"]
        if masters:
            return all(_phase(p) == "Succeeded" for p in masters)
        return bool(group) and len(group) == len(kubeflow.replicas(job)) and all(
            _phase(p) == "Succeeded" for p in group)

    def _finish_pytorchjob(self, job: Obj, status: Obj, ctype: str, reason: str,
                           message: str) -> None:
        meta = job["metadata"]
        state = self._state(job)
        state.kill()
        status["conditions"] = kubeflow.set_condition(status.get("conditions") or [], ctype,
                                                      reason, message)
        status["completionTime"] = now_rfc3339()
        pods = [p for p in self.api.list("pods", meta["namespace"]) if _owned_by(p, meta["uid"])]
        status["replicaStatuses"] = kubeflow.replica_statuses(job, pods)
        self._write_status(job, status)
        state.finished_at = time.monotonic()
        policy = (job["spec"].get("runPolicy") or {}).get("cleanPodPolicy", "None")
        for pod in pods:
            running = _phase(pod) in ("Pending", "Running")
            if policy == "All" or (policy == "Running" and running):
                self._delete("pods", meta["namespace"], pod["metadata"]["name"])
                self._delete("services", meta["namespace"], pod["metadata"]["name"])

    # batch/v1 Job -------------------------------------------------------------

    def _reconcile_job(self, job: Obj) -> None:
        meta, spec = job["metadata"], job["spec"]
        if meta.get("deletionTimestamp") or spec.get("suspend"):
            return
        ns, uid = meta["namespace"], meta["uid"]
        state = self._state(job)
        status = clone(job.get("status") or {})
        if kubeflow.is_true(status, "Complete") or kubeflow.is_true(status, "Failed"):
            self._after_finish(job, state)
            return
        status.setdefault("startTime", now_rfc3339())
        pods = [p for p in self.api.list("pods", ns) if _owned_by(p, uid)]
        live = [p for p in pods if _phase(p) in ("Pending", "Running")]
        present = {p["metadata"]["uid"] for p in pods}
        state.failed_pods |= {p["metadata"]["uid"] for p in pods if _phase(p) == "Failed"}
        # A pod that vanished before it finished counts as failed (job tracking finalizers).
        state.failed_pods |= state.launched_pods - present
        if state.failed_pods:
            status["failed"] = len(state.failed_pods)
        probe = {"probe_key": "lastProbeTime"}
        if any(_phase(p) == "Succeeded" for p in pods):
            done = "Reached expected number of succeeded pods"
            conds = kubeflow.set_condition(status.get("conditions") or [], "SuccessCriteriaMet",
                                           "CompletionsReached", done, **probe)
            status.update(conditions=kubeflow.set_condition(conds, "Complete",
                                                            "CompletionsReached", done, **probe),
                          active=0, ready=0, succeeded=1, completionTime=now_rfc3339())
            self._write_status(job, status)
            self._after_finish(job, state)
            return
        reason = None
        if _past_deadline(status, spec.get("activeDeadlineSeconds")):
            reason = ("DeadlineExceeded", "Job was active longer than specified deadline")
        elif len(state.failed_pods) > int(spec.get("backoffLimit", 6)):
            reason = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        if reason is not None:
            for pod in live:
                self._delete("pods", ns, pod["metadata"]["name"])
            conds = kubeflow.set_condition(status.get("conditions") or [], "FailureTarget",
                                           *reason, **probe)
            status.update(conditions=kubeflow.set_condition(conds, "Failed", *reason, **probe),
                          active=0, ready=0)
            self._write_status(job, status)
            self._after_finish(job, state)
            return
        if not live and (created := self._create_pod(kubeflow.job_pod(job))) is not None:
            live = [created]
            state.launched_pods.add(created["metadata"]["uid"])
            state.attempt = len(state.failed_pods)
        running = [p for p in live if _phase(p) == "Running"]
        status.update(active=len(live), ready=len(running))
        self._write_status(job, status)
        for pod in running:
            if pod["metadata"]["uid"] not in state.running and state.started < state.attempt:
                state.started = state.attempt
                self._launch(job, state, [pod], lambda p: "Job", lambda p: 0)
            if state.notified < state.attempt:
                state.notified = state.attempt
                self._announce(self.on_job_running, self.api.get(JOB_KIND, ns, meta["name"])
                               or job)
