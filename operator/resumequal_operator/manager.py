"""The running operator: watchers, a work queue, workers, leader election, one HTTP port.

Every replica watches into its :class:`~.cache.ObjectCache`, which reconciles read runs from
(so a standby's cache is warm), but only the leader's workers take keys from the queue; a
replica that becomes leader enqueues every run it knows. Runs that are not finished are
looked at again every ``poll_seconds`` (progress lives in the store, which sends no
events), every run every ``resync_seconds``. A concluded run that a listing, a resync or a
new leadership enqueues waits behind every change and requeue (low priority, see
:mod:`.workqueue`); one in flight or being deleted does not.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from resumequal.errors import ResumequalError
from resumequal_operator import pytorchjob
from resumequal_operator.allowlist import Allowlist
from resumequal_operator.controller import Reconciler
from resumequal_operator.events import EventRecorder
from resumequal_operator.kube import Kube
from resumequal_operator.legjobs import TrainerSettings, job_kinds
from resumequal_operator.opmetrics import OperatorMetrics
from resumequal_operator.resource import Backend
from resumequal_operator.runkeys import MasterKey
from resumequal_operator.runtime.cache import CachedReads, ObjectCache
from resumequal_operator.runtime.health import HealthServer
from resumequal_operator.runtime.leader import LeaderElector, LeaseSettings
from resumequal_operator.runtime.watching import Watcher
from resumequal_operator.runtime.workqueue import ShutDown, WorkQueue

log = logging.getLogger(__name__)


def default_identity() -> str:
    """POD_NAME in a cluster; elsewhere the host name plus a random suffix."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class Settings:
    """How the operator runs. ``namespaces`` empty: every namespace."""

    namespaces: tuple[str, ...] = ()
    port: int = 8080
    host: str = "0.0.0.0"
    leader_elect: bool = True
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    identity: str = field(default_factory=default_identity)
    resync_seconds: float = 60.0
    workers: int = 2
    # Store progress (beacons, steps) has no events: a running run is read this often.
    # 2 s keeps the arm-to-kill delay well under the default arm timeout (60 s).
    poll_seconds: float = 2.0
    # Kubernetes ends watches after 5-10 min on its own; 60 s bounds how stale a broken
    # connection that no error reports can leave the cache.
    watch_timeout_seconds: int = 60
    # How long the finalizer of a deleted run keeps trying to delete its store artifacts
    # (retention Delete) before it lets the run go with a Warning Event: a bucket that is
    # gone or unreachable must not keep a resource from being deleted for ever. Five
    # minutes outlast an endpoint's restart and the client's own retries many times over.
    cleanup_seconds: float = 300.0
    # What runs may name (images, service accounts, buckets, endpoints); see allowlist.
    allowlist: Allowlist = field(default_factory=Allowlist)
    # A NetworkPolicy per leg admitting only the leg's own pods: the c10d rendezvous store
    # unpickles what it is sent, so whoever reaches a leg's pods could run code in them.
    network_policies: bool = True
    # What runs a run's legs when its spec.backend is unset; TrainJobs only with ``trainer``
    # (the runtime they name), where Kubeflow Trainer v2 is installed.
    default_backend: Backend = "pytorchjob"
    trainer: TrainerSettings | None = None
    # Makes each run's key (:mod:`.runkeys`); None: one for this process's lifetime, so a
    # restart leaves the runs in flight unable to authenticate what they wrote.
    master_key: MasterKey | None = None


