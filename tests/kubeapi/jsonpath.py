"""JSONPath as the API server evaluates printer columns (k8s.io/client-go/util/jsonpath).

The subset CRDs use in ``additionalPrinterColumns``: ``.a.b``, ``['a.b']``, ``[n]`` (negative
too), ``[start:end:step]``, ``[*]`` / ``.*``, ``..a`` and filters ``[?(@.a == "x")]`` with
``== != < > <= >=`` or existence ``[?(@.a)]``. Semantics follow client-go's jsonpath.go with
``AllowMissingKeys(true)`` (what the table convertor sets): a missing key yields no result;
an index out of range, a step on a non-list or a comparison of unlike types is an error,
which the caller turns into an empty cell. Unions (``[0,1]``) are not parsed.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any


class JSONPathError(ValueError):
    """An expression that cannot be parsed, or evaluated on this object."""


@dataclass(frozen=True)
class Step:
    """One step: ``field`` (name), ``recursive`` (name after ``..``), ``wildcard``,
    ``slice`` (start, end, step, derived end) or ``filter`` (left path, operator, right)."""

    kind: str
    args: tuple[Any, ...] = ()


_NAME = re.compile(r"[^\s.,\[\]${}()=!<>]+")
_FILTER = re.compile(r"\?\(\s*(@[^=!<>]*?)\s*(?:(==|!=|<=|>=|<|>)\s*(.+?))?\s*\)$")
_SLICE = re.compile(r"^(-?\d*)(?::(-?\d*))?(?::(-?\d*))?$")


def parse(expr: str) -> list[Step]:
    """The steps of ``expr`` (with or without the surrounding ``{}``)."""
    text = expr.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1].strip()
    if text.startswith("$"):
        text = text[1:]
    if text.startswith("@"):
        text = text[1:]
    steps: list[Step] = []
    i = 0
    while i < len(text):
        if text.startswith("..", i):
            m = _NAME.match(text, i + 2)
            if not m:
                raise JSONPathError(f"{expr!r}: a name must follow '..' at {i}")
            steps.append(Step("recursive", (m.group(),)))
            i = m.end()
        elif text[i] == ".":
            if text.startswith(".*", i):
                steps.append(Step("wildcard"))
                i += 2
                continue
            m = _NAME.match(text, i + 1)
            if m:
                steps.append(Step("field", (m.group(),)))
                i = m.end()
            else:
                i += 1  # a bare "." is the current object
        elif text[i] == "[":
            end = _closing(text, i, expr)
            steps.append(_bracket(text[i + 1:end].strip(), expr))
            i = end + 1
        else:
            raise JSONPathError(f"{expr!r}: unexpected {text[i]!r} at {i}")
    return steps


def _closing(text: str, start: int, expr: str) -> int:
    depth, quote = 0, ""
    for j in range(start, len(text)):
        c = text[j]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j
    raise JSONPathError(f"{expr!r}: unclosed '['")


def _bracket(inner: str, expr: str) -> Step:
    if inner == "*":
        return Step("wildcard")
    if len(inner) >= 2 and inner[0] == inner[-1] and inner[0] in "'\"":
        return Step("field", (inner[1:-1],))
    if inner.startswith("?"):
        m = _FILTER.match(inner)
        if not m:
            raise JSONPathError(f"{expr!r}: unsupported filter [{inner}]")
        left, op, right = m.groups()
        return Step("filter", (parse(left), op or "exists", _operand(right, expr)))
    m = _SLICE.match(inner)
    if not m or inner == "":
        raise JSONPathError(f"{expr!r}: unsupported subscript [{inner}]")
    start, end, step = (int(g) if g not in (None, "") else None for g in m.groups())
    if ":" not in inner:
        if start is None:
            raise JSONPathError(f"{expr!r}: empty subscript")
        # [n] is the slice [n:n+1]; an end of 0 derived from [-1] means "to the end".
        return Step("slice", (start, start + 1, None, True))
    return Step("slice", (start, end, step, False))


def _operand(text: str | None, expr: str) -> Any:
    if text is None:
        return None
    text = text.strip()
    if text.startswith("@"):
        return parse(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    raise JSONPathError(f"{expr!r}: cannot read {text!r} in a filter")


def find(data: Any, steps: list[Step]) -> list[Any]:
    """Every value ``steps`` reach from ``data`` (missing keys are skipped)."""
    values = [data]
    for step in steps:
        values = _apply(step, values)
    return values


def _apply(step: Step, values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if value is None:
            continue
        if step.kind == "field":
            if isinstance(value, dict) and step.args[0] in value:
                out.append(value[step.args[0]])
        elif step.kind == "wildcard":
            if isinstance(value, dict):
                out.extend(value.values())
            elif isinstance(value, list):
                out.extend(value)
        elif step.kind == "recursive":
            out.extend(v[step.args[0]] for v in _descendants(value)
                       if isinstance(v, dict) and step.args[0] in v)
        elif step.kind == "slice":
            out.extend(_slice(value, *step.args))
        elif step.kind == "filter":
            out.extend(_filter(value, *step.args))
    return out


def _descendants(value: Any) -> list[Any]:
    found = [value]
    children = value.values() if isinstance(value, dict) else value if isinstance(
        value, list) else []
    for child in children:
        found.extend(_descendants(child))
    return found


def _slice(value: Any, start: int | None, end: int | None, step: int | None,
           derived: bool) -> list[Any]:
    if not isinstance(value, list):
        raise JSONPathError(f"{type(value).__name__} is not array or slice")
    n = len(value)
    lo = 0 if start is None else start + n if start < 0 else start
    hi = n if end is None else end + n if end < 0 or (end == 0 and derived) else end
    if lo == hi:
        return []
    if not 0 <= lo < n or not 0 <= hi <= n:
        raise JSONPathError(f"array index out of bounds: index {lo}, length {n}")
    if lo > hi:
        raise JSONPathError(f"starting index {lo} is greater than ending index {hi}")
    if step is not None and step <= 0:
        raise JSONPathError("step must be > 0")
    return value[lo:hi:step or 1]


def _filter(value: Any, left: list[Step], op: str, right: Any) -> list[Any]:
    if not isinstance(value, list):
        raise JSONPathError(f"{type(value).__name__} is not array or slice and cannot be "
                            "filtered")
    out = []
    for item in value:
        lefts = find(item, left)
        if op == "exists":
            if lefts:
                out.append(item)
            continue
        rights = find(item, right) if isinstance(right, list) else [right]
        if not lefts or not rights:
            continue
        if len(lefts) > 1 or len(rights) > 1:
            raise JSONPathError("can only compare one element at a time")
        if _compare(lefts[0], op, rights[0]):
            out.append(item)
    return out


def _kind(value: Any) -> str:
    # Go's text/template compares only values of one basic kind (bool, int, float, string).
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return type(value).__name__


def _compare(a: Any, op: str, b: Any) -> bool:
    if _kind(a) != _kind(b) or _kind(a) not in ("bool", "int", "float", "string"):
        raise JSONPathError("incompatible types for comparison")
    if op == "==":
        return bool(a == b)
    if op == "!=":
        return bool(a != b)
    if _kind(a) == "bool":
        raise JSONPathError("invalid type for comparison")
    return bool({"<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op])


def text(value: Any) -> str:
    """One result as ``PrintResults`` writes it: strings as they are, maps and lists as
    compact JSON, numbers and booleans as Go's ``fmt.Fprint``, null as ``<no value>``."""
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    if value is None:
        return "<no value>"  # text/template's printableValue of an invalid value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_float(value)
    return str(value)


def go_float(x: float) -> str:
    """``fmt.Fprint(float64)``: the shortest digits, in %e form when the exponent is < -4
    or >= 6 (strconv's 'g' with the shortest precision)."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    sign = "-" if x < 0 else ""
    _, digit_tuple, exponent = Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    assert isinstance(exponent, int)
    point = len(digits) + exponent  # digits before the decimal point
    exp = point - 1
    if exp < -4 or exp >= 6:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"
