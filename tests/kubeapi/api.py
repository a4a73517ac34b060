"""``KubeAPI``: the emulator's lifecycle, client configuration and in-process accessors."""

from __future__ import annotations

import copy
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import kubernetes.client
import yaml

from .errors import ApiError
from .patch import JSON_PATCH, MERGE, STRATEGIC
from .resources import Kind, Registry, kinds_from_crd
from .selectors import Selector
from .server import Fault, Server
from .store import CRD_KEY, Deletion, Obj, Store, Validator, WatchEvent

log = logging.getLogger(__name__)

T = TypeVar("T")
PATCH_TYPES = {"merge": MERGE, "json": JSON_PATCH, "strategic": STRATEGIC}
CRDS = Path(__file__).parent / "crds"
PYTORCHJOB_CRD = CRDS / "kubeflow.org_pytorchjobs.v1.9.0.yaml"


@functools.lru_cache(maxsize=16)
def _parse_yaml(path: str, mtime: float) -> tuple[Obj, ...]:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path) as f:
        return tuple(d for d in yaml.load_all(f, Loader=loader) if d)


def _load_yaml(path: str) -> list[Obj]:
    """The YAML documents of a file, parsed once per process (CRDs are large)."""
    return copy.deepcopy(list(_parse_yaml(path, Path(path).stat().st_mtime)))


