"""What ``kubectl`` reads besides objects: custom resources printed as ``meta.k8s.io/v1``
Tables (``kubectl get``) and the OpenAPI v3 documents ``kubectl apply`` checks for
server-side field validation. Only what kubectl 1.32 reads is served.

Tables follow k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor/
tableconvertor.go: a Name column, then one per ``additionalPrinterColumns`` entry (an Age
column when a version has none, apihelpers ``serveDefaultColumnsIfEmpty``), each cell the
first result of its JSONPath (client-go util/jsonpath, ``AllowMissingKeys(true)``), typed by
``cellForJSONValue``; rows carry ``PartialObjectMetadata`` (handlers/response.go ``asTable``).
Built-in kinds are printed client-side by kubectl from plain JSON.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from .errors import ApiError
from .resources import Kind, Registry

AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

# The JSONPath the CRDs here use (``.a.b``, ``[i]``, ``[lo:hi]``); a path beyond that prints
# an empty cell, which a test comparing kubectl's output would notice.
_STEP = re.compile(r"\.([\w-]+)|\[(-?\d*)(:?)(-?\d*)\]")


def parse_path(path: str) -> list[tuple[str, int | None, int | None, bool]]:
    """The steps of a printer column's path: (field, start, end, is-slice)."""
    steps, i = [], 0
    while i < len(path):
        m = _STEP.match(path, i)
        if m is None:
            raise ValueError(f"{path!r}: JSONPath beyond .field, [i] and [lo:hi] is not "
                             "emulated")
        lo, colon, hi = m.group(2), m.group(3), m.group(4)
        steps.append((m.group(1) or "", int(lo) if lo else None, int(hi) if hi else None,
                      bool(colon)))
        i = m.end()
    return steps


def find(obj: Any, path: str) -> list[Any]:
    """client-go's results for ``path``: a missing key gives none; an index out of range
    or on a non-list raises ValueError (jsonpath.go ``evalArray``: ``[i]`` is ``[i:i+1]``)."""
    values = [obj]
    for name, lo, hi, is_slice in parse_path(path):
        out: list[Any] = []
        for v in values:
            if name:
                if isinstance(v, dict) and name in v:
                    out.append(v[name])
                continue
            if not isinstance(v, list):
                raise ValueError(f"{type(v).__name__} is not array or slice")
            n = len(v)
            start = 0 if lo is None else lo + n if lo < 0 else lo
            end = (start + 1 if not is_slice else n if hi is None else hi + n if hi < 0 else hi)
            if start == end:
                continue
            if not (0 <= start < n and 0 <= end <= n and start <= end):
                raise ValueError(f"array index out of bounds: index {start}, length {n}")
            out.extend(v[start:end])
        values = out
    return values


def human_duration(seconds: float) -> str:
    """apimachinery's ``duration.HumanDuration``: about 2-3 significant figures."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes, hours = s // 60, s // 3600
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    years, days = hours // 24 // 365, hours // 24 % 365
    return f"{years}y{days}d" if days and hours < 24 * 365 * 8 else f"{years}y"


def _age(stamp: str, now: float) -> str:
    """``metav1.Time.UnmarshalQueryParameter`` then ``ConvertToHumanReadableDateType``."""
    if stamp in ("", "null"):
        return "<unknown>"
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    return "<invalid>" if when.tzinfo is None else human_duration(now - when.timestamp())


def _cell(kind: str, value: Any, now: float) -> Any:
    """``cellForJSONValue``; a string column prints maps and lists as compact JSON."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":  # jsonpath.go PrintResults; null is text/template's "<no value>"
        return value if isinstance(value, str) else "<no value>" if value is None else (
            json.dumps(value, separators=(",", ":")))
    if kind == "integer" and number:
        return int(value)
    if kind == "number" and number:
        return float(value)
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "date" and isinstance(value, str):
        return _age(value, now)
    return None


def columns(kind: Kind) -> list[dict[str, Any]]:
    """The column definitions of a kind's Table: Name, then its printer columns."""
    out = [{"name": "Name", "type": "string", "format": "name", "priority": 0,
            "description": "Name must be unique within a namespace."}]
    for col in kind.printer_columns or (AGE,):
        out.append({"name": col["name"], "type": col.get("type", "string"),
                    "format": col.get("format", ""), "priority": int(col.get("priority", 0)),
                    "description": col.get("description") or "Custom resource definition "
                    f"column (in JSONPath format): {col['jsonPath']}",
                    "jsonPath": col["jsonPath"]})
    return out


