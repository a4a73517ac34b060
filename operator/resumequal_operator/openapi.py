"""A manifest judged against a CRD's structural OpenAPI v3 schema, as the API server judges it.

``kubectl apply`` asks for strict field validation: a field the schema does not declare is
refused (``unknown field "spec.world.nproc_per_node"``), where pruning would drop it, and a
value of the wrong type, outside an enum or a bound, or against a pattern is refused too.
The pydantic models accept more (snake_case names beside the camelCase ones), so
``resumequal-operator render`` asks this first. Only the keywords :mod:`.crd` writes are
understood; ``format`` is left to the models.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from pydantic.alias_generators import to_camel

from resumequal_operator.validation import Problem

Schema = Mapping[str, Any]

_JSON_TYPES = {"object": "an object", "array": "a list", "string": "a string",
               "integer": "an integer", "number": "a number", "boolean": "a boolean"}


def admitted(value: Any, schema: Schema) -> Any:
    """``value`` as the server stores it before defaulting: without the nulls of fields that
    are not ``nullable`` (pruned, then defaulted where the schema has a default)."""
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [admitted(item, schema["items"]) for item in value]
    if not isinstance(value, dict):
        return value
    out = {}
    for key, item in value.items():
        sub = _field(schema, key)
        if sub is None:
            out[key] = item  # unknown or kept as is: problems() judges it
        elif item is not None or sub.get("nullable"):
            out[key] = admitted(item, sub)
    return out


def problems(value: Any, schema: Schema, path: str = "") -> list[Problem]:
    """Every reason the API server would refuse ``value`` (:func:`admitted`) under
    ``schema``, each at its path (``spec.world.nnodes``, ``spec.tolerations[0].key``)."""
    if value is None:
        return [] if schema.get("nullable") else [_problem(path, "must not be null")]
    if schema.get("x-kubernetes-int-or-string"):
        if not _is(value, "integer") and not isinstance(value, str):
            return [_problem(path, "must be an integer or a string")]
        return _string(value, schema, path) if isinstance(value, str) else []
    kind = schema.get("type")
    if isinstance(kind, str) and not _is(value, kind):
        return [_problem(path, f"must be {_JSON_TYPES.get(kind, kind)}, not "
                         f"{type(value).__name__} {value!r}"[:200])]
    out: list[Problem] = []
    if "enum" in schema and value not in schema["enum"]:
        out.append(_problem(path, f"must be one of {', '.join(map(str, schema['enum']))}"))
    if isinstance(value, str):
        out += _string(value, schema, path)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        out += _number(value, schema, path)
    elif isinstance(value, list):
        out += _array(value, schema, path)
    elif isinstance(value, dict):
        out += _object(value, schema, path)
    return out


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        # JSON has one number type; the server takes 3.0 as the integer 3.
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    types: dict[str, type | tuple[type, ...]] = {"object": dict, "array": list,
                                                  "string": str, "boolean": bool}
    return isinstance(value, types.get(kind, object))


def _string(value: str, schema: Schema, path: str) -> list[Problem]:
    out = []
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        out.append(_problem(path, f"may be at most {schema['maxLength']} characters long"))
    if "minLength" in schema and len(value) < schema["minLength"]:
        out.append(_problem(path, f"must be at least {schema['minLength']} characters long"))
    if "pattern" in schema and not _compiled(schema["pattern"]).search(value):
        out.append(_problem(path, f"must match {schema['pattern']}"))
    return out


def _number(value: float, schema: Schema, path: str) -> list[Problem]:
    out = []
    if "minimum" in schema:
        low = schema["minimum"]
        if value < low or (schema.get("exclusiveMinimum") is True and value == low):
            word = "greater than" if schema.get("exclusiveMinimum") is True else "at least"
            out.append(_problem(path, f"must be {word} {low}"))
    if "maximum" in schema:
        high = schema["maximum"]
        if value > high or (schema.get("exclusiveMaximum") is True and value == high):
            word = "less than" if schema.get("exclusiveMaximum") is True else "at most"
            out.append(_problem(path, f"must be {word} {high}"))
    return out


def _array(value: list[Any], schema: Schema, path: str) -> list[Problem]:
    out = []
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        out.append(_problem(path, f"may hold at most {schema['maxItems']} items"))
    if "minItems" in schema and len(value) < schema["minItems"]:
        out.append(_problem(path, f"must hold at least {schema['minItems']} items"))
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            out += problems(item, items, f"{path}[{i}]")
    return out


def _object(value: dict[Any, Any], schema: Schema, path: str) -> list[Problem]:
    out = [_problem(_join(path, key), "is required") for key in schema.get("required", ())
           if key not in value]
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        out.append(_problem(path, f"may hold at most {schema['maxProperties']} entries"))
    keep = bool(schema.get("x-kubernetes-preserve-unknown-fields")) or schema.get(
        "additionalProperties") is True
    for key, item in value.items():
        sub = _field(schema, key)
        if sub is not None:
            out += problems(item, sub, _join(path, key))
        elif not keep:
            out.append(_unknown(path, key, schema.get("properties") or {}))
    return out


def _field(schema: Schema, key: object) -> Schema | None:
    """The schema of an object's field ``key``; None where the schema does not declare it."""
    properties: Schema = schema.get("properties") or {}
    if isinstance(key, str) and key in properties:
        sub: Schema = properties[key]
        return sub
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def _unknown(path: str, key: object, properties: Schema) -> Problem:
    camel = to_camel(key) if isinstance(key, str) else None
    hint = f" (fields are camelCase: {camel})" if camel in properties else ""
    return _problem(_join(path, key), f"unknown field; the API server refuses it{hint}")


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _problem(path: str, message: str) -> Problem:
    return Problem(path=path or "(document)", message=message)


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)
