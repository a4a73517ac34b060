"""A manifest judged against a structural schema as the API server judges it."""

from __future__ import annotations

from typing import Any

import pytest

from resumequal_operator.openapi import admitted, problems

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
        "count": {"type": "integer", "minimum": 1, "default": 1},
        "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "nullable": True},
        "mode": {"type": "string", "enum": ["a", "b"]},
        "size": {"x-kubernetes-int-or-string": True, "pattern": "^[0-9]+Gi$",
                 "anyOf": [{"type": "integer"}, {"type": "string"}]},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "object", "properties": {
            "key": {"type": "string"}}}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "params": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "maxCount": {"type": "integer"},
    },
}


def _found(value: dict[str, Any]) -> dict[str, str]:
    return {p.path: p.message for p in problems(admitted(value, SCHEMA), SCHEMA)}


def test_a_valid_object_has_no_problems() -> None:
    assert _found({"name": "ab", "count": 3.0, "ratio": None, "mode": "a", "size": "4Gi",
                   "tags": [{"key": "x"}], "labels": {"any": "v"},
                   "params": {"any_thing": [1]}}) == {}


@pytest.mark.parametrize(("value", "path", "message"), [
    ({}, "name", "is required"),
    ({"name": None}, "name", "is required"),
    ({"name": "abcdef"}, "name", "at most 5 characters"),
    ({"name": "AB"}, "name", "must match"),
    ({"name": "a", "count": 0}, "count", "at least 1"),
    ({"name": "a", "count": 1.5}, "count", "an integer"),
    ({"name": "a", "count": True}, "count", "an integer"),
    ({"name": "a", "ratio": 0}, "ratio", "greater than 0"),
    ({"name": "a", "mode": "c"}, "mode", "one of a, b"),
    ({"name": "a", "size": "4G"}, "size", "must match"),
    ({"name": "a", "size": 1.5}, "size", "an integer or a string"),
    ({"name": "a", "tags": [{}, {}, {}]}, "tags", "at most 2 items"),
    ({"name": "a", "tags": [None]}, "tags[0]", "must not be null"),
    ({"name": "a", "tags": [{"key": "x", "value": "y"}]}, "tags[0].value", "unknown field"),
    ({"name": "a", "labels": {"k": 1}}, "labels.k", "a string"),
    ({"name": "a", "max_count": 2}, "max_count", "camelCase: maxCount"),
])
def test_each_refusal_names_its_path(value: dict[str, Any], path: str, message: str) -> None:
    found = _found(value)
    assert path in found and message in found[path], found


def test_the_nulls_the_server_prunes_are_dropped() -> None:
    assert admitted({"name": "a", "count": None, "ratio": None}, SCHEMA) == {
        "name": "a", "ratio": None}
