"""OpenAPI v3 as the API server publishes it at ``/openapi/v3``, for ``kubectl``.

kubectl reads it to decide, per kind, whether the server validates fields itself (a PATCH
operation with the kind's ``x-kubernetes-group-version-kind`` and a ``fieldValidation``
parameter: k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go; then it sends
``fieldValidation=Strict`` instead of validating against OpenAPI v2 on its side), and
whether ``kubectl apply`` may send a strategic merge patch (the PATCH request body lists
``application/strategic-merge-patch+json``: k8s.io/kubectl/pkg/cmd/apply/patcher.go; custom
resources never do, so apply sends a JSON merge patch).

The index and the per group-version documents follow k8s.io/kube-openapi/pkg/handler3/
handler.go (``paths`` of ``serverRelativeURL`` with a ``hash`` of the document, a 301 to the
current hash). A custom resource's document is built like k8s.io/apiextensions-apiserver/
pkg/controller/openapi/builder/builder.go: the CRD version's schema under the reversed-group
name (``dev.resumequal.v1alpha1.QualificationRun``) with metadata by reference, and the
routes of a resource (list, create, deletecollection, read, replace, patch, delete, status).
Built-in kinds get the same routes but no schema of their own (an open object): the
emulator carries none. Only parameters the emulator honours are listed; server-side apply
is not served, so ``application/apply-patch+yaml`` is not offered.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from .errors import ApiError
from .objects import clone
from .resources import Kind, Registry

META = "io.k8s.apimachinery.pkg.apis.meta.v1"
REF = "#/components/schemas/"
PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json")
STRATEGIC = "application/strategic-merge-patch+json"

_WRITE_PARAMS = (
    ("dryRun", "When present, indicates that modifications should not be persisted."),
    ("fieldManager", "A name associated with the actor or entity that is making these "
                     "changes."),
    ("fieldValidation", "How the server handles fields it does not know: Ignore, Warn "
                        "(the default) or Strict (the request fails)."),
)
_LIST_PARAMS = (
    ("labelSelector", "A selector to restrict the list of returned objects by their labels."),
    ("fieldSelector", "A selector to restrict the list of returned objects by their fields."),
    ("watch", "Watch for changes to the described resources."),
    ("resourceVersion", "Where a watch starts from."),
    ("timeoutSeconds", "Timeout for the list/watch call."),
    ("allowWatchBookmarks", "Requests watch events with type BOOKMARK."),
    ("sendInitialEvents", "Starts a watch with the current state as ADDED events."),
)
_DELETE_PARAMS = (
    ("dryRun", "When present, indicates that modifications should not be persisted."),
    ("gracePeriodSeconds", "The duration in seconds before the object should be deleted."),
    ("propagationPolicy", "Whether and how garbage collection will be performed: Orphan, "
                          "Background or Foreground."),
)


def gv_path(kind: Kind) -> str:
    """The index key of a kind's group-version: ``api/v1`` or ``apis/<group>/<version>``."""
    return f"apis/{kind.group}/{kind.version}" if kind.group else f"api/{kind.version}"


def schema_name(kind: Kind, suffix: str = "") -> str:
    """The component name of a kind (``io.k8s.api.core.v1.Pod``; reversed group for CRDs)."""
    if kind.custom:
        prefix = ".".join(reversed(kind.group.split(".")))
    elif kind.group == "apiextensions.k8s.io":
        prefix = "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions"
    else:
        prefix = f"io.k8s.api.{kind.group.split('.')[0] or 'core'}"
    return f"{prefix}.{kind.version}.{kind.kind}{suffix}"


def _gvk(kind: Kind, suffix: str = "") -> dict[str, str]:
    return {"group": kind.group, "version": kind.version, "kind": kind.kind + suffix}


def _params(pairs: Iterable[tuple[str, str]], where: str = "query") -> list[dict[str, Any]]:
    return [{"name": name, "in": where, "description": text, "schema": {"type": "string"},
             "required": where == "path", "uniqueItems": True} for name, text in pairs]


def _operation(kind: Kind, verb: str, action: str, params: list[dict[str, Any]], *,
               sub: str = "", body: Iterable[str] = (), returns: str = "") -> dict[str, Any]:
    scope = "Namespaced" if kind.namespaced else ""
    op: dict[str, Any] = {
        "operationId": f"{verb}{scope}{kind.kind}{sub.title()}",
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": _gvk(kind),
        "parameters": params,
        "responses": {"200": {"description": "OK", "content": {"application/json": {
            "schema": {"$ref": REF + (returns or schema_name(kind))}}}}},
    }
    body = list(body)
    if body:
        target = f"{META}.Patch" if action == "patch" else schema_name(kind)
        op["requestBody"] = {"content": {t: {"schema": {"$ref": REF + target}} for t in body},
                             "required": True}
    return op


