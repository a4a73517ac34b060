"""A real API server for the operator's tests: etcd and kube-apiserver built from source,
no controllers, the CRDs the operator meets installed (the chart's; PyTorchJob, TrainJob
and the training runtimes as Kubeflow's releases ship them), behind a recording proxy.

``TestAPIServer`` starts once per test session (a few seconds); the pod cluster
(:mod:`.podcluster`) offers its API server as an :class:`APIServer` too. ``RealAPI`` is
what a test holds: accessors (``get``, ``list``, ``create``, ``patch``, ``patch_status``,
``delete``, ``wait_for``) as the cluster's admin straight to the API server, watches it
keeps for their history (``watch``), and the proxy's records and faults (``requests``,
``created``, ``deletions_of``, ``inject_fault``, ``end_watches``, ``stop``/``start``) for
what the operator under test sends through it (``api_client``). ``compact`` compacts etcd:
with the watch cache off, a watch from a compacted resourceVersion gets the real 410.

On ``TestAPIServer`` nothing runs pods: objects stay as written (no controller moves a Job
or a PyTorchJob, no garbage collector follows owner references). Between tests every
namespace a test wrote to is emptied and removed, and the test namespace made again.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import secrets
import shutil
import socket
import ssl
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from . import build, controlplane, daemons
from .controlplane import ControlPlane
from .errors import ClusterError
from .proxy import Deletion, Fault, RecordingProxy, Validator

log = logging.getLogger(__name__)

T = TypeVar("T")
Obj = dict[str, Any]
REPO = build.REPO
CHART_CRD = REPO / "charts" / "resumequal" / "crds" / "qualificationruns.resumequal.dev.yaml"
# Kubeflow's CRDs as their releases ship them (the modules the cluster builds from).
KUBEFLOW_CRDS = (("github.com/kubeflow/training-operator", "manifests/base/crds",
                  ("kubeflow.org_pytorchjobs.yaml",)),
                 ("github.com/kubeflow/trainer/v2", "manifests/base/crds",
                  ("trainer.kubeflow.org_trainjobs.yaml",
                   "trainer.kubeflow.org_trainingruntimes.yaml",
                   "trainer.kubeflow.org_clustertrainingruntimes.yaml")))
SERVED = frozenset({"qualificationruns.resumequal.dev", "pytorchjobs.kubeflow.org",
                    "trainjobs.trainer.kubeflow.org", "trainingruntimes.trainer.kubeflow.org",
                    "clustertrainingruntimes.trainer.kubeflow.org"})
# What the control plane makes for itself; never swept.
SYSTEM_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease"})
READY_TIMEOUT_S = 120.0
CRD_KEY = "customresourcedefinitions.apiextensions.k8s.io"


class APIError(ClusterError):
    """A request of a test's accessor the API server refused: ``code`` and its Status."""

    def __init__(self, code: int, status: Obj, what: str) -> None:
        super().__init__(f"{what}: {code} {status.get('reason', '')}: "
                         f"{str(status.get('message', ''))[:500]}")
        self.code = code
        self.status = status


@dataclass(frozen=True)
class Resource:
    """One served resource, as discovery describes it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    verbs: frozenset[str]
    short_names: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """``plural`` for the core group, ``plural.group`` otherwise (as the proxy names)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [base]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.plural)
        if name:
            parts.append(name)
        if subresource:
            parts.append(subresource)
        return "/".join(parts)


