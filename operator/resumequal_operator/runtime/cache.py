"""Objects as the watches last saw them, or as the operator last wrote them.

Reconciles read their QualificationRun from an :class:`ObjectCache`, never from the API
server: the watchers (:mod:`.watching`) fill it from a LIST and keep it current from the
WATCH that follows, and the reconciler puts in what its own writes (status, finalizer)
answered, so that the next reconcile starts from the status it wrote even before the watch
delivers that write. The PyTorchJobs and Jobs the operator created (its ``managed-by``
label) are watched into caches of their own, which :class:`CachedReads` serves the
backend's reads of a leg's or the comparator's job from; one not there yet (just created:
the watch has not delivered it) is read from the API server. A cache holds plain objects
and never asks the API server anything.

Which of two versions of a run is newer is decided by ``metadata.resourceVersion``:
resourceVersions of one resource type are comparable integers (KEP-5504, "Comparable
Resource Version", stable since Kubernetes 1.35; client-go's
``apimachinery/pkg/util/resourceversion``). Where a server hands out versions that are not
integers, what the watch says wins, as in client-go's informers, and what the operator
wrote waits for its watch event.

Staying correct:

- **A 410 Gone** (the watch's resourceVersion was compacted away): the watcher lists again
  and :meth:`ObjectCache.replace` installs the listing for its namespace: a run listed is
  taken unless the cache already holds a newer version of it (a write the operator made
  after the listing's snapshot), a run not listed is dropped (it was deleted while the
  watch was down), and the watcher enqueues every key, the dropped ones included, so that
  their reconcile finds no object and forgets their metrics and store references.
  Only the watch thread adds or drops runs (the reconciler's :meth:`ObjectCache.written`
  only replaces a run held by a newer version of it), so a run missing from a listing was
  deleted before it, not created after it.
- **A leader change**: every replica watches, whether it leads or not, so the cache of the
  replica that takes over is warm and current to within the watch's delay; the lease
  passes on no sooner than ``leaseSeconds`` after the old leader's last renewal, and the
  old leader stops reconciling at its renew deadline, before that: the old leader's last
  status writes have reached the new leader's watch long before it reconciles. Should one
  not have (a watch that lags), nothing stale is written: every status and finalizer write
  carries the resourceVersion it was computed from, a 409 re-reads the run and puts it
  into the cache, and what a reconcile does before it writes is idempotent (legs and the
  comparator are created by name, a pod kill is preconditioned on the armed pod's uid, a
  kill order is one object per attempt and rank), as after a status write that was lost.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from resumequal_operator.kube import Kind, Kube, Obj


def key_of(obj: Obj) -> str:
    """``namespace/name`` of an object."""
    m = obj["metadata"]
    return f"{m['namespace']}/{m['name']}"


def _version(obj: Obj) -> int | None:
    rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(rv) if rv.isascii() and rv.isdigit() else None


def newer(a: Obj, b: Obj) -> bool | None:
    """Whether ``a`` is a newer version than ``b`` of one object; None when their
    resourceVersions cannot be compared."""
    va, vb = _version(a), _version(b)
    if va is None or vb is None:
        return None
    return va > vb


class ObjectCache:
    """Objects of one kind by ``namespace/name``, thread-safe. Objects handed out are
    shared: readers must not change them."""

    def __init__(self) -> None:
        self._objs: dict[str, Obj] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._objs)

    def get(self, key: str) -> Obj | None:
        """The newest version known of the object, or None (deleted, or never seen)."""
        return self._objs.get(key)

    def keys(self, namespace: str | None = None) -> list[str]:
        """The objects known in ``namespace`` (None: all)."""
        with self._lock:
            return [k for k in self._objs if namespace is None or _in(k, namespace)]

    def replace(self, namespace: str | None, objs: list[Obj]) -> set[str]:
        """Install a LIST of ``namespace`` (None: all); the keys it dropped."""
        listed = {key_of(o): o for o in objs}
        with self._lock:
            gone = {k for k in self._objs if (namespace is None or _in(k, namespace))
                    and k not in listed}
            for k in gone:
                del self._objs[k]
            for k, obj in listed.items():
                old = self._objs.get(k)
                if old is None or newer(old, obj) is not True:
                    self._objs[k] = obj
        return gone

    def observe(self, obj: Obj) -> tuple[bool, Obj | None]:
        """Take a watch event's object unless a newer version is held: whether it was
        taken, and the version held before (None: the object is new)."""
        k = key_of(obj)
        with self._lock:
            old = self._objs.get(k)
            if old is not None and newer(old, obj) is True:
                return False, old
            self._objs[k] = obj
            return True, old

    def written(self, obj: Obj) -> None:
        """Take the answer to the operator's own write of an object it holds, when it is
        newer than what is held (incomparable versions: the watch brings it)."""
        k = key_of(obj)
        with self._lock:
            old = self._objs.get(k)
            if old is not None and newer(obj, old) is True:
                self._objs[k] = obj

    def forget(self, key: str) -> None:
        """The object was deleted."""
        with self._lock:
            self._objs.pop(key, None)


def _in(key: str, namespace: str) -> bool:
    return key.split("/", 1)[0] == namespace


class CachedReads:
    """GETs of the kinds in ``caches`` answered from them, of any other kind or of an
    object not (yet) cached from the API server. A cached object may be as old as the
    watch's delay, as if it had been read that much earlier."""

    def __init__(self, kube: Kube, caches: Mapping[Kind, ObjectCache]) -> None:
        self.kube, self.caches = kube, caches

    def get(self, kind: Kind, namespace: str, name: str) -> Obj:
        obj = self.cached(kind, namespace, name)
        return obj if obj is not None else self.kube.get(kind, namespace, name)

    def watches(self, kind: Kind) -> bool:
        """Whether objects of ``kind`` are watched into a cache here."""
        return kind in self.caches

    def cached(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        """The object as watched, or None (not watched, or not seen)."""
        cache = self.caches.get(kind)
        return cache.get(f"{namespace}/{name}") if cache is not None else None

    def written(self, kind: Kind, obj: Obj) -> None:
        """What the operator's own write of an object answered (see ObjectCache.written)."""
        cache = self.caches.get(kind)
        if cache is not None:
            cache.written(obj)
