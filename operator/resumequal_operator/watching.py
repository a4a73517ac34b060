"""List-then-watch of QualificationRuns in one namespace (or all), feeding the work queue.

A watcher lists (which gives a resourceVersion), enqueues every run, then watches from
that version. When the server says 410 Gone (the version was compacted away) it lists
again and enqueues every run, including those that disappeared meanwhile, so their
metrics and store references are dropped: a level-triggered reconcile needs only keys.
A status-only change does not enqueue (the operator wrote it; its own requeue follows the
run), so status writes do not feed back into reconciles.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from resumequal.errors import ClusterError
from resumequal_operator.kube import QUALIFICATION_RUNS, Gone, Kube, Obj

log = logging.getLogger(__name__)


def key_of(obj: Obj) -> str:
    m = obj["metadata"]
    return f"{m['namespace']}/{m['name']}"


def _trigger(obj: Obj) -> tuple[Any, ...]:
    """What a reconcile must see change: not the status, which the operator writes."""
    m = obj.get("metadata") or {}
    return (m.get("uid"), m.get("generation"), m.get("deletionTimestamp"),
            tuple(m.get("finalizers") or ()), bool(obj.get("status")))


class Watcher:
    """Keeps the keys (and triggers) of the runs in ``namespace`` (None: all namespaces)."""

    def __init__(self, kube: Kube, namespace: str | None, enqueue: Callable[[str], None], *,
                 timeout_seconds: int = 60, retry_seconds: float = 1.0) -> None:
        self.kube, self.namespace, self.enqueue = kube, namespace, enqueue
        self.timeout_seconds, self.retry_seconds = timeout_seconds, retry_seconds
        self.synced = threading.Event()
        self.relists = 0
        self._known: dict[str, tuple[Any, ...]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread: threading.Thread | None = None

    @property
    def where(self) -> str:
        return self.namespace or "all namespaces"

    def runs(self) -> list[str]:
        """Keys of the runs seen so far."""
        with self._lock:
            return list(self._known)

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
                for event in self.kube.watch(QUALIFICATION_RUNS, self.namespace, version,
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
        listing = self.kube.list(QUALIFICATION_RUNS, self.namespace)
        items = listing.get("items") or []
        current = {key_of(o): _trigger(o) for o in items}
        with self._lock:
            gone = set(self._known) - set(current)
            self._known = current
        if self.synced.is_set():
            self.relists += 1
        for key in [*current, *gone]:
            self.enqueue(key)
        self.synced.set()
        log.info("listed %d QualificationRun(s) in %s", len(items), self.where)
        return str(listing["metadata"]["resourceVersion"])

    def _handle(self, event: Obj) -> str | None:
        kind, obj = event.get("type"), event.get("object") or {}
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK" or not (obj.get("metadata") or {}).get("name"):
            return str(version) if version else None
        key = key_of(obj)
        with self._lock:
            if kind == "DELETED":
                self._known.pop(key, None)
                changed = True
            else:
                trigger = _trigger(obj)
                changed = self._known.get(key) != trigger
                self._known[key] = trigger
        if changed:
            self.enqueue(key)
        return str(version) if version else None