class _Rest:
    """JSON over HTTPS as the admin, one short request at a time (tests' own accessors)."""

    def __init__(self, server: str, context: ssl.SSLContext) -> None:
        self.server = server
        self.context = context

    def call(self, method: str, path: str, body: Any = None, *,
             content_type: str = "application/json", query: dict[str, str] | None = None,
             what: str = "") -> Obj:
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method,
                                         headers={"Content-Type": content_type,
                                                  "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self.context, timeout=30) as r:
                out: Obj = json.loads(r.read() or b"{}")
                return out
        except urllib.error.HTTPError as e:
            try:
                status = json.loads(e.read() or b"{}")
            except ValueError:
                status = {}
            raise APIError(e.code, status, what or f"{method} {path}") from e


class APIServer:
    """A running API server the tests reach as its admin: its control plane, plain REST
    calls and the resources it serves. ``kept``: namespaces no test's sweep touches;
    ``namespace_labels``: what each namespace a test writes to is made with."""

    __test__ = False  # not a test class, whatever its subclasses are named

    def __init__(self, cp: ControlPlane, wanted: Iterable[str] = SERVED, *,
                 kept: frozenset[str] = SYSTEM_NAMESPACES,
                 namespace_labels: dict[str, str] | None = None) -> None:
        self.cp = cp
        self.rest = _Rest(cp.server, cp.ssl_context())
        self.kept = kept
        self.namespace_labels = dict(namespace_labels or {})
        self.resources = self._discover(set(wanted))

    def _discover(self, wanted: set[str]) -> dict[str, Resource]:
        """Every served resource by plural, plural.group, Kind and short name; waits until
        the CRDs ``wanted`` are served."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            found = self._discovery()
            if wanted <= {r.key for r in found}:
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"CRDs not served within {READY_TIMEOUT_S:.0f} s: "
                                   f"{sorted(wanted - {r.key for r in found})}")
            time.sleep(0.2)
        names: dict[str, Resource] = {}
        for r in found:
            for name in (r.key, r.plural, r.kind, r.kind.lower(), *r.short_names):
                names.setdefault(name, r)
        return names

    def _discovery(self) -> list[Resource]:
        found = []
        groups = [("", "v1")] + [
            (g["name"], g["preferredVersion"]["version"])
            for g in self.rest.call("GET", "/apis").get("groups", [])]
        for group, version in groups:
            path = f"/apis/{group}/{version}" if group else "/api/v1"
            try:
                listing = self.rest.call("GET", path)
            except APIError:
                continue
            for r in listing.get("resources", []):
                if "/" in r["name"]:
                    continue
                found.append(Resource(group, version, r["kind"], r["name"], r["namespaced"],
                                      frozenset(r.get("verbs", [])),
                                      tuple(r.get("shortNames", []))))
        return found


class TestAPIServer(APIServer):
    """etcd and kube-apiserver for a test session; ``close`` stops both, nothing left."""

    def __init__(self) -> None:
        binaries = build.build_all()
        self.id = "t" + secrets.token_hex(4)
        self.root = Path(tempfile.mkdtemp(prefix="rq-testapi-"))
        try:
            cp = controlplane.start(self.root, binaries, cluster=self.id, host="127.0.0.1",
                                    controllers=False, watch_cache=False)
            rest = _Rest(cp.server, cp.ssl_context())
            files = [CHART_CRD] + [build.module_dir(module) / folder / name
                                   for module, folder, names in KUBEFLOW_CRDS
                                   for name in names]
            for crd in files:
                for doc in yaml.safe_load_all(crd.read_text()):
                    if doc:
                        rest.call("POST", "/apis/apiextensions.k8s.io/v1/"
                                  "customresourcedefinitions", doc, what=str(crd))
            super().__init__(cp)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        daemons.stop_all(self.id, grace=3.0)  # a test server: no requests to drain
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch: ADDED, MODIFIED or DELETED, and the object as it then was."""

    type: str
    object: Obj


class History:
    """A watch a test keeps, from its start until ``close``: every event in order (the API
    server keeps no history a test could ask for afterwards)."""

    def __init__(self, cp: ControlPlane, path: str) -> None:
        self.events: list[WatchEvent] = []
        self._lock = threading.Lock()
        self._conn = http.client.HTTPSConnection(cp.host, cp.ports.apiserver,
                                                 context=cp.ssl_context(), timeout=3600)
        # From now: the watch's first events are the objects there (ADDED), then changes.
        self._conn.request("GET", f"{path}?watch=true&timeoutSeconds=3600")
        self._response = self._conn.getresponse()
        if self._response.status != 200:
            raise APIError(self._response.status, {}, f"watch {path}")
        self._thread = threading.Thread(target=self._read, daemon=True, name=f"watch {path}")
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
            for line in self._response:
                event = json.loads(line)
                with self._lock:
                    self.events.append(WatchEvent(event["type"], event["object"]))

    def __call__(self) -> list[WatchEvent]:
        """The events so far."""
        with self._lock:
            return list(self.events)

    def close(self) -> None:
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)
        self._conn.close()


