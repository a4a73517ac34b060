"""Label and field selectors, reduced to what is sent: the operator lists by label equality
(``a=b,c=d``) and ``kubectl describe`` lists Events by ``involvedObject.*`` fields. Set-based
requirements (``in``, ``notin``, ``exists``) and other field labels are answered 400 (not
emulated) rather than matched wrongly."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

# Field labels beyond metadata.name / metadata.namespace (pkg/registry/core/event/strategy.go
# ToSelectableFields).
EVENT_FIELDS = frozenset({"involvedObject.kind", "involvedObject.namespace",
                          "involvedObject.name", "involvedObject.uid",
                          "involvedObject.apiVersion", "involvedObject.resourceVersion",
                          "involvedObject.fieldPath", "reason", "reportingComponent", "source",
                          "type"})
_TERM = re.compile(r"^\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")

Term = tuple[str, bool, str]  # (label key or field path, equal?, value)


def _terms(selector: str | None, what: str) -> tuple[Term, ...]:
    terms = []
    for part in (selector or "").split(","):
        if not part.strip():
            continue
        m = _TERM.match(part)
        if not m:
            raise ApiError.bad_request(f"{what} {part.strip()!r}: only =, == and != are emulated")
        terms.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return tuple(terms)


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Selector:
    """The ``labelSelector`` and ``fieldSelector`` of a list or watch request."""

    labels: tuple[Term, ...]
    fields: tuple[Term, ...]

    @classmethod
    def parse(cls, label_selector: str | None, field_selector: str | None,
              kind_key: str) -> Selector:
        """Parse both query parameters; 400 for what is not emulated or not a field label."""
        fields = _terms(field_selector, "field selector")
        allowed = {"metadata.name", "metadata.namespace"} | (
            EVENT_FIELDS if kind_key == "events" else set())
        for path, _, _ in fields:
            if path not in allowed:
                raise ApiError.bad_request(
                    f'field label not supported: {path} (for resource "{kind_key}")')
        return cls(_terms(label_selector, "label selector"), fields)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is selected (a missing label matches ``!=``, as upstream)."""
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all((labels.get(k) == v) == eq for k, eq, v in self.labels) and all(
            (_field(obj, path) == v) == eq for path, eq, v in self.fields)
