"""Server-side printing: custom resources as ``meta.k8s.io/v1`` Tables, what ``kubectl get``
asks for with ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io``.

Follows k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor/
tableconvertor.go (a Name column, then one column per ``additionalPrinterColumns`` entry
evaluated with client-go's JSONPath, missing keys allowed; ``cellForJSONValue`` for typed
cells), apihelpers' ``serveDefaultColumnsIfEmpty`` (an Age column when a version declares
none) and k8s.io/apiserver/pkg/endpoints/handlers/response.go ``asTable`` (row objects as
``PartialObjectMetadata`` unless ``includeObject`` says Object or None). Built-in kinds have
their own printers upstream; the emulator does not reproduce them and answers JSON instead.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from . import jsonpath
from .errors import ApiError

# metav1.ObjectMeta's swagger documentation of the fields the columns show.
NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, although "
    "some resources may allow a client to request the generation of an appropriate name "
    "automatically. Name is primarily intended for creation idempotence and configuration "
    "definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
CREATION_DESCRIPTION = (
    "CreationTimestamp is a timestamp representing the server time when this object was "
    "created. It is not guaranteed to be set in happens-before order across separate "
    "operations. Clients may not set this value. It is represented in RFC3339 form and is "
    "in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: "
    "https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md"
    "#metadata")
DEFAULT_COLUMNS: tuple[Mapping[str, Any], ...] = (
    {"name": "Age", "type": "date", "description": CREATION_DESCRIPTION,
     "jsonPath": ".metadata.creationTimestamp"},
)
INCLUDE_OBJECT = ("Object", "Metadata", "None")


@dataclass(frozen=True)
class Column:
    """One printer column: its definition as a Table shows it, and its parsed JSONPath."""

    definition: dict[str, Any]
    steps: tuple[jsonpath.Step, ...] | None  # None: the path does not parse (empty cells)


def columns(printer_columns: Sequence[Mapping[str, Any]]) -> list[Column]:
    """The Name column plus a CRD version's printer columns (an Age column when empty)."""
    out = [Column({"name": "Name", "type": "string", "format": "name",
                   "description": NAME_DESCRIPTION, "priority": 0}, ())]
    for col in printer_columns or DEFAULT_COLUMNS:
        path = str(col.get("jsonPath", ""))
        try:
            steps: tuple[jsonpath.Step, ...] | None = tuple(jsonpath.parse(path))
        except jsonpath.JSONPathError:
            steps = None
        description = col.get("description") or (
            f"Custom resource definition column (in JSONPath format): {path}")
        out.append(Column({"name": col["name"], "type": col.get("type", "string"),
                           "format": col.get("format", ""), "description": description,
                           "priority": int(col.get("priority", 0))}, steps))
    return out


def human_duration(seconds: float) -> str:
    """apimachinery's ``duration.HumanDuration``: about 2-3 significant figures."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, hours // 24 % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // 24 // 365}y"


def _age(stamp: str, now: float) -> str:
    """``metav1.Time.UnmarshalQueryParameter`` then ``ConvertToHumanReadableDateType``."""
    if stamp in ("", "null"):
        return "<unknown>"
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    if when.tzinfo is None:
        return "<invalid>"  # RFC 3339 needs an offset
    return human_duration(now - when.timestamp())


def _typed(kind: str, value: Any, now: float) -> Any:
    """``cellForJSONValue``: the value as the column's type, or null."""
    if kind == "integer" and isinstance(value, int | float) and not isinstance(value, bool):
        return int(value)
    if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind == "boolean" and isinstance(value, bool):
        return value
    if kind == "string" and isinstance(value, str):
        return value
    if kind == "date" and isinstance(value, str):
        return _age(value, now)
    return None


def cells(obj: Mapping[str, Any], cols: Sequence[Column], now: float) -> list[Any]:
    """One row's cells: the name, then each column's first JSONPath result."""
    row: list[Any] = [obj["metadata"]["name"]]
    for col in cols[1:]:
        try:
            found = jsonpath.find(obj, list(col.steps)) if col.steps is not None else []
        except jsonpath.JSONPathError:
            found = []
        if not found:
            row.append(None)
        elif col.definition["type"] == "string":
            row.append(jsonpath.text(found[0]))
        else:
            row.append(_typed(col.definition["type"], found[0], now))
    return row


def _row_object(obj: Mapping[str, Any], include: str, api_version: str) -> Any:
    if include == "Object":
        return obj
    if include == "None":
        return None
    return {"kind": "PartialObjectMetadata", "apiVersion": api_version,
            "metadata": obj["metadata"]}


def include_object(value: str | None) -> str:
    """The ``includeObject`` query parameter (default Metadata); 400 for another value."""
    if value in (None, ""):
        return "Metadata"
    if value not in INCLUDE_OBJECT:
        raise ApiError.bad_request(f'unrecognized includeObject value: "{value}"')
    return value


def table(objects: Sequence[Mapping[str, Any]], cols: Sequence[Column], *,
          resource_version: str, api_version: str = "meta.k8s.io/v1", include: str = "Metadata",
          headers: bool = True, now: float | None = None) -> dict[str, Any]:
    """A Table of ``objects`` (a list, or one object, or one watch event's object)."""
    at = time.time() if now is None else now
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": cells(obj, cols, at)}
        shown = _row_object(obj, include, api_version)
        if shown is not None:
            row["object"] = shown
        rows.append(row)
    return {"kind": "Table", "apiVersion": api_version,
            "metadata": {"resourceVersion": resource_version},
            # Watches send the definitions with their first event only (TableOptions.NoHeaders).
            "columnDefinitions": [c.definition for c in cols] if headers else None,
            "rows": rows}


def negotiate(accept: str | None) -> str | None:
    """The Table version an ``Accept`` header asks for before plain JSON, if any: the first
    acceptable clause wins, as in k8s.io/apiserver/pkg/endpoints/handlers/negotiation."""
    for clause in (accept or "").split(","):
        media, *params = [p.strip() for p in clause.split(";")]
        args = dict(p.split("=", 1) for p in params if "=" in p)
        if media not in ("application/json", "application/*", "*/*"):
            continue
        if "as" not in args:
            return None
        if (args.get("as"), args.get("g")) == ("Table", "meta.k8s.io") and args.get("v") in (
                "v1", "v1beta1"):
            return f"meta.k8s.io/{args['v']}"
        # Other conversions (PartialObjectMetadata) are not served: try the next clause.
    return None