class RealAPI:
    """What one test holds: accessors, and a proxy of its own for the operator."""

    def __init__(self, server: APIServer, namespace: str) -> None:
        self.server = server
        self.rest = server.rest
        self.namespace = namespace
        self.proxy = RecordingProxy((server.cp.host, server.cp.ports.apiserver),
                                    server.cp.ssl_context()).start()
        self._created: list[tuple[str, Obj]] = []
        self._deletions: list[Deletion] = []
        self._namespaces: set[str] = set()
        self._crds: dict[str, Obj | None] = {}  # CRDs a test changed: as they were before
        self._watches: list[History] = []
        self._ensure_namespace(namespace)

    # ----------------------------------------------------------------- the operator's door

    @property
    def url(self) -> str:
        """The proxy's ``http://127.0.0.1:<port>``."""
        return self.proxy.url

    def configuration(self) -> Any:
        """A client configuration for the proxy (which adds the admin's credentials)."""
        import kubernetes.client

        config = kubernetes.client.Configuration()
        config.host = self.url
        return config

    def api_client(self) -> Any:
        """A fresh official client through the proxy; close it when done."""
        import kubernetes.client

        return kubernetes.client.ApiClient(self.configuration())

    def stop(self) -> None:
        """The API goes away for the operator: watches break, requests are refused."""
        self.proxy.stop()

    def start(self) -> RealAPI:
        """And comes back on the same port."""
        self.proxy.start()
        return self

    def end_watches(self) -> None:
        """End every watch stream the operator has open, cleanly."""
        self.proxy.end_watches()

    def add_validator(self, fn: Validator, kinds: Iterable[str] | None = None) -> None:
        """Admission, as a validating webhook: ``fn(obj)`` sees each object the operator
        creates or replaces (of the Kinds ``kinds``, if given) before the API server does;
        raising or returning a message refuses it."""
        self.proxy.add_validator(fn, None if kinds is None else frozenset(kinds))

    def faults_pending(self) -> int:
        """How many injected failures are still to be served."""
        with self.proxy.lock:
            return sum(f.times for f in self.proxy.faults)

    def clear_faults(self) -> None:
        """Serve no more of the failures injected."""
        with self.proxy.lock:
            self.proxy.faults.clear()

    def inject_fault(self, *, method: str = "*", kind: str = "*", name: str | None = None,
                     subresource: str | None = None, code: int = 500, times: int = 1,
                     message: str = "injected failure") -> None:
        """The operator's next ``times`` matching requests are answered ``code``."""
        key = "*" if kind == "*" else self.kind(kind).key
        self.proxy.inject(Fault(method, key, name, subresource, code, times, message))

    def compact(self) -> int:
        """Expire every resourceVersion seen so far: one more write, then etcd compacted at
        it; returns that revision. A watch from an older resourceVersion then gets 410 Gone
        from the API server (its watch cache is off)."""
        marker = "/api/v1/namespaces/kube-system/configmaps"
        try:
            self.rest.call("DELETE", f"{marker}/compaction-marker")
        except APIError as e:
            if e.code != 404:
                raise
        self.rest.call("POST", marker, {"apiVersion": "v1", "kind": "ConfigMap",
                                        "metadata": {"name": "compaction-marker"}})
        etcd = f"http://127.0.0.1:{self.server.cp.ports.etcd}"
        header = _post_json(f"{etcd}/v3/kv/range",
                            {"key": base64.b64encode(b"/").decode()})["header"]
        revision = int(header["revision"])
        _post_json(f"{etcd}/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    # ----------------------------------------------------------------- records

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path with query) of every request the operator sent through the proxy."""
        with self.proxy.lock:
            return list(self.proxy.requests)

    def created(self, kind: str) -> list[Obj]:
        """Every object of ``kind`` created (by the operator or the test), as the server
        stored it at creation, oldest first."""
        key = self.kind(kind).key
        with self.proxy.lock:
            made = [o for k, o in [*self.proxy.created, *self._created] if k == key]
        return sorted(made, key=lambda o: int(o["metadata"]["resourceVersion"]))

    def deletions_of(self, kind: str) -> list[Deletion]:
        """The delete requests for one kind the server accepted, oldest first."""
        key = self.kind(kind).key
        with self.proxy.lock:
            found = [d for d in [*self.proxy.deletions, *self._deletions] if d.kind == key]
        return sorted(found, key=lambda d: d.time)

    def watch(self, kind: str, namespace: str | None = None) -> History:
        """A watch of ``kind`` (in ``namespace``, or the test's) kept from now until the
        test ends: its events, in order."""
        history = History(self.server.cp, self.kind(kind).path(namespace or self.namespace))
        self._watches.append(history)
        return history

    # ----------------------------------------------------------------- accessors

    def register_trainer_crds(self) -> None:
        """Kubeflow Trainer's TrainJob and runtimes: served from the start (their release's
        CRDs), as on a cluster where Trainer is installed; nothing runs them here."""
        for kind in ("trainjobs", "trainingruntimes", "clustertrainingruntimes"):
            self.kind(kind)

    def register_crd(self, crd: Obj) -> None:
        """Install ``crd`` in place of the one served under its name (restored after the
        test), and wait until the API server serves it."""
        path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
        name = crd["metadata"]["name"]
        for attempt in range(10):
            have = self.get("customresourcedefinitions", "", name)
            if name not in self._crds:
                self._crds[name] = have
            try:
                if have is None:
                    self.rest.call("POST", path, crd)
                else:
                    version = have["metadata"]["resourceVersion"]
                    self.rest.call("PUT", f"{path}/{name}", {
                        **crd, "metadata": {**crd["metadata"], "resourceVersion": version}})
                break
            except APIError as e:
                # The API server's own controllers write a new CRD's status meanwhile.
                if e.code != 409 or attempt == 9:
                    raise
        self.wait_for(lambda: _established(self.get("customresourcedefinitions", "", name)),
                      timeout=30, message=f"CRD {name} established")

    def kind(self, kind: str | Resource) -> Resource:
        if isinstance(kind, Resource):
            return kind
        try:
            return self.server.resources[kind]
        except KeyError:
            raise KeyError(f"the API server serves no resource {kind!r}") from None

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The object, or None when it does not exist."""
        try:
            return self.rest.call("GET", self.kind(kind).path(namespace, name))
        except APIError as e:
            if e.code == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None, *,
             label_selector: str | None = None, field_selector: str | None = None) -> list[Obj]:
        """The matching objects; ``namespace=None`` means every namespace."""
        query = {k: v for k, v in (("labelSelector", label_selector),
                                   ("fieldSelector", field_selector)) if v}
        items: list[Obj] = self.rest.call("GET", self.kind(kind).path(namespace),
                                          query=query)["items"]
        return items

    def create(self, kind: str, obj: Obj, namespace: str | None = None) -> Obj:
        """Create (namespace from the argument or ``obj.metadata.namespace``, made first if
        this test has not written to it yet)."""
        r = self.kind(kind)
        if r.key == "namespaces":  # with its default ServiceAccount, as a cluster makes it
            self._ensure_namespace(obj["metadata"]["name"])
            return self.rest.call("GET", r.path(name=obj["metadata"]["name"]))
        ns = namespace or obj.get("metadata", {}).get("namespace") or None
        if r.namespaced:
            ns = ns or self.namespace
            self._ensure_namespace(ns)
        body = {"apiVersion": f"{r.group}/{r.version}" if r.group else r.version,
                "kind": r.kind, **obj}
        made = self.rest.call("POST", r.path(ns), body)
        self._created.append((r.key, made))
        return made

    def replace(self, kind: str, namespace: str, name: str, obj: Obj, *,
                subresource: str | None = None) -> Obj:
        """PUT, resourceVersion precondition included."""
        return self.rest.call("PUT", self.kind(kind).path(namespace, name, subresource), obj)

    def patch(self, kind: str, namespace: str, name: str, patch: Any, *,
              subresource: str | None = None) -> Obj:
        """A JSON merge patch."""
        return self.rest.call("PATCH", self.kind(kind).path(namespace, name, subresource),
                              patch, content_type="application/merge-patch+json")

    def patch_status(self, kind: str, namespace: str, name: str, status: Obj) -> Obj:
        """Merge ``status`` into the object's status through its status subresource."""
        r = self.kind(kind)
        sub = "status" if r.group else None
        return self.patch(r, namespace, name, {"status": status},  # type: ignore[arg-type]
                          subresource=sub)

    def delete(self, kind: str, namespace: str, name: str, *,
               grace_period_seconds: int | None = None,
               propagation_policy: str | None = None) -> Obj:
        """Delete; returns what the server answered (the object, or a Status)."""
        r = self.kind(kind)
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if propagation_policy is not None:
            options["propagationPolicy"] = propagation_policy
        if r.key == CRD_KEY and name not in self._crds:
            self._crds[name] = self.get(r.key, "", name)  # restored after the test
        out = self.rest.call("DELETE", r.path(namespace, name), options)
        uid = str((out.get("details") or out.get("metadata") or {}).get("uid", ""))
        self._deletions.append(Deletion(r.key, namespace, name, uid, grace_period_seconds,
                                        propagation_policy, "api", time.time()))
        if r.key == CRD_KEY:  # gone once its objects are (kubectl waits)
            self.wait_for(lambda: self.get(r.key, "", name) is None, timeout=30,
                          message=f"CRD {name} deleted")
        return out

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0,
                 message: str = "condition") -> T:
        """Wait until ``predicate()`` returns something truthy and return it; TimeoutError
        naming ``message`` otherwise."""
        deadline = time.monotonic() + timeout
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
            time.sleep(0.05)

    # ----------------------------------------------------------------- between tests

    def _ensure_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces or namespace in SYSTEM_NAMESPACES:
            return
        with contextlib.suppress(APIError):  # there already
            self.rest.call("POST", "/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": namespace, "labels": self.server.namespace_labels}})
        # What the controller manager's serviceaccount controller would make (kubernetes
        # pkg/controller/serviceaccount/serviceaccounts_controller.go, syncNamespace): the
        # ServiceAccount admission plugin refuses pods in a namespace without it.
        with contextlib.suppress(APIError):
            self.rest.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts", {
                "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
        self._namespaces.add(namespace)

    def close(self) -> None:
        """Stop the proxy; empty and remove every namespace the test wrote to (the
        operator's finalizers cleared: no operator is left to clear them)."""
        self.proxy.stop()
        for history in self._watches:
            history.close()
        namespaces = {n["metadata"]["name"] for n in self.rest.call(
            "GET", "/api/v1/namespaces")["items"]} - self.server.kept
        self._restore_crds()
        sweep(self.rest, self.server.resources.values(), namespaces)

    def _restore_crds(self) -> None:
        """The session's CRDs back as they were (a test may have replaced or deleted one)."""
        for name, before in self._crds.items():
            if before is None:  # made by the test
                with contextlib.suppress(APIError):
                    self.delete("customresourcedefinitions", "", name)
                continue
            crd = {k: before[k] for k in ("apiVersion", "kind", "spec")}
            crd["metadata"] = {k: v for k, v in before["metadata"].items()
                               if k in ("name", "labels", "annotations")}
            self.register_crd(crd)