def cells(obj: Mapping[str, Any], cols: Sequence[Mapping[str, Any]], now: float) -> list[Any]:
    """One row: the name, then each column's first result (null when there is none)."""
    row: list[Any] = [obj["metadata"]["name"]]
    for col in cols[1:]:
        try:
            found = find(obj, col["jsonPath"])
        except ValueError:
            found = []
        row.append(_cell(col["type"], found[0], now) if found else None)
    return row


def table(objects: Sequence[Mapping[str, Any]], kind: Kind, *, resource_version: str,
          include: str | None = None, headers: bool = True,
          now: float | None = None) -> dict[str, Any]:
    """A Table of ``objects``; ``includeObject`` Object, Metadata (default) or None."""
    if include not in (None, "", "Object", "Metadata", "None"):
        raise ApiError.bad_request(f'unrecognized includeObject value: "{include}"')
    cols, at = columns(kind), time.time() if now is None else now
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": cells(obj, cols, at)}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version},
            # Watches send the definitions with their first event only (TableOptions.NoHeaders).
            "columnDefinitions": [{k: v for k, v in c.items() if k != "jsonPath"}
                                  for c in cols] if headers else None,
            "rows": rows}


def wants_table(accept: str | None) -> bool:
    """Whether ``Accept`` asks for a meta.k8s.io/v1 Table before plain JSON: the first
    clause the server can serve wins (k8s.io/apiserver/pkg/endpoints/handlers/negotiation)."""
    for clause in (accept or "").split(","):
        media, *params = [p.strip() for p in clause.split(";")]
        args = dict(p.split("=", 1) for p in params if "=" in p)
        if media not in ("application/json", "application/*", "*/*"):
            continue
        if "as" not in args:
            return False
        if (args["as"], args.get("g"), args.get("v")) == ("Table", "meta.k8s.io", "v1"):
            return True
    return False


# -------------------------------------------------------------------------- OpenAPI v3

def _gv(kind: Kind) -> str:
    return f"apis/{kind.group}/{kind.version}" if kind.group else f"api/{kind.version}"


def openapi_document(registry: Registry, gv: str) -> dict[str, Any]:
    """One group-version's document, reduced to what kubectl reads: each kind's PATCH
    operation with its group-version-kind and query parameters
    (k8s.io/cli-runtime/pkg/resource/query_param_verifier_v3.go ``supportsQueryParamV3``:
    ``fieldValidation`` there makes kubectl send ``fieldValidation=Strict`` and leave
    validation to the server). 404 when nothing is served there."""
    kinds = [k for k in registry if _gv(k) == gv]
    if not kinds:
        raise ApiError.not_found_path("the server could not find the requested resource "
                                      f"(/openapi/v3/{gv})")
    paths = {}
    for k in kinds:
        scope = "/namespaces/{namespace}" if k.namespaced else ""
        paths[f"/{gv}{scope}/{k.plural}/{{name}}"] = {"patch": {
            "x-kubernetes-group-version-kind": {"group": k.group, "version": k.version,
                                                "kind": k.kind},
            "parameters": [{"name": p, "in": "query", "schema": {"type": "string"}}
                           for p in ("fieldManager", "fieldValidation")],
            # Only JSON merge patch is served (:mod:`.patch`): what kubectl apply sends a
            # custom resource (kubectl/pkg/cmd/apply/patcher.go).
            "requestBody": {"content": {"application/merge-patch+json": {
                "schema": {"type": "object"}}}}}}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "unversioned"},
            "paths": paths}


def openapi_index(registry: Registry) -> dict[str, Any]:
    """``/openapi/v3``: each group-version's URL with the hash of its document
    (k8s.io/kube-openapi/pkg/handler3/handler.go)."""
    out = {}
    for gv in sorted({_gv(k) for k in registry}):
        data = json.dumps(openapi_document(registry, gv), separators=(",", ":")).encode()
        out[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash="
                                        f"{hashlib.sha512(data).hexdigest().upper()}"}
    return {"paths": out}
