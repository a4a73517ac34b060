"""Pruning of custom resources against their CRD's structural schema, as the real server does.

Fields the schema does not declare are dropped silently (the real server answers with a
warning only), unless ``x-kubernetes-preserve-unknown-fields`` keeps them. An ``object``
without ``properties``/``additionalProperties`` keeps nothing, which is exactly the trap
a status model that drifted from its CRD falls into. ``apiVersion``, ``kind`` and
``metadata`` at the root (and in ``x-kubernetes-embedded-resource`` objects) are kept.
Value validation (types, enums, required) is left to the validators tests register.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ALWAYS = ("apiVersion", "kind", "metadata")


def prune(obj: dict[str, Any], schema: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A copy of ``obj`` without the fields ``schema`` does not allow, and their JSON paths."""
    dropped: list[str] = []
    out = _prune(obj, schema, "", dropped, embedded=True)
    return (out if isinstance(out, dict) else obj), dropped


def _prune(value: Any, schema: Mapping[str, Any], path: str, dropped: list[str], *,
           embedded: bool = False) -> Any:
    if schema.get("x-kubernetes-int-or-string"):
        return value
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            return [_prune(x, items, f"{path}[{i}]", dropped) for i, x in enumerate(value)]
        return value
    if not isinstance(value, dict):
        return value
    properties = schema.get("properties")
    additional = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    embedded = embedded or bool(schema.get("x-kubernetes-embedded-resource"))
    out: dict[str, Any] = {}
    for key, item in value.items():
        child = f"{path}.{key}"
        if isinstance(properties, Mapping) and key in properties:
            if embedded and key == "metadata":
                out[key] = item
            else:
                out[key] = _prune(item, properties[key], child, dropped)
        elif embedded and key in _ALWAYS:
            out[key] = item
        elif isinstance(additional, Mapping):
            out[key] = _prune(item, additional, child, dropped)
        elif preserve or additional is True:
            out[key] = item
        else:
            dropped.append(child)
    return out