def sweep(rest: _Rest, resources: Iterable[Resource], namespaces: set[str]) -> None:
    """Delete each namespace, then every object in it at once, then finalize it: what the
    namespace controller does (kubernetes
    pkg/controller/namespace/deletion/namespaced_resources_deleter.go: deleteAllContent,
    then finalizeNamespace's PUT of ``/finalize``), without its waits for grace periods;
    finalizers are cleared first, as no operator is left to clear them. Deleted first, the
    namespace takes no new objects (NamespaceLifecycle admission): where controllers run,
    none makes one again while it is emptied."""
    kinds = {r.key: r for r in resources if r.namespaced and {"list", "delete"} <= r.verbs}
    for namespace in sorted(namespaces):
        with contextlib.suppress(APIError):
            rest.call("DELETE", f"/api/v1/namespaces/{namespace}")
        deadline = time.monotonic() + 30
        while _empty_once(rest, kinds.values(), namespace):
            if time.monotonic() > deadline:
                raise ClusterError(f"namespace {namespace} not emptied within 30 s")
        with contextlib.suppress(APIError):
            # Emptied above: what the namespace controller does last, done here.
            rest.call("PUT", f"/api/v1/namespaces/{namespace}/finalize", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace},
                "spec": {"finalizers": []}})
        while time.monotonic() < deadline:
            try:
                rest.call("GET", f"/api/v1/namespaces/{namespace}")
            except APIError as e:
                if e.code == 404:
                    break
                raise
            time.sleep(0.05)
        else:
            raise ClusterError(f"namespace {namespace} still there 30 s after its sweep")


