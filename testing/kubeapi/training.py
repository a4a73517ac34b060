"""The simulated cluster side: Kubeflow training operator v1.9 (PyTorchJob), batch/v1 Job
controller and kubelet, on one thread against a :class:`KubeAPI`. TrainJobs are not run
here: the real Trainer and JobSet run them in the local cluster (:mod:`testing.cluster`).

    SimulatedTrainingOperator(api, run_container=fn)          # scripted containers
    SimulatedTrainingOperator(api, runtime=ProcessRuntime(dir)) # real processes

Each pass looks at what changed in the emulator since the last one. PyTorchJobs are
reconciled only when an event about them or one of their pods arrived (see
:mod:`.training_operator`: no timed requeues upstream); Jobs and the kubelet run every pass
(``tick`` s at most apart), their timers being real. What each part does, and the upstream
file it follows: :mod:`.training_operator` and :mod:`.kubeflow` (PyTorchJob),
:mod:`.job_controller` (Job), :mod:`.kubelet` (pods and signals), :mod:`.scripted` and
:mod:`.processes` (what runs in a container).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from . import kubeflow
from .api import KubeAPI
from .errors import ApiError
from .job_controller import JobController
from .kubelet import Kubelet, Runtime
from .recorder import Recorder
from .scripted import Container, Round, RunContainer, ScriptedRuntime, hold
from .training_operator import KIND as PTJ_KIND
from .training_operator import PyTorchJobController

log = logging.getLogger(__name__)

Obj = dict[str, Any]
JOB_KIND = "jobs.batch"
# What wakes a pass before its tick: the kinds these controllers' informers watch. The
# training operator: PyTorchJobs, their pods and Services (training-operator
# pkg/controller.v1/pytorch/pytorchjob_controller.go SetupWithManager; this double makes no
# Services); the Job controller: Jobs and pods (kubernetes pkg/controller/job/
# job_controller.go NewController); the kubelet: pods. Events,
# Secrets, QualificationRuns and Leases wake none of them; what the kubelet reads of a
# Secret it retries on its own timer.
WATCHED = frozenset({PTJ_KIND, "pods", JOB_KIND})

__all__ = ["Container", "Round", "SimulatedTrainingOperator"]


class SimulatedTrainingOperator:
    """The controllers and the kubelet (module docstring); ``errors`` keeps what failed in
    them or in a scripted container, re-raised by :meth:`stop`; ``warnings`` the
    webhook's admission warnings (which a real server sends as HTTP Warning headers)."""

    def __init__(self, api: KubeAPI, *, run_container: RunContainer | None = None,
                 runtime: Runtime | None = None, start_delay: float = 0.0,
                 webhook: bool = True, tick: float = 0.05) -> None:
        if run_container is not None and runtime is not None:
            raise ValueError("give run_container (scripted) or runtime, not both")
        self.api, self.tick = api, tick
        self.runtime: Runtime = runtime or ScriptedRuntime(run_container or hold)
        self.errors: list[BaseException] = []
        self.warnings: list[str] = []
        store = api.store
        self.pytorchjobs = PyTorchJobController(store, Recorder(store, "pytorchjob-controller"))
        self.jobs = JobController(store)
        self.kubelet = Kubelet(store, self.runtime, self._wake, start_delay=start_delay)
        self._seen = -1
        self._retry: set[str] = set()
        self._stopping = threading.Event()
        self._changed = store.changed_for(WATCHED)
        self._thread: threading.Thread | None = None
        if webhook:
            api.add_validator(self._webhook, {"PyTorchJob"})

    def _webhook(self, obj: Obj) -> str | None:
        error, warnings = kubeflow.webhook(obj)
        self.warnings += [w for w in warnings if w not in self.warnings]
        return error

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> SimulatedTrainingOperator:
        """Start reconciling on a thread of its own."""
        self._stopping.clear()
        self.api.store.graceful_pods = True  # a kubelet now ends running pods
        self._thread = threading.Thread(target=self._loop, name="training-operator",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop, kill every container, re-raise the first error of a controller or container."""
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.kubelet.close()
        self.api.store.graceful_pods = False
        errors = self.errors + list(getattr(self.runtime, "errors", []))
        if errors:
            raise RuntimeError("the simulated cluster failed") from errors[0]

    def __enter__(self) -> SimulatedTrainingOperator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def pods(self, namespace: str, job: str) -> list[Obj]:
        """The pods of a PyTorchJob or Job (by its controllers' labels) as they are now."""
        return [p for p in self.api.list("pods", namespace)
                if job in (p["metadata"]["labels"].get(kubeflow.JOB_NAME),
                           p["metadata"]["labels"].get("batch.kubernetes.io/job-name"))]

    # ----------------------------------------------------------------- the loop

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _loop(self) -> None:
        store = self.api.store
        while not self._stopping.is_set():
            seen = store.resource_version
            try:
                self.reconcile()
            except Exception as e:
                log.exception("the simulated cluster failed")
                self.errors.append(e)
                return
            store.wait_for(lambda last=seen: (  # type: ignore[misc]
                self._stopping.is_set() or store.resource_version != last), self.tick,
                kinds=WATCHED)

    def reconcile(self) -> None:
        """One pass: PyTorchJobs with news, every Job, the kubelet."""
        store = self.api.store
        with store.lock:
            # Newest first, back to the last pass: not the whole retained history.
            history = []
            for e in reversed(store._history):
                if e.rv <= self._seen:
                    break
                history.append(e)
            relist = self._seen < store._compacted
            self._seen = store.resource_version
        dirty = {e.object["metadata"]["uid"] for e in history if e.kind_key == PTJ_KIND}
        dirty |= {r["uid"] for e in history if e.kind_key == "pods"
                  for obj in (e.object, e.old) if obj is not None
                  for r in obj["metadata"].get("ownerReferences") or []
                  if r.get("kind") == "PyTorchJob" and r.get("controller")}
        dirty, self._retry = dirty | self._retry, set()
        # Only those with news are read, as stored (the reconcile reads them as from its
        # informer's cache, and copies what it defaults): a controller-runtime reconcile
        # gets one key from its queue, not a list of all.
        jobs = (self.api.list(PTJ_KIND) if relist
                else self.api.store.with_uids(self.api.kind(PTJ_KIND), dirty))
        for job in jobs:
            if relist or job["metadata"]["uid"] in dirty:
                self._guarded(self.pytorchjobs.reconcile, job)
        # Every Job, each pass (its timers are real), read as stored, not copied, as the Job
        # controller reads its informer's cache (it changes Jobs only through the store).
        jobs = self.api.store.snapshot(self.api.kind(JOB_KIND), None, None)[0]
        for job in jobs:
            self._guarded(self.jobs.reconcile, job)
        self.jobs.forget({j["metadata"]["uid"] for j in jobs})
        self.kubelet.sync()

    def _guarded(self, fn: Any, job: Obj) -> None:
        try:
            fn(job)
        except ApiError as e:  # controller-runtime requeues a reconcile that failed
            log.debug("reconcile of %s retried: %s", job["metadata"]["name"], e)
            self._retry.add(job["metadata"]["uid"])