class Operator:
    """Start, serve, stop. ``registry`` defaults to a fresh one (tests read it)."""

    def __init__(self, kube: Kube, settings: Settings,
                 registry: CollectorRegistry | None = None) -> None:
        self.kube, self.settings = kube, settings
        self.registry = registry or CollectorRegistry()
        self.metrics = OperatorMetrics(self.registry)
        kube.observe = self.metrics.api_requested
        self.queue = WorkQueue(on_wait=self.metrics.queue_waited)
        self.metrics.watch_queue(lambda: len(self.queue))
        self.cache = ObjectCache()
        # The jobs it created, by the label it gives them: read by the backend every tick.
        owned = {kind: ObjectCache() for kind in job_kinds(settings.trainer)}
        # Events are written by a thread of the recorder's own, never on a reconcile's path.
        self.events = EventRecorder(
            kube, settings.identity,
            dropped=lambda cause: self.metrics.events_dropped.labels(cause=cause).inc())
        self.reconciler = Reconciler(kube, self.metrics, self.events, cache=self.cache,
                                     reads=CachedReads(kube, owned),
                                     poll_seconds=settings.poll_seconds,
                                     cleanup_seconds=settings.cleanup_seconds,
                                     allowlist=settings.allowlist,
                                     network_policies=settings.network_policies,
                                     default_backend=settings.default_backend,
                                     trainer=settings.trainer,
                                     master_key=settings.master_key)
        namespaces: Sequence[str | None] = settings.namespaces or (None,)
        self.watchers = [Watcher(kube, ns, self.queue.add, enqueue_low=self._enqueue_known,
                                 cache=self.cache,
                                 timeout_seconds=settings.watch_timeout_seconds)
                         for ns in namespaces]
        managed = f"{pytorchjob.MANAGED_BY}={pytorchjob.OPERATOR}"
        self.owned_watchers = [Watcher(kube, ns, None, cache=cache, kind=kind, labels=managed,
                                       timeout_seconds=settings.watch_timeout_seconds)
                               for kind, cache in owned.items() for ns in namespaces]
        self.elector: LeaderElector | None = None
        self._leading = threading.Event()
        if settings.leader_elect:
            self.elector = LeaderElector(kube, settings.identity, settings.lease,
                                         on_change=self._leadership)
        else:
            self._leadership(True)
        self.health = HealthServer(self.registry, self._healthy, self._ready,
                                   port=settings.port, host=settings.host)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.reconciles = 0  # by this replica, for tests and logs

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.health.start()
        for w in [*self.watchers, *self.owned_watchers]:
            w.start()
        if self.elector is not None:
            self.elector.start()
        for i in range(self.settings.workers):
            self._spawn(self._work, f"worker-{i}")
        self._spawn(self._resync, "resync")
        log.info("operator %s started (%s; leader election %s)", self.settings.identity,
                 ", ".join(w.where for w in self.watchers),
                 "on" if self.elector else "off")

    def _spawn(self, target: object, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)  # type: ignore[arg-type]
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        """Stop taking work, finish the reconciles in flight, write the Events they
        recorded, release the Lease."""
        self._stop.set()
        self.queue.shutdown()
        for t in self._threads:
            t.join(timeout=30)
        self.events.stop()
        for w in [*self.watchers, *self.owned_watchers]:
            w.stop()
        if self.elector is not None:
            self.elector.stop(release=True)
        self.health.stop()
        log.info("operator %s stopped", self.settings.identity)

    def run_until(self, stop: threading.Event) -> None:
        """Start, block until ``stop`` is set (SIGTERM), stop."""
        self.start()
        try:
            stop.wait()
        finally:
            self.stop()

    # -- leadership, health --------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    def _leadership(self, leading: bool) -> None:
        self.metrics.leader.set(1 if leading else 0)
        if leading:
            self._leading.set()
            for w in self.watchers:
                for key in w.runs():
                    self._enqueue_known(key)
        else:
            self._leading.clear()

    def _enqueue_known(self, key: str) -> None:
        """A run a listing, a resync or a new leadership brings, not a change: behind the
        changes if it has concluded; as a change if not (a poll, a kill, a deletion may be
        due, and the requeues that would bring them live in another replica or process)."""
        obj = self.cache.get(key)
        meta, status = (obj or {}).get("metadata") or {}, (obj or {}).get("status") or {}
        concluded = obj is not None and not meta.get("deletionTimestamp") and \
            status.get("phase") in ("Succeeded", "Failed")
        self.queue.add(key, low=concluded)

    def _healthy(self) -> str | None:
        dead = [w.where for w in [*self.watchers, *self.owned_watchers] if not w.alive]
        if dead and not self._stop.is_set():
            return f"watch of {', '.join(dead)} stopped"
        return None

    def _ready(self) -> str | None:
        unsynced = [w.where for w in [*self.watchers, *self.owned_watchers]
                    if not w.synced.is_set()]
        if unsynced:
            return f"cache of {', '.join(unsynced)} not synced"
        if self.elector is not None and not self.elector.known.is_set():
            return "leader state not known yet"
        return None

    # -- work ----------------------------------------------------------------------------

    def _work(self) -> None:
        while not self._stop.is_set():
            if not self._leading.wait(0.5):
                continue
            try:
                key = self.queue.get(timeout=0.5)
            except ShutDown:
                return
            if key is None:
                continue
            try:
                if not self.is_leader:
                    self.queue.add(key)  # back for whoever leads next (done() requeues it)
                    continue
                self._process(key)
            finally:
                self.queue.done(key)

    def _process(self, key: str) -> None:
        start = time.perf_counter()
        try:
            again = self.reconciler.reconcile(key)
        except ResumequalError as e:
            delay = self.queue.add_rate_limited(key)
            self.metrics.errors.inc()
            self.metrics.reconcile.labels(result="error").inc()
            log.warning("reconcile %s failed (retry in %.2fs): %s", key, delay, e)
        except Exception:
            delay = self.queue.add_rate_limited(key)
            self.metrics.errors.inc()
            self.metrics.reconcile.labels(result="error").inc()
            log.exception("reconcile %s failed unexpectedly (retry in %.2fs)", key, delay)
        else:
            self.queue.forget(key)
            if again is not None:
                self.queue.add_after(key, again)
            self.metrics.reconcile.labels(result="requeue" if again else "success").inc()
        finally:
            self.reconciles += 1
            self.metrics.duration.observe(time.perf_counter() - start)

    def _resync(self) -> None:
        while not self._stop.wait(self.settings.resync_seconds):
            if not self.is_leader:
                continue
            for w in self.watchers:
                for key in w.runs():
                    self._enqueue_known(key)