def _empty_once(rest: _Rest, kinds: Iterable[Resource], namespace: str) -> bool:
    """One pass deleting every object in ``namespace`` (grace 0, finalizers cleared);
    whether it found any."""
    now = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    found = False
    for r in kinds:
        try:
            items = rest.call("GET", r.path(namespace)).get("items", [])
        except APIError as e:
            if e.code == 404:  # a custom resource whose CRD a test removed
                continue
            if e.code == 429:  # its CRD put back by a test: served again in a moment
                found = True
                continue
            raise
        for obj in items:
            if obj["metadata"].get("finalizers"):
                with contextlib.suppress(APIError):  # gone meanwhile
                    rest.call("PATCH", r.path(namespace, obj["metadata"]["name"]),
                              {"metadata": {"finalizers": None}},
                              content_type="application/merge-patch+json")
        if not items:
            continue
        found = True
        if "deletecollection" in r.verbs:
            with contextlib.suppress(APIError):
                rest.call("DELETE", r.path(namespace), now)
            continue
        for obj in items:
            with contextlib.suppress(APIError):
                rest.call("DELETE", r.path(namespace, obj["metadata"]["name"]), now)
    return found


def _established(crd: Obj | None) -> bool:
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in conditions)


def _post_json(url: str, body: Obj) -> Obj:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as r:
        out: Obj = json.loads(r.read())
        return out
