"""Label selectors (=, ==, !=, in, notin, exists, !exists) and field selectors (=, ==, !=)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApiError

# Field labels the real server accepts beyond metadata.name / metadata.namespace.
EXTRA_FIELDS: dict[str, frozenset[str]] = {
    "pods": frozenset({"status.phase", "spec.nodeName", "spec.restartPolicy",
                       "spec.schedulerName", "spec.serviceAccountName", "status.podIP",
                       "status.nominatedNodeName"}),
    "events": frozenset({"involvedObject.kind", "involvedObject.namespace",
                         "involvedObject.name", "involvedObject.uid",
                         "involvedObject.apiVersion", "involvedObject.resourceVersion",
                         "involvedObject.fieldPath", "reason", "reportingComponent", "source",
                         "type"}),
    "secrets": frozenset({"type"}),
    "namespaces": frozenset({"status.phase"}),
    "jobs.batch": frozenset({"status.successful"}),
}

_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\((.*)\)\s*$")
_OP_RE = re.compile(rf"^\s*({_KEY})\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")

Match = Callable[[Mapping[str, str]], bool]


def _split(selector: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


def _requirement(text: str) -> Match:
    if m := _SET_RE.match(text):
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        values.discard("")
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _OP_RE.match(text):
        key, op, value = m.group(1), m.group(2), m.group(3)
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS_RE.match(text):
        negate, key = m.group(1) == "!", m.group(2)
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise ApiError.bad_request(f"unable to parse requirement: {text.strip()!r}")


@dataclass(frozen=True)
class LabelSelector:
    """A parsed ``labelSelector`` query; the empty selector matches everything."""

    requirements: tuple[Match, ...]

    @classmethod
    def parse(cls, selector: str | None) -> LabelSelector:
        """Parse the query-string form; 400 on syntax errors."""
        return cls(tuple(_requirement(p) for p in _split(selector or "")))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj``'s labels satisfy every requirement."""
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(req(labels) for req in self.requirements)


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class FieldSelector:
    """A parsed ``fieldSelector`` query over the fields the real server indexes."""

    terms: tuple[tuple[str, bool, str], ...]  # (path, equal?, value)

    @classmethod
    def parse(cls, selector: str | None, kind_key: str) -> FieldSelector:
        """Parse; 400 for syntax errors or fields the server would not accept for the kind."""
        allowed = {"metadata.name", "metadata.namespace"} | EXTRA_FIELDS.get(kind_key, set())
        terms = []
        for part in _split(selector or ""):
            m = re.match(r"^\s*([A-Za-z.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
            if not m:
                raise ApiError.bad_request(f"invalid field selector: {part.strip()!r}")
            path, op, value = m.groups()
            if path not in allowed:
                raise ApiError.bad_request(
                    f'field label not supported: {path} (for resource "{kind_key}")')
            terms.append((path, op != "!=", value))
        return cls(tuple(terms))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether every term holds for ``obj``."""
        return all((_field(obj, path) == value) == equal for path, equal, value in self.terms)


@dataclass(frozen=True)
class Selector:
    """Label and field selector together, as a list or watch request carries them."""

    labels: LabelSelector
    fields: FieldSelector

    @classmethod
    def parse(cls, label_selector: str | None, field_selector: str | None,
              kind_key: str) -> Selector:
        """Parse both query parameters."""
        return cls(LabelSelector.parse(label_selector),
                   FieldSelector.parse(field_selector, kind_key))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is selected."""
        return self.labels.matches(obj) and self.fields.matches(obj)
