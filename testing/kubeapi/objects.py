"""What every object gets from the server: timestamps, generated names, name and label
validation, and the few defaults of built-in kinds the operator can observe."""

from __future__ import annotations

import base64
import io
import pickle
import random
import re
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

from .errors import ApiError
from .resources import Kind

Obj = dict[str, Any]
T = TypeVar("T")
CRD_KEY = "customresourcedefinitions.apiextensions.k8s.io"

_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


def now_rfc3339() -> str:
    """The current time as the API server writes timestamps (seconds, UTC, ``Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(epoch: float) -> str:
    """A Unix time in the API server's timestamp format."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(stamp: str) -> float:
    """The Unix time of an API server timestamp."""
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def clone(value: T) -> T:
    """A deep copy of JSON-shaped data (dicts, lists, tuples, scalars): a pickle round trip
    in C, about twice as fast as a copy in Python and several times ``copy.deepcopy``, which
    matters for CRDs whose schemas run to thousands of nodes and for every object the
    emulator hands out. Without the pickler's memo (``fast``) a container reached twice is
    copied twice, as JSON would, so no two parts of a copy share anything."""
    if isinstance(value, str | int | float | bool | None):
        return value
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.fast = True
    pickler.dump(value)
    return cast(T, pickle.loads(buffer.getbuffer()))


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj``'s controller ownerReference names ``uid`` (metav1.GetControllerOf)."""
    return any(r.get("uid") == uid and r.get("controller")
               for r in obj["metadata"].get("ownerReferences") or [])


def generate_name(prefix: str, taken: Collection[str]) -> str:
    """``prefix`` plus five random characters, as for ``metadata.generateName``."""
    while True:
        name = prefix + "".join(random.choices(_GENERATE_ALPHABET, k=5))
        if name not in taken:
            return name


def validate_metadata(kind: Kind, meta: dict[str, Any]) -> None:
    """422 for names and labels the real server refuses."""
    name = meta["name"]
    limit = 63 if kind.plural == "namespaces" else 253
    if len(name) > limit or not _NAME_RE.match(name):
        raise ApiError.invalid(
            f'{kind.kind} "{name}" is invalid: metadata.name: Invalid value: "{name}": a '
            f"lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
            f"'-' or '.' (at most {limit} characters)", kind.kind, kind.group, name)
    for field in ("labels", "annotations"):
        values = meta.get(field) or {}
        if not isinstance(values, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
            raise ApiError.bad_request(f"metadata.{field} must map strings to strings")
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, label = key.rpartition("/")
        if len(label) > 63 or not _LABEL_NAME_RE.match(label) or len(prefix) > 253:
            raise ApiError.invalid(f'{kind.kind} "{name}" is invalid: metadata.labels: '
                                   f'Invalid value: "{key}": name part must be at most 63 '
                                   "characters of [-A-Za-z0-9_.]", kind.kind, kind.group, name)
        if len(value) > 63 or not _LABEL_VALUE_RE.match(value):
            raise ApiError.invalid(f'{kind.kind} "{name}" is invalid: metadata.labels: '
                                   f'Invalid value: "{value}": a valid label must be an empty '
                                   "string or at most 63 characters of [-A-Za-z0-9_.]",
                                   kind.kind, kind.group, name)


def apply_defaults(kind: Kind, obj: Obj) -> None:
    """The few server-side defaults the operator's code can observe (on create)."""
    meta = obj["metadata"]
    if kind.status_subresource and not kind.custom:
        obj["status"] = {}  # Go structs: a built-in object always has a status
    if kind.key == "pods":
        obj["status"] = {"phase": "Pending"}
    elif kind.key == "secrets" and "stringData" in obj:  # merged into data on write
        data = obj.setdefault("data", {})
        for key, value in obj.pop("stringData").items():
            data[key] = base64.b64encode(str(value).encode()).decode()
    elif kind.key == "namespaces":
        obj["status"] = {"phase": "Active"}
        meta.setdefault("labels", {})["kubernetes.io/metadata.name"] = meta["name"]
    elif kind.key == "jobs.batch":
        spec = obj.setdefault("spec", {})
        spec.setdefault("parallelism", 1)
        spec.setdefault("completions", 1)
        spec.setdefault("backoffLimit", 6)
        labels = {"batch.kubernetes.io/controller-uid": meta["uid"],
                  "batch.kubernetes.io/job-name": meta["name"],
                  "controller-uid": meta["uid"], "job-name": meta["name"]}
        template = spec.setdefault("template", {})
        template.setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        spec.setdefault("selector", {"matchLabels": {
            "batch.kubernetes.io/controller-uid": meta["uid"]}})
    elif kind.key == CRD_KEY:
        obj["status"] = {"conditions": [
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted"}],
            "acceptedNames": obj.get("spec", {}).get("names", {})}
