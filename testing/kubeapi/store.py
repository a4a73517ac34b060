"""Object state: resourceVersion, generation, status subresource, finalizers, garbage collection.

One re-entrant lock guards everything; ``changed`` (a condition on that lock) is notified
on every commit so ``wait_for`` wakes up, and the condition of :meth:`changed_for` on a
commit of one of its kinds only, so a watch stream or a simulated controller wakes for its
own kinds' events. Stored objects are never mutated in place: every write stores a new
dict, and the watch history keeps references to them, so readers copy only what they hand
out.

Semantics worth knowing when a test depends on them:

- resourceVersion is one global counter; a write with a stale ``metadata.resourceVersion``
  (PUT, or a patch carrying one) is 409 Conflict. A PUT without one is allowed for
  built-in kinds and 422 for custom resources, as on a real server.
- A write that changes nothing is a no-op: no new resourceVersion, no watch event.
- Kinds with a status subresource: create drops ``status`` (then pods get
  ``phase: Pending``, namespaces ``phase: Active``), writes to the main resource keep the
  stored status, writes to ``/status`` change only status. ``metadata.generation`` grows
  when anything but metadata and status changes, and when deletion starts.
- Delete: ``Background`` (default) removes the object and then, recursively, every
  object whose ownerReferences name only owners that are gone; ``Orphan`` (the default
  for batch/v1 Jobs, as on a real server) strips the owner reference from the
  dependents; ``Foreground`` is not emulated (400). Objects with finalizers get
  ``deletionTimestamp`` and stay until the last finalizer is removed; no finalizer may be
  added meanwhile. Every delete request is recorded in ``deletions`` with its grace
  period and cause.
- Pods: without a kubelet they are removed at once whatever the grace period. With one
  (``graceful_pods``, set by the simulated kubelet) a running pod deleted with a grace
  period > 0 gets ``deletionTimestamp`` (now + grace) and stays until the kubelet calls
  ``finish_termination``; grace 0 removes it at once.
- Namespaces are created on first use unless ``auto_namespaces`` is off (then 404, as
  on a real server); deleting one is not emulated (405).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import ApiError
from .objects import (
    CRD_KEY,
    apply_defaults,
    clone,
    controlled_by,
    generate_name,
    now_rfc3339,
    parse_rfc3339,
    rfc3339,
    validate_metadata,
)
from .patch import apply_patch
from .resources import Kind, Registry, kinds_from_crd
from .schema import prune
from .selectors import Selector

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Validator = Callable[[Obj], object]


@dataclass(frozen=True)
class WatchEvent:
    """One change: ``type`` ADDED / MODIFIED / DELETED, the object after it and before it."""

    rv: int
    kind_key: str
    type: str
    object: Obj
    old: Obj | None


@dataclass
class FieldValidation:
    """A write's ``fieldValidation`` for fields a custom resource's schema does not declare:
    ``Strict`` fails the write, ``Warn`` (the server's default) collects warnings, ``Ignore``
    prunes silently (k8s.io/apiserver/pkg/endpoints/handlers/create.go, update.go, patch.go)."""

    directive: str = "Warn"
    warnings: list[str] = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class Deletion:
    """One delete request: ``cause``: ``api``, ``garbage-collector`` or a controller's name."""

    kind: str  # storage key: pods, jobs.batch, pytorchjobs.kubeflow.org
    namespace: str
    name: str
    uid: str
    grace_period_seconds: int | None
    propagation_policy: str
    cause: str
    time: float


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise ApiError.bad_request("metadata must be an object")
    return meta


def _strict_error(kind: Kind, obj: Obj, unknown: str, patched: bool) -> ApiError:
    """Strict field validation failing, worded as the API server words it: a body that
    cannot be decoded (400, handlers/rest.go ``transformDecodeError``), or for a patch an
    invalid patched object (422, handlers/patch.go ``applyPatchToCurrentObject``)."""
    detail = f"strict decoding error: {unknown}"
    if patched:
        body = json.dumps(json.dumps(obj, separators=(",", ":")))
        return ApiError.invalid(f' "" is invalid: patch: Invalid value: {body}: {detail}')
    return ApiError.bad_request(f'{kind.kind} in version "{kind.version}" cannot be handled as '
                                f"a {kind.kind}: {detail}")


def _without(obj: Obj, keys: Iterable[str]) -> Obj:
    drop = set(keys)
    return {k: v for k, v in obj.items() if k not in drop}


class Store:
    """The emulated cluster state. Every method is thread-safe."""

    def __init__(self, registry: Registry, *, history: int = 5000,
                 auto_namespaces: bool = True) -> None:
        self.registry = registry
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        # Waiters on some kinds only: kube-apiserver keeps a watch cache per resource and
        # hands an event to that resource's watchers alone
        # (k8s.io/apiserver pkg/storage/cacher/cacher.go, Cacher.dispatchEvent), and a
        # controller wakes for the informers of the kinds it watches, not for every write.
        self._changed_for: dict[frozenset[str], threading.Condition] = {}
        self.auto_namespaces = auto_namespaces
        self._history_limit = history
        self._rv = 0
        self._compacted = 0
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {}
        self._kinds: dict[str, Kind] = {}
        self._by_uid: dict[str, tuple[str, str, str]] = {}
        # owner uid -> (kind key, namespace, name) of the objects whose ownerReferences name
        # it, in the order they got that reference: the garbage collector's dependency graph
        # (kubernetes pkg/controller/garbagecollector: graph.go's node.dependents, kept by
        # graph_builder.go's processGraphChanges from the informers' events, never found by
        # scanning every object).
        self._owned: dict[str, dict[tuple[str, str, str], None]] = {}
        self._history: deque[WatchEvent] = deque()
        self._created: dict[str, list[Obj]] = {}
        self._validators: list[tuple[Validator, frozenset[str] | None]] = []
        self.deletions: list[Deletion] = []
        # With a kubelet (the simulated one sets this), deleting a running pod with a grace
        # period only marks it; the kubelet removes it once its containers have stopped.
        self.graceful_pods = False
        # (kind key, namespace, name, JSON path) of every field pruned from a custom resource.
        self.pruned: list[tuple[str, str, str, str]] = []
        self.closed = False

    # ----------------------------------------------------------------- bookkeeping

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        with self.lock:
            return self._rv

    def add_validator(self, fn: Validator, kinds: Collection[str] | None = None) -> None:
        """Run ``fn(obj)`` on every object (of ``kinds``, by ``kind`` name, if given) before
        it is stored; raising or returning a message rejects the write with 422 Invalid.

        ``kinds`` are what a webhook configuration's rules name: the API server calls a
        webhook only for the resources its rules match (k8s.io/apiserver
        pkg/admission/plugin/webhook/generic/webhook.go ShouldCallHook), so nothing else is
        copied for it."""
        with self.lock:
            self._validators.append((fn, None if kinds is None else frozenset(kinds)))

    def changed_for(self, kinds: Collection[str]) -> threading.Condition:
        """A condition on the store's lock, notified on every commit of one of ``kinds``
        (kind keys, e.g. ``pods``, ``jobs.batch``), on compaction and on close."""
        keys = frozenset(kinds)
        with self.lock:
            condition = self._changed_for.get(keys)
            if condition is None:
                condition = self._changed_for[keys] = threading.Condition(self.lock)
            return condition

    def wake(self) -> None:
        """Wake every waiter, whatever it waits for (e.g. watch streams told to end)."""
        with self.lock:
            self.changed.notify_all()
            for condition in self._changed_for.values():
                condition.notify_all()

    def created(self, kind: Kind) -> list[Obj]:
        """Every object of ``kind`` ever created, as it was stored at creation."""
        with self.lock:
            return clone(self._created.get(kind.key, []))

    def compact(self) -> int:
        """Forget the watch history: watches from any older resourceVersion get 410 Gone."""
        with self.lock:
            self._history.clear()
            self._compacted = self._rv
            self.wake()
            return self._rv

    def close(self) -> None:
        """Wake every waiter for good (the server is stopping)."""
        with self.lock:
            self.closed = True
            self.wake()

    def _commit(self, kind: Kind, obj: Obj, old: Obj | None, event: str) -> Obj:
        self._rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._rv)
        table = self._objects.setdefault(kind.key, {})
        self._kinds.setdefault(kind.key, kind)
        key = (meta.get("namespace", ""), meta["name"])
        before = table.get(key)
        if event == "DELETED":
            table.pop(key, None)
            self._by_uid.pop(meta["uid"], None)
        else:
            table[key] = obj
            self._by_uid[meta["uid"]] = (kind.key, *key)
        self._index_owners((kind.key, *key), before, None if event == "DELETED" else obj)
        self._history.append(WatchEvent(self._rv, kind.key, event, obj, old))
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        self.changed.notify_all()
        for keys, condition in self._changed_for.items():
            if kind.key in keys:
                condition.notify_all()
        return obj

    def _prune(self, kind: Kind, obj: Obj, validation: FieldValidation | None = None,
               patched: bool = False) -> Obj:
        if kind.schema is None:
            return obj
        pruned, dropped = prune(obj, kind.schema)
        meta = obj["metadata"]
        for path in dropped:
            self.pruned.append((kind.key, meta.get("namespace", ""), meta["name"], path))
        if dropped and validation is not None:
            unknown = [f'unknown field "{path.lstrip(".")}"' for path in dropped]
            if validation.directive == "Strict":
                raise _strict_error(kind, obj, ", ".join(unknown), patched)
            if validation.directive == "Warn":
                validation.warnings.extend(unknown)
        return pruned

    def _admit(self, kind: Kind, obj: Obj) -> None:
        validate_metadata(kind, obj["metadata"])
        for fn, kinds in self._validators:
            if kinds is not None and kind.kind not in kinds:
                continue
            try:
                verdict = fn(clone(obj))
            except ApiError:
                raise
            except Exception as e:
                raise self._denied(kind, obj, str(e) or type(e).__name__,
                                   getattr(e, "field", ""), getattr(e, "detail", None)) from e
            if verdict:
                raise self._denied(kind, obj, str(verdict))

    @staticmethod
    def _denied(kind: Kind, obj: Obj, message: str, field: str = "",
                detail: str | None = None) -> ApiError:
        """422 for a validator's verdict; an exception with ``field`` (and ``detail``)
        attributes names the field in the cause, which is what kubectl prints."""
        name = obj["metadata"].get("name", "")
        what = f"{kind.kind}.{kind.group}" if kind.group else kind.kind
        cause = {"reason": "FieldValueInvalid", "message": detail or message, "field": field}
        return ApiError.invalid(f'{what} "{name}" is invalid: {message}',
                                kind.kind, kind.group, name, [cause])

    # ----------------------------------------------------------------- reads

    def _get(self, kind: Kind, namespace: str, name: str) -> Obj:
        ns = namespace if kind.namespaced else ""
        obj = self._objects.get(kind.key, {}).get((ns, name))
        if obj is None:
            raise ApiError.not_found(kind.plural, kind.group, name)
        return obj

    def _as_version(self, kind: Kind, obj: Obj) -> Obj:
        # Custom resources served at several versions share storage; no conversion.
        if obj.get("apiVersion") == kind.api_version:
            return obj
        return {**obj, "apiVersion": kind.api_version}

    def current(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        """The stored object itself, or None: for the simulated controllers, which read
        without copying as upstream controllers read their informers' caches (client-go
        tools/cache: objects shared, never to be modified); they must not change it."""
        with self.lock:
            return self._objects.get(kind.key, {}).get(
                (namespace if kind.namespaced else "", name))

    def get(self, kind: Kind, namespace: str, name: str) -> Obj:
        """A copy of one object; 404 ApiError when absent."""
        with self.lock:
            return clone(self._as_version(kind, self._get(kind, namespace, name)))

    def with_uids(self, kind: Kind, uids: Iterable[str]) -> list[Obj]:
        """The objects of ``kind`` with these uids that exist, as stored (not copied: see
        :meth:`current`), in the order a list gives them (namespace, name): what a
        controller reconciles of the keys it queued."""
        with self.lock:
            refs = sorted(ref for ref in map(self._by_uid.get, uids)
                          if ref is not None and ref[0] == kind.key)
            return [self._as_version(kind, self._get(kind, ns, name)) for _, ns, name in refs]

    def select(self, kind: Kind, namespace: str | None, selector: Selector | None = None,
               *, controller: str | None = None, copy: bool = True) -> tuple[list[Obj], int]:
        """Copies of the matching objects (by namespace, name) and the list's resourceVersion;
        with ``controller``, only those whose controller ownerReference has that uid; with
        ``copy=False``, the stored objects themselves, for the simulated controllers (see
        :meth:`current`).

        That is how the controllers find what they own, filtered before anything is copied:
        the Job controller claims the namespace's pods by controllerRef
        (kubernetes pkg/controller/job/job_controller.go getPodsForJob, ClaimPods; the
        operator leaves no orphans to adopt), JobSet lists its Jobs through an index on
        metav1.GetControllerOf (jobset pkg/controllers/jobset_controller.go getChildJobs),
        and the training operator lists the pods labelled for the job, which are the ones
        it made and controls (pkg/controller.v1/pytorch/pytorchjob_controller.go
        GetPodsForJob). The candidates come from the owner index (``_owned``), as those
        lookups go through informer indexes, not through every object of the kind."""
        with self.lock:
            table = self._objects.get(kind.key, {})
            if controller is None:
                candidates = sorted(table.items())
            else:
                candidates = sorted((ref[1:], table[ref[1:]])
                                    for ref in self._owned.get(controller, ())
                                    if ref[0] == kind.key)
            items = [self._as_version(kind, obj) for (ns, _), obj in candidates
                     if (namespace is None or not kind.namespaced or ns == namespace)
                     and (selector is None or selector.matches(obj))
                     and (controller is None or controlled_by(obj, controller))]
            return (clone(items) if copy else items), self._rv

    # ----------------------------------------------------------------- create

    def create(self, kind: Kind, namespace: str | None, body: Any, *,
               validation: FieldValidation | None = None) -> Obj:
        """Create; 409 AlreadyExists, 422 for invalid names or admission denials."""
        if not isinstance(body, dict):
            raise ApiError.bad_request("the request body must be a JSON object")
        obj = clone(body)
        meta = obj.setdefault("metadata", {})
        _meta(obj)
        with self.lock:
            ns = self._target_namespace(kind, namespace, meta)
            name = meta.get("name") or ""
            if not name:
                prefix = meta.get("generateName")
                if not prefix:
                    raise ApiError.invalid(f"{kind.kind} is invalid: metadata.name: Required "
                                           "value: name or generateName is required")
                name = generate_name(prefix, {n for (o, n) in self._objects.get(kind.key, {})
                                              if o == ns})
            if (ns, name) in self._objects.get(kind.key, {}):
                raise ApiError.already_exists(kind.plural, kind.group, name)
            if kind.namespaced and not self.auto_namespaces:
                self._ensure_namespace(ns)
            for field in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields",
                          "selfLink"):
                meta.pop(field, None)
            meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339(),
                        generation=1)
            if kind.namespaced:
                meta["namespace"] = ns
            else:
                meta.pop("namespace", None)
            obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
            if kind.status_subresource:
                obj.pop("status", None)
            apply_defaults(kind, obj)
            obj = self._prune(kind, obj, validation)
            self._admit(kind, obj)
            if kind.namespaced:
                self._ensure_namespace(ns)
            if kind.key == CRD_KEY:
                for served in kinds_from_crd(obj):
                    self.registry.add(served)
            self._commit(kind, obj, None, "ADDED")
            self._created.setdefault(kind.key, []).append(obj)  # stored objects never change
            return clone(obj)

    def _target_namespace(self, kind: Kind, namespace: str | None, meta: dict[str, Any]) -> str:
        if not kind.namespaced:
            return ""
        body_ns = meta.get("namespace")
        if namespace and body_ns and body_ns != namespace:
            raise ApiError.bad_request("the namespace of the provided object does not match "
                                       "the namespace sent on the request")
        ns = namespace or body_ns
        if not ns:
            raise ApiError.bad_request("a namespaced object needs a namespace")
        return str(ns)

    def _ensure_namespace(self, ns: str) -> None:
        namespaces = self.registry.lookup("", "v1", "namespaces")
        if ("", ns) in self._objects.get(namespaces.key, {}):
            return
        if not self.auto_namespaces:
            raise ApiError.not_found("namespaces", "", ns)
        self.create(namespaces, None, {"metadata": {"name": ns}})

    # ----------------------------------------------------------------- update / patch

    def update(self, kind: Kind, namespace: str, name: str, body: Any, *,
               subresource: str | None = None,
               validation: FieldValidation | None = None) -> Obj:
        """PUT; 409 Conflict on a stale resourceVersion."""
        if not isinstance(body, dict):
            raise ApiError.bad_request("the request body must be a JSON object")
        new = clone(body)
        meta = _meta(new) if "metadata" in new else new.setdefault("metadata", {})
        with self.lock:
            old = self._get(kind, namespace, name)
            if meta.get("name") not in (None, name):
                raise ApiError.bad_request(f"the name of the object ({meta.get('name')}) does "
                                           f"not match the name on the URL ({name})")
            rv = meta.get("resourceVersion")
            if not rv:
                if kind.custom:
                    raise ApiError.invalid(f'{kind.kind}.{kind.group} "{name}" is invalid: '
                                           "metadata.resourceVersion: Invalid value: 0x0: must "
                                           "be specified for an update",
                                           kind.kind, kind.group, name)
            elif str(rv) != old["metadata"]["resourceVersion"]:
                raise ApiError.conflict(kind.plural, kind.group, name)
            return self._write(kind, old, self._merged(kind, old, new, subresource), validation)

    def patch(self, kind: Kind, namespace: str, name: str, patch: Any, content_type: str, *,
              subresource: str | None = None,
              validation: FieldValidation | None = None) -> Obj:
        """PATCH (merge or JSON); a resourceVersion in the patch is a precondition."""
        with self.lock:
            old = self._get(kind, namespace, name)
            patched = apply_patch(clone(old), patch, content_type)
            meta = _meta(patched)
            rv = meta.get("resourceVersion")
            if rv and str(rv) != old["metadata"]["resourceVersion"]:
                raise ApiError.conflict(kind.plural, kind.group, name)
            if meta.get("name") != name:
                raise ApiError.bad_request("metadata.name cannot be changed by a patch")
            return self._write(kind, old, self._merged(kind, old, patched, subresource),
                               validation, patched=True)

    def _merged(self, kind: Kind, old: Obj, new: Obj, subresource: str | None) -> Obj:
        if subresource == "status":
            if not kind.status_subresource:
                raise ApiError.not_found_path("the server could not find the requested resource")
            result = clone(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            return result
        if subresource is not None:
            raise ApiError.not_found_path(f"subresource {subresource!r} is not served")
        result = new
        result["apiVersion"], result["kind"] = kind.api_version, kind.kind
        meta, old_meta = result["metadata"], old["metadata"]
        for field in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                      "deletionGracePeriodSeconds", "generation", "resourceVersion"):
            if field in old_meta:
                meta[field] = old_meta[field]
            else:
                meta.pop(field, None)
        meta.pop("managedFields", None)
        if kind.status_subresource:
            if "status" in old:
                result["status"] = old["status"]
            else:
                result.pop("status", None)
        ignored = ("metadata", "status") if kind.status_subresource else ("metadata",)
        if _without(result, ignored) != _without(old, ignored):
            meta["generation"] = int(old_meta.get("generation", 1)) + 1
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise ApiError.invalid(
                    f'{kind.kind} "{meta["name"]}" is invalid: metadata.finalizers: Forbidden: '
                    "no new finalizers can be added if the object is being deleted",
                    kind.kind, kind.group, meta["name"])
        return result

    def _write(self, kind: Kind, old: Obj, new: Obj,
               validation: FieldValidation | None = None, patched: bool = False) -> Obj:
        new = self._prune(kind, new, validation, patched)
        self._admit(kind, new)
        if new == old:
            return clone(old)
        if (old["metadata"].get("deletionTimestamp") and old["metadata"].get("finalizers")
                and not new["metadata"].get("finalizers")):
            return clone(self._remove(kind, new))
        if kind.key == CRD_KEY:
            # An updated CRD serves its new schema at once (apiextensions-apiserver's
            # crdHandler rebuilds the storage on every CRD change).
            for served in kinds_from_crd(new):
                self.registry.add(served)
        return clone(self._commit(kind, new, old, "MODIFIED"))

    # ----------------------------------------------------------------- delete

    def delete(self, kind: Kind, namespace: str, name: str, *,
               grace_period_seconds: int | None = None, propagation_policy: str | None = None,
               preconditions: dict[str, Any] | None = None,
               cause: str = "api") -> tuple[Obj, bool]:
        """Delete; the object's last state and whether it is gone (not held by finalizers)."""
        with self.lock:
            obj = self._get(kind, namespace, name)
            meta = obj["metadata"]
            for field, wanted in (preconditions or {}).items():
                if wanted and str(meta.get(field)) != str(wanted):
                    raise ApiError.conflict(kind.plural, kind.group, name)
            if kind.key == "namespaces":  # nothing under test deletes one
                raise ApiError(405, "MethodNotAllowed", "deleting a namespace is not emulated")
            policy = propagation_policy or kind.default_propagation
            if policy not in ("Background", "Orphan"):
                raise ApiError.bad_request(f"propagationPolicy {policy!r} is not emulated")
            self.deletions.append(Deletion(kind.key, meta.get("namespace", ""), name,
                                           meta["uid"], grace_period_seconds, policy, cause,
                                           time.time()))
            if policy == "Orphan":
                self._orphan(meta["uid"])
            finalizers = list(meta.get("finalizers") or [])
            if kind.key == "pods" and self.graceful_pods:
                grace = grace_period_seconds
                if grace is None:
                    grace = int((obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
                if grace > 0 and (obj.get("status") or {}).get("phase") == "Running":
                    return clone(self._start_termination(kind, obj, grace,
                                                                 finalizers)), False
            if finalizers:
                if meta.get("deletionTimestamp") and finalizers == meta.get("finalizers"):
                    return clone(obj), False
                held = clone(obj)
                held_meta = held["metadata"]
                held_meta["finalizers"] = finalizers
                if not held_meta.get("deletionTimestamp"):
                    held_meta["deletionTimestamp"] = now_rfc3339()
                    held_meta["deletionGracePeriodSeconds"] = grace_period_seconds or 0
                    held_meta["generation"] = int(held_meta.get("generation", 1)) + 1
                self._commit(kind, held, obj, "MODIFIED")
                return clone(self._objects.get(kind.key, {}).get(
                    (held_meta.get("namespace", ""), name), held)), False
            return clone(self._remove(kind, obj)), True

    def _start_termination(self, kind: Kind, obj: Obj, grace: int,
                           finalizers: list[str]) -> Obj:
        """A running pod's graceful deletion: it stays, marked, until its kubelet is done."""
        meta = obj["metadata"]
        deadline = time.time() + grace
        if meta.get("deletionTimestamp") and parse_rfc3339(meta["deletionTimestamp"]) <= deadline:
            return obj
        held = clone(obj)
        held_meta = held["metadata"]
        if not held_meta.get("deletionTimestamp"):
            held_meta["generation"] = int(held_meta.get("generation", 1)) + 1
        held_meta.update(deletionTimestamp=rfc3339(deadline), deletionGracePeriodSeconds=grace)
        if finalizers:
            held_meta["finalizers"] = finalizers
        return self._commit(kind, held, obj, "MODIFIED")

    def finish_termination(self, kind: Kind, namespace: str, name: str) -> None:
        """The kubelet is done with a terminating pod: remove it (finalizers still hold it)."""
        with self.lock:
            obj = self._objects.get(kind.key, {}).get((namespace, name))
            if obj is None or not obj["metadata"].get("deletionTimestamp"):
                return
            if not obj["metadata"].get("finalizers"):
                self._remove(kind, obj)
            elif obj["metadata"].get("deletionGracePeriodSeconds"):
                done = clone(obj)
                done["metadata"]["deletionGracePeriodSeconds"] = 0
                self._commit(kind, done, obj, "MODIFIED")

    def _remove(self, kind: Kind, obj: Obj) -> Obj:
        old = self._objects[kind.key][(obj["metadata"].get("namespace", ""),
                                       obj["metadata"]["name"])]
        gone = self._commit(kind, clone(obj), old, "DELETED")
        self._collect(gone["metadata"]["uid"])
        return gone

    @staticmethod
    def _owner_uids(obj: Obj | None) -> set[str]:
        refs = (obj or {}).get("metadata", {}).get("ownerReferences") or []
        return {str(r.get("uid")) for r in refs if r.get("uid")}

    def _index_owners(self, ref: tuple[str, str, str], before: Obj | None,
                      after: Obj | None) -> None:
        """Keep ``_owned`` current as ``ref`` goes from ``before`` to ``after`` (None:
        absent)."""
        was, now = self._owner_uids(before), self._owner_uids(after)
        for uid in was - now:
            dependents = self._owned.get(uid)
            if dependents is not None:
                dependents.pop(ref, None)
                if not dependents:
                    del self._owned[uid]
        for uid in now - was:
            self._owned.setdefault(uid, {})[ref] = None

    def _dependents(self, uid: str) -> list[tuple[str, str, str]]:
        """The objects whose ownerReferences name ``uid``, kind by kind in the order the
        kinds were first stored, each kind's in the order they got the reference."""
        order = {key: i for i, key in enumerate(self._objects)}
        return sorted(self._owned.get(uid, ()), key=lambda ref: order[ref[0]])

    def _set_owner_refs(self, key: str, ns: str, name: str, refs: list[Any]) -> None:
        old = self._objects[key][(ns, name)]
        new = clone(old)
        if refs:
            new["metadata"]["ownerReferences"] = refs
        else:
            new["metadata"].pop("ownerReferences", None)
        self._commit(self._kinds[key], new, old, "MODIFIED")

    def _orphan(self, uid: str) -> None:
        for key, ns, name in self._dependents(uid):
            refs = self._objects[key][(ns, name)]["metadata"]["ownerReferences"]
            self._set_owner_refs(key, ns, name, [r for r in refs if r.get("uid") != uid])

    def _collect(self, uid: str) -> None:
        """Garbage collector: dependents with no live owner left are deleted (Background)."""
        for key, ns, name in self._dependents(uid):
            obj = self._objects.get(key, {}).get((ns, name))
            if obj is None:
                continue
            refs = obj["metadata"]["ownerReferences"]
            others = [r for r in refs if r.get("uid") != uid and r.get("uid") in self._by_uid]
            if others:
                self._set_owner_refs(key, ns, name, [r for r in refs if r.get("uid") != uid])
            elif not obj["metadata"].get("deletionTimestamp"):
                self._delete_quietly(key, ns, name, "Background")

    def _delete_quietly(self, key: str, ns: str, name: str, policy: str) -> None:
        if (ns, name) in self._objects.get(key, {}):
            self.delete(self._kinds[key], ns, name, propagation_policy=policy,
                        cause="garbage-collector")

    # ----------------------------------------------------------------- watch

    def snapshot(self, kind: Kind, namespace: str | None,
                 selector: Selector | None) -> tuple[list[Obj], int]:
        """Current matching objects and the resourceVersion they are current at (no copies)."""
        with self.lock:
            table = self._objects.get(kind.key, {})
            items = [self._as_version(kind, obj) for (ns, _), obj in sorted(table.items())
                     if (namespace is None or not kind.namespaced or ns == namespace)
                     and (selector is None or selector.matches(obj))]
            return items, self._rv

    def events_after(self, kind: Kind, after: int, timeout: float) -> list[WatchEvent]:
        """Events of ``kind`` newer than ``after``, waiting up to ``timeout`` s for the first.

        Raises 410 Gone when ``after`` is older than the retained history.
        """
        deadline = time.monotonic() + timeout
        scanned = after
        changed = self.changed_for((kind.key,))
        with changed:
            while True:
                if after < self._compacted:
                    raise ApiError.gone(
                        f"too old resource version: {after} ({self._compacted})")
                found: list[WatchEvent] = []
                newest = scanned
                for event in reversed(self._history):
                    if event.rv <= scanned:
                        break
                    newest = max(newest, event.rv)
                    if event.kind_key == kind.key:
                        found.append(event)
                if found or self.closed:
                    found.reverse()
                    return found
                # Other kinds' events: the next wake-up scans only what came after them.
                scanned = newest
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                changed.wait(remaining)

    def wait_for(self, predicate: Callable[[], bool], timeout: float,
                 kinds: Collection[str] | None = None) -> bool:
        """Block until ``predicate()`` (evaluated under the lock after each change, of one
        of ``kinds`` if given) holds."""
        deadline = time.monotonic() + timeout
        changed = self.changed if kinds is None else self.changed_for(kinds)
        with changed:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.closed:
                    return False
                changed.wait(min(remaining, 0.5))
            return True