class KubeAPI:
    """A stateful Kubernetes API server on 127.0.0.1 for tests (see the package docstring).

    ``kind`` arguments of the in-process accessors take a plural (``pods``), a
    ``plural.group`` (``pytorchjobs.kubeflow.org``), a Kind name or short name, or a
    :class:`Kind`. Accessors bypass HTTP but not semantics: they bump resourceVersion,
    emit watch events and run the validators.
    """

    def __init__(self, *, history: int = 5000, auto_namespaces: bool = True) -> None:
        self.registry = Registry()
        self.store = Store(self.registry, history=history, auto_namespaces=auto_namespaces)
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._port = 0

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> KubeAPI:
        """Listen on a free loopback port (the same port again after a ``stop``)."""
        if self._server is not None:
            return self
        self.store.closed = False
        self._server = Server(("127.0.0.1", self._port), self.store, self.registry)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05},
                                        name=f"kubeapi-{self._port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving: watches end, open connections are cut. State is kept for a restart."""
        server, self._server = self._server, None
        if server is None:
            return
        self.store.close()
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> KubeAPI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self._port}"

    def configuration(self) -> kubernetes.client.Configuration:
        """A client configuration pointing at the emulator, without credentials."""
        config = kubernetes.client.Configuration()
        config.host = self.url
        return config

    def api_client(self) -> kubernetes.client.ApiClient:
        """A fresh client for the emulator; close it when done."""
        return kubernetes.client.ApiClient(self.configuration())

    # ----------------------------------------------------------------- setup

    def kind(self, kind: str | Kind) -> Kind:
        """Resolve a kind name (see the class docstring)."""
        return kind if isinstance(kind, Kind) else self.registry.resolve(kind)

    def register_crd(self, crd: dict[str, Any] | str | Path) -> list[Kind]:
        """Serve a CustomResourceDefinition given as a dict or a YAML file; idempotent."""
        if not isinstance(crd, dict):
            kinds: list[Kind] = []
            for doc in _load_yaml(str(crd)):
                kinds += self.register_crd(doc)
            return kinds
        kinds = kinds_from_crd(crd)
        crd_kind = self.registry.lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
        name = crd["metadata"]["name"]
        existing = self.get(crd_kind, "", name)
        body = copy.deepcopy(crd)
        if existing is None:
            self.store.create(crd_kind, None, body)
        else:
            body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
            self.store.update(crd_kind, "", name, body)
            for kind in kinds:
                self.registry.add(kind)
        return kinds

    def register_pytorchjob_crd(self) -> list[Kind]:
        """Serve kubeflow.org/v1 PyTorchJob from the training operator v1.9.0 CRD."""
        return self.register_crd(PYTORCHJOB_CRD)

    def add_validator(self, fn: Validator) -> None:
        """Admission: ``fn(obj)`` sees every object about to be stored (create, update, patch,
        status); raising or returning a non-empty message rejects the write with 422."""
        self.store.add_validator(fn)

    def inject_fault(self, *, method: str = "*", kind: str | Kind = "*", name: str | None = None,
                     subresource: str | None = None, code: int = 500, times: int = 1,
                     message: str = "injected failure") -> None:
        """Make the next ``times`` matching HTTP requests fail with ``code``."""
        key = "*" if kind == "*" else self.kind(kind).key
        if self._server is None:
            raise RuntimeError("the emulator is not running")
        with self._server.connections_lock:
            self._server.faults.append(Fault(method, key, name, subresource, code, times, message))

    def compact(self) -> int:
        """Drop the watch history; watches from an older resourceVersion get 410 Gone."""
        return self.store.compact()

    # ----------------------------------------------------------------- records

    @property
    def deletions(self) -> list[Deletion]:
        """Every delete request so far, garbage collection included, oldest first."""
        with self.store.lock:
            return list(self.store.deletions)

    def deletions_of(self, kind: str | Kind) -> list[Deletion]:
        """The delete requests for one kind."""
        key = self.kind(kind).key
        return [d for d in self.deletions if d.kind == key]

    def created(self, kind: str | Kind) -> list[Obj]:
        """Every object of ``kind`` ever created, as stored at creation (deleted ones included)."""
        return self.store.created(self.kind(kind))

    @property
    def pruned(self) -> list[tuple[str, str, str, str]]:
        """(kind, namespace, name, path) of every field pruned from a custom resource."""
        with self.store.lock:
            return list(self.store.pruned)

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path with query) of every HTTP request served since the last start."""
        return list(self._server.requests) if self._server is not None else []

    def history(self, kind: str | Kind | None = None) -> list[WatchEvent]:
        """Retained watch events (all kinds, or one), oldest first."""
        key = None if kind is None else self.kind(kind).key
        with self.store.lock:
            return [e for e in self.store._history if key is None or e.kind_key == key]

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion."""
        return self.store.resource_version

    # ----------------------------------------------------------------- accessors

    def get(self, kind: str | Kind, namespace: str, name: str) -> Obj | None:
        """A copy of the object, or None when it does not exist."""
        try:
            return self.store.get(self.kind(kind), namespace, name)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    def list(self, kind: str | Kind, namespace: str | None = None, *,
             label_selector: str | None = None, field_selector: str | None = None) -> list[Obj]:
        """Copies of the matching objects; ``namespace=None`` means every namespace."""
        k = self.kind(kind)
        items, _ = self.store.select(k, namespace,
                                   Selector.parse(label_selector, field_selector, k.key))
        return items

    def create(self, kind: str | Kind, obj: Obj, namespace: str | None = None) -> Obj:
        """Create (namespace from the argument or ``obj.metadata.namespace``)."""
        return self.store.create(self.kind(kind), namespace, obj)

    def replace(self, kind: str | Kind, namespace: str, name: str, obj: Obj, *,
                subresource: str | None = None) -> Obj:
        """PUT semantics, resourceVersion precondition included."""
        return self.store.update(self.kind(kind), namespace, name, obj, subresource=subresource)

    def patch(self, kind: str | Kind, namespace: str, name: str, patch: Any, *,
              patch_type: str = "merge", subresource: str | None = None) -> Obj:
        """Patch with ``patch_type`` merge, json or strategic."""
        return self.store.patch(self.kind(kind), namespace, name, patch,
                                PATCH_TYPES[patch_type], subresource=subresource)

    def patch_status(self, kind: str | Kind, namespace: str, name: str,
                     status: dict[str, Any]) -> Obj:
        """Merge ``status`` into the object's status through the status subresource."""
        k = self.kind(kind)
        sub = "status" if k.status_subresource else None
        return self.store.patch(k, namespace, name, {"status": status}, MERGE, subresource=sub)

    def delete(self, kind: str | Kind, namespace: str, name: str, *,
               grace_period_seconds: int | None = None,
               propagation_policy: str | None = None) -> Obj:
        """Delete (recorded like an API delete); returns the object's last state."""
        obj, _ = self.store.delete(self.kind(kind), namespace, name,
                                   grace_period_seconds=grace_period_seconds,
                                   propagation_policy=propagation_policy)
        return obj

    def wait_for(self, predicate: Callable[[], T], timeout: float = 10.0,
                 message: str = "condition") -> T:
        """Wait until ``predicate()`` returns something truthy (re-checked on every change)
        and return it; TimeoutError naming ``message`` otherwise."""
        result: list[T] = []

        def check() -> bool:
            value = predicate()
            if value:
                result.append(value)
                return True
            return False

        if not self.store.wait_for(check, timeout):
            raise TimeoutError(f"timed out after {timeout}s waiting for {message}")
        return result[-1]


__all__ = ["CRD_KEY", "PYTORCHJOB_CRD", "KubeAPI"]
