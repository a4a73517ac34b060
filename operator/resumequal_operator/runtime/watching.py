"""List-then-watch of QualificationRuns in one namespace (or all), feeding the run cache
and the work queue.

A watcher lists (which gives a resourceVersion), puts every run into its
:class:`~resumequal_operator.runtime.cache.ObjectCache`, enqueues it, then watches from that
version, each event updating the cache. When the server says 410 Gone (the version was
compacted away) it lists again and enqueues every run, including those that disappeared
meanwhile, so their metrics and store references are dropped (see :mod:`.cache` for why
the cache stays correct). What a listing shows unchanged (everything, the first time) goes
at low priority (``enqueue_low``): behind the changes. A status-only change does not
enqueue (the operator wrote it; its own requeue follows the run), so status writes do not
feed back into reconciles.

The same watcher, given another kind and a label selector, keeps the PyTorchJobs and Jobs
the operator created in caches of their own, enqueuing nothing: the backend reads them
from there (:class:`~resumequal_operator.runtime.cache.CachedReads`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from resumequal.errors import ClusterError
from resumequal_operator.kube import QUALIFICATION_RUNS, Gone, Kind, Kube, Obj
from resumequal_operator.runtime.cache import ObjectCache, key_of

log = logging.getLogger(__name__)


def _version(obj: Obj | None) -> str | None:
    return None if obj is None else (obj.get("metadata") or {}).get("resourceVersion")


def _trigger(obj: Obj) -> tuple[Any, ...]:
    """What a reconcile must see change: not the status, which the operator writes."""
    m = obj.get("metadata") or {}
    return (m.get("uid"), m.get("generation"), m.get("deletionTimestamp"),
            tuple(m.get("finalizers") or ()), bool(obj.get("status")))


class Watcher:
    """Keeps the runs in ``namespace`` (None: all namespaces) in ``cache``, enqueuing their
    keys; or, with ``kind`` and ``labels``, those objects of another kind, enqueuing
    nothing (``enqueue`` None)."""

    def __init__(self, kube: Kube, namespace: str | None,
                 enqueue: Callable[[str], None] | None, *, cache: ObjectCache,
                 enqueue_low: Callable[[str], None] | None = None,
                 kind: Kind = QUALIFICATION_RUNS, labels: str | None = None,
                 timeout_seconds: int = 60, retry_seconds: float = 1.0) -> None:
        self.kube, self.namespace = kube, namespace
        self.enqueue: Callable[[str], None] = enqueue or (lambda key: None)
        # A listing's runs that it shows unchanged (all of the first one): behind changes.
        self.enqueue_low: Callable[[str], None] = enqueue_low or self.enqueue
        self.cache, self.kind, self.labels = cache, kind, labels
        self.timeout_seconds, self.retry_seconds = timeout_seconds, retry_seconds
        self.synced = threading.Event()
        self.relists = 0
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        where = self.namespace or "all namespaces"
        return where if self.kind == QUALIFICATION_RUNS else f"{self.kind.plural} in {where}"

    def runs(self) -> list[str]:
        """Keys of the runs seen so far."""
        return self.cache.keys(self.namespace)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.where}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        resp = self._resp
        if resp is not None:
            # Unblocks the watch thread's read; the socket may be closed already.
            with contextlib.suppress(Exception):
                resp.shutdown() if hasattr(resp, "shutdown") else resp.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                for event in self.kube.watch(self.kind, self.namespace, version,
                                             labels=self.labels,
                                             timeout_seconds=self.timeout_seconds,
                                             stop=self._stop, on_open=self._opened):
                    version = self._handle(event) or version
            except Gone:
                log.info("watch of %s: resourceVersion %s expired; listing again", self.where,
                         version)
                version = None
            except ClusterError as e:
                if self._stop.is_set():
                    return
                log.warning("watch of %s: %s; retrying in %gs", self.where, e,
                            self.retry_seconds)
                self._stop.wait(self.retry_seconds)
            finally:
                self._resp = None

    def _opened(self, resp: Any) -> None:
        self._resp = resp

    def _list(self) -> str:
        listing = self.kube.list(self.kind, self.namespace, labels=self.labels)
        items = listing.get("items") or []
        first = not self.synced.is_set()
        # What the cache held before: a relist (after a 410) enqueues what changed or went
        # meanwhile as a watch event would, the rest at low priority.
        held = {} if first else {key_of(o): _version(self.cache.get(key_of(o)))
                                 for o in items}
        gone = self.cache.replace(self.namespace, items)
        if not first:
            self.relists += 1
        for obj in items:
            key = key_of(obj)
            before = held.get(key)  # None: not held (new since the watch broke)
            if first or (before is not None and before == _version(obj)):
                self.enqueue_low(key)
            else:
                self.enqueue(key)
        for key in gone:
            self.enqueue(key)
        self.synced.set()
        log.info("listed %d %s in %s", len(items), self.kind.plural,
                 self.namespace or "all namespaces")
        return str(listing["metadata"]["resourceVersion"])

    def _handle(self, event: Obj) -> str | None:
        kind, obj = event.get("type"), event.get("object") or {}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK" or not (obj.get("metadata") or {}).get("name"):
            return str(version) if version else None
        key = key_of(obj)
        if kind == "DELETED":
            self.cache.forget(key)
            changed = True
        else:
            taken, old = self.cache.observe(obj)
            changed = taken and (old is None or _trigger(old) != _trigger(obj))
        if changed:
            self.enqueue(key)
        return str(version) if version else None