def _paths(kind: Kind) -> dict[str, Any]:
    base = f"/{gv_path(kind)}"
    collection = (f"{base}/namespaces/{{namespace}}/{kind.plural}" if kind.namespaced
                  else f"{base}/{kind.plural}")
    scope = _params([("namespace", "object name and auth scope")], "path") if (
        kind.namespaced) else []
    named = scope + _params([("name", f"name of the {kind.kind}")], "path")
    patches = (*PATCH_TYPES, *(() if kind.custom else (STRATEGIC,)))
    write = _params(_WRITE_PARAMS)
    paths: dict[str, Any] = {
        collection: {
            "get": _operation(kind, "list", "list", scope + _params(_LIST_PARAMS),
                              returns=schema_name(kind, "List")),
            "post": _operation(kind, "create", "post", scope + write, body=["application/json"]),
            "delete": _operation(kind, "deletecollection", "deletecollection",
                                 scope + _params(_LIST_PARAMS + _DELETE_PARAMS),
                                 returns=f"{META}.Status"),
        },
        f"{collection}/{{name}}": {
            "get": _operation(kind, "read", "get", named),
            "put": _operation(kind, "replace", "put", named + write, body=["application/json"]),
            "patch": _operation(kind, "patch", "patch", named + write, body=patches),
            "delete": _operation(kind, "delete", "delete", named + _params(_DELETE_PARAMS)),
        },
    }
    if kind.namespaced:
        paths[f"{base}/{kind.plural}"] = {"get": _operation(
            kind, "list", "list", _params(_LIST_PARAMS), returns=schema_name(kind, "List"))}
        paths[f"{base}/{kind.plural}"]["get"]["operationId"] = f"list{kind.kind}ForAllNamespaces"
    if kind.status_subresource:
        paths[f"{collection}/{{name}}/status"] = {
            "get": _operation(kind, "read", "get", named, sub="status"),
            "put": _operation(kind, "replace", "put", named + write, sub="status",
                              body=["application/json"]),
            "patch": _operation(kind, "patch", "patch", named + write, sub="status",
                                body=patches),
        }
    return paths


def _kind_schema(kind: Kind) -> dict[str, Any]:
    schema: dict[str, Any] = clone(dict(kind.schema)) if kind.custom and kind.schema else {
        "type": "object", "x-kubernetes-preserve-unknown-fields": True,
        "description": f"{kind.kind} ({kind.api_version}); the emulator serves no schema "
                       "for built-in kinds."}
    props = schema.setdefault("properties", {})
    props["apiVersion"] = {"type": "string", "description": "APIVersion defines the "
                           "versioned schema of this representation of an object."}
    props["kind"] = {"type": "string", "description": "Kind is a string value representing "
                     "the REST resource this object represents."}
    props["metadata"] = {"allOf": [{"$ref": f"{REF}{META}.ObjectMeta"}], "default": {},
                         "description": "Standard object's metadata."}
    schema["x-kubernetes-group-version-kind"] = [_gvk(kind)]
    return schema


def _list_schema(kind: Kind) -> dict[str, Any]:
    return {"type": "object", "required": ["items"],
            "description": f"{kind.kind}List is a list of {kind.kind}",
            "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                           "items": {"type": "array",
                                     "items": {"$ref": REF + schema_name(kind)}},
                           "metadata": {"allOf": [{"$ref": f"{REF}{META}.ListMeta"}],
                                        "default": {}}},
            "x-kubernetes-group-version-kind": [_gvk(kind, "List")]}


_META_SCHEMAS: dict[str, Any] = {
    f"{META}.ObjectMeta": {"type": "object", "description": "ObjectMeta is metadata that all "
                           "persisted resources must have.",
                           "x-kubernetes-preserve-unknown-fields": True},
    f"{META}.ListMeta": {"type": "object", "description": "ListMeta describes metadata that "
                         "synthetic resources must have.",
                         "x-kubernetes-preserve-unknown-fields": True},
    f"{META}.Status": {"type": "object", "description": "Status is a return value for calls "
                       "that don't return other objects.",
                       "x-kubernetes-preserve-unknown-fields": True},
    f"{META}.Patch": {"type": "object", "description": "Patch is provided to give a concrete "
                      "name and type to the Kubernetes PATCH request body."},
}


def document(registry: Registry, path: str) -> dict[str, Any]:
    """The OpenAPI v3 document of one group-version (``api/v1``, ``apis/<g>/<v>``); 404
    when nothing is served there."""
    kinds = sorted((k for k in registry if gv_path(k) == path), key=lambda k: k.plural)
    if not kinds:
        raise ApiError.not_found_path(f"the server could not find the requested resource "
                                      f"(/openapi/v3/{path})")
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = dict(_META_SCHEMAS)
    for kind in kinds:
        paths.update(_paths(kind))
        schemas[schema_name(kind)] = _kind_schema(kind)
        schemas[schema_name(kind, "List")] = _list_schema(kind)
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "unversioned"},
            "paths": paths, "components": {"schemas": schemas}}


def encode(doc: dict[str, Any]) -> tuple[bytes, str]:
    """A document's bytes and its ETag (``computeETag``: SHA-512, upper-case hex)."""
    data = json.dumps(doc, separators=(",", ":")).encode()
    return data, hashlib.sha512(data).hexdigest().upper()


def index(registry: Registry) -> dict[str, Any]:
    """The ``/openapi/v3`` discovery document: each group-version's URL with its hash."""
    out = {}
    for path in sorted({gv_path(k) for k in registry}):
        _, etag = encode(document(registry, path))
        out[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={etag}"}
    return {"paths": out}
