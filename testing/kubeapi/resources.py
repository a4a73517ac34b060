"""The kinds the emulator serves: built-in kinds, CRDs registered from YAML, discovery documents."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError

VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Kind:
    """One served resource: where it lives in the URL space and which semantics it gets."""

    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool
    status_subresource: bool
    singular: str = ""
    short_names: tuple[str, ...] = ()
    # Pods and custom resources answer a DELETE with the object, most others with a Status.
    delete_returns_object: bool = False
    # batch/v1 Jobs orphan their pods unless the client asks for Background.
    default_propagation: str = "Background"
    # openAPIV3Schema of a CRD version: custom resources are pruned against it.
    schema: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    custom: bool = False
    # additionalPrinterColumns of a CRD version (empty: the default Age column); None for
    # built-in kinds, whose server-side printers the emulator does not reproduce.
    printer_columns: tuple[Mapping[str, Any], ...] | None = field(default=None, compare=False,
                                                                  hash=False)

    @property
    def api_version(self) -> str:
        """``v1`` for the core group, ``group/version`` otherwise."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """Storage key, the same for every version: ``pods``, ``jobs.batch``, ``x.kubeflow.org``."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def list_kind(self) -> str:
        """The ``kind`` of a list of these objects."""
        return f"{self.kind}List"


def _core(kind: str, plural: str, *, namespaced: bool = True, status: bool = False,
          short: tuple[str, ...] = (), returns_object: bool = False) -> Kind:
    return Kind("", "v1", kind, plural, namespaced, status, kind.lower(), short,
                delete_returns_object=returns_object)


BUILTIN_KINDS: tuple[Kind, ...] = (
    _core("Namespace", "namespaces", namespaced=False, status=True, short=("ns",),
          returns_object=True),
    _core("Pod", "pods", status=True, short=("po",), returns_object=True),
    _core("Event", "events", short=("ev",)),
    _core("Secret", "secrets"),
    Kind("batch", "v1", "Job", "jobs", True, True, "job", default_propagation="Orphan"),
    Kind("coordination.k8s.io", "v1", "Lease", "leases", True, False, "lease"),
    # pkg/registry/networking/networkpolicy/storage/storage.go: a plain generic store (no
    # ReturnDeletedObject: a DELETE answers a Status) and, since 1.28 removed
    # NetworkPolicyStatus, no status subresource. Served as objects only: nothing here
    # enforces a policy on traffic (the kubelet's pods do not talk over a network).
    Kind("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True, False,
         "networkpolicy", ("netpol",)),
    Kind("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions",
         False, True, "customresourcedefinition", ("crd", "crds"), delete_returns_object=True),
)


def kinds_from_crd(crd: Mapping[str, Any]) -> list[Kind]:
    """One Kind per served version of an ``apiextensions.k8s.io/v1`` CustomResourceDefinition."""
    try:
        spec = crd["spec"]
        names = spec["names"]
        group = spec["group"]
        namespaced = spec.get("scope", "Namespaced") == "Namespaced"
        kinds = []
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            subresources = version.get("subresources") or {}
            schema = (version.get("schema") or {}).get("openAPIV3Schema")
            kinds.append(Kind(
                group, version["name"], names["kind"], names["plural"], namespaced,
                "status" in subresources, names.get("singular", names["kind"].lower()),
                tuple(names.get("shortNames") or ()), delete_returns_object=True,
                schema=schema, custom=True,
                printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
            ))
    except (KeyError, TypeError) as e:
        raise ApiError.invalid(f"CustomResourceDefinition is malformed: missing {e}") from e
    if not kinds:
        raise ApiError.invalid("CustomResourceDefinition serves no version")
    return kinds


class Registry:
    """Thread-safe set of served kinds, looked up by URL coordinates or by a short name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, str, str], Kind] = {}
        for kind in BUILTIN_KINDS:
            self.add(kind)

    def add(self, kind: Kind) -> None:
        """Serve ``kind`` (replacing an earlier registration of the same group/version/plural)."""
        with self._lock:
            self._kinds[(kind.group, kind.version, kind.plural)] = kind

    def __iter__(self) -> Iterator[Kind]:
        with self._lock:
            return iter(list(self._kinds.values()))

    def lookup(self, group: str, version: str, plural: str) -> Kind:
        """The kind at ``/apis/<group>/<version>/<plural>``; 404 when not served."""
        with self._lock:
            kind = self._kinds.get((group, version, plural))
        if kind is None:
            gv = f"{group}/{version}" if group else version
            raise ApiError.not_found_path(f"the server could not find the requested resource "
                                          f"({plural} in {gv})")
        return kind

    def resolve(self, name: str) -> Kind:
        """A kind by ``plural``, ``plural.group``, singular, Kind or short name."""
        wanted = name.lower()
        with self._lock:
            kinds = list(self._kinds.values())
        for kind in kinds:
            if wanted in (kind.key, f"{kind.plural}.{kind.group}"):
                return kind
        for kind in kinds:
            if wanted in (kind.plural, kind.singular, kind.kind.lower(), *kind.short_names):
                return kind
        raise KeyError(f"no kind named {name!r} is served")

    def groups(self) -> dict[str, list[str]]:
        """Every non-core group with its versions, in registration order."""
        with self._lock:
            out: dict[str, list[str]] = {}
            for kind in self._kinds.values():
                if kind.group and kind.version not in out.setdefault(kind.group, []):
                    out[kind.group].append(kind.version)
            return out

    def discovery_group_list(self) -> dict[str, Any]:
        """The ``/apis`` document."""
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [self._group(g, v) for g, v in self.groups().items()]}

    def discovery_group(self, group: str) -> dict[str, Any]:
        """The ``/apis/<group>`` document; 404 for a group nothing serves."""
        versions = self.groups().get(group)
        if not versions:
            raise ApiError.not_found_path("the server could not find the requested resource")
        return {"kind": "APIGroup", "apiVersion": "v1", **self._group(group, versions)}

    @staticmethod
    def _group(group: str, versions: list[str]) -> dict[str, Any]:
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"name": group, "versions": entries, "preferredVersion": entries[0]}

    def discovery_resource_list(self, group: str, version: str) -> dict[str, Any]:
        """The ``/api/v1`` or ``/apis/<group>/<version>`` document; 404 for an unknown version."""
        resources: list[dict[str, Any]] = []
        for kind in self:
            if (kind.group, kind.version) != (group, version):
                continue
            resources.append({
                "name": kind.plural, "singularName": kind.singular, "namespaced": kind.namespaced,
                "kind": kind.kind, "verbs": VERBS, "shortNames": list(kind.short_names),
            })
            if kind.status_subresource:
                resources.append({"name": f"{kind.plural}/status", "singularName": "",
                                  "namespaced": kind.namespaced, "kind": kind.kind,
                                  "verbs": ["get", "patch", "update"]})
        if not resources:
            raise ApiError.not_found_path("the server could not find the requested resource")
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                "resources": resources}
