"""A spec from a mapping, a YAML or JSON file or text, and ``--set`` overrides, each
validated; pydantic's errors as lines that name the field."""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from resumequal.spec.qualification import QualificationSpec
from resumequal.spec.section import SpecError
from resumequal.spec.sections import PreemptionSpec
from resumequal.spec.yamlread import MAX_CHARS, YAMLInputError, load_yaml


def _step(tp: Any, part: int | str) -> tuple[int | str, Any]:
    """One step down a model's type along an error or ``--set`` path: ``part`` as it is
    written (a field's camelCase alias, whichever spelling was read) and the type below it."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        tp = options[0] if len(options) == 1 else None
    if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
        for name, field in tp.model_fields.items():
            if part in (name, field.alias):
                return field.alias or name, field.annotation
        return part, None
    if get_origin(tp) in (list, tuple) and isinstance(part, int):
        return part, get_args(tp)[0]
    if get_origin(tp) is dict:
        return part, get_args(tp)[1]
    return part, None


def error_lines(err: ValidationError, model: type[BaseModel]) -> list[tuple[str, str]]:
    """(field path, message) for each error of validating ``model``. Paths name fields in
    camelCase whichever spelling was read; an unknown field's message lists the allowed ones."""
    out = []
    for e in err.errors():
        tp: Any = model
        parent: Any = model
        parts: list[str] = []
        for i, part in enumerate(e["loc"]):
            parent = tp
            key, tp = _step(tp, part)
            if e["type"] == "extra_forbidden" and i == len(e["loc"]) - 1:
                key = part  # the unknown key, as written
            parts.append(str(key))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = _unknown_field(parent, str(e["loc"][-1]) if e["loc"] else "")
        out.append((".".join(parts), msg))
    return out


def _unknown_field(parent: Any, key: str) -> str:
    if not (isinstance(parent, type) and issubclass(parent, BaseModel)):
        return "unknown field"
    field = parent.model_fields.get(key)
    if field is not None and field.alias and field.alias != key:
        # A Python name is read unless its alias is there too: the field came twice.
        return f"given twice, as {field.alias} and {key}"
    allowed = sorted(f.alias or name for name, f in parent.model_fields.items())
    return f"unknown field; allowed: {', '.join(allowed)}"


def format_validation_error(err: ValidationError, source: str,
                            model: type[BaseModel] | None = None) -> str:
    """Render pydantic errors of validating ``model`` (a QualificationSpec by default) as
    'source: field.path: message' lines."""
    return "\n".join(f"{source}: {path or '<top level>'}: {msg}"
                     for path, msg in error_lines(err, model or QualificationSpec))


def parse_spec(data: Any, source: str = "spec") -> QualificationSpec:
    """Validate a mapping into a spec, raising SpecError that names every bad field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the spec must be a mapping, got {type(data).__name__}")
    try:
        return QualificationSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from e


def load_spec(path: str | Path) -> QualificationSpec:
    """Load a spec from a YAML or JSON file (read through :mod:`resumequal.spec.yamlread`)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CHARS + 1)
    except FileNotFoundError as e:
        raise SpecError(f"spec file not found: {p}") from e
    except OSError as e:
        raise SpecError(f"cannot read spec file {p}: {e.strerror}") from e
    return spec_from_text(raw, source=str(p))


def spec_from_text(raw: bytes | str, source: str = "spec") -> QualificationSpec:
    """Validate the YAML or JSON text of a spec; SpecError names the source and field."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
        data = load_yaml(text)
    except UnicodeDecodeError as e:
        raise SpecError(f"{source}: not valid YAML/JSON: {e}") from e
    except YAMLInputError as e:
        raise SpecError(f"{source}: {e}") from e
    return parse_spec(data, source=source)


def apply_overrides(
    spec: QualificationSpec, overrides: tuple[str, ...] | list[str]
) -> QualificationSpec:
    """Apply ``path.to.field=value`` overrides (values parsed as YAML) and revalidate."""
    data = spec.model_dump(mode="json")
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise SpecError(f"--set {item!r}: expected PATH=VALUE, e.g. preemption.step=6")
        try:
            value = load_yaml(raw)
        except YAMLInputError as e:
            raise SpecError(f"--set {item!r}: {e}") from e
        node: Any = data
        tp: Any = QualificationSpec
        # Either spelling of a field sets the key the dump wrote (its camelCase alias).
        keys = []
        for part in path.split("."):
            key, tp = _step(tp, part)
            keys.append(str(key))
        for key in keys[:-1]:
            if not isinstance(node, dict):
                raise SpecError(f"--set {item!r}: {key!r} is not a section")
            if node.get(key) is None:  # an optional section not set yet (workload.loader)
                node[key] = {}
            node = node[key]
        if not isinstance(node, dict):
            raise SpecError(f"--set {item!r}: {keys[-2]!r} is not a section")
        node[keys[-1]] = value
    return parse_spec(data, source="--set")


def with_preemption(spec: QualificationSpec, **changes: Any) -> QualificationSpec:
    """``spec`` with another cut (validated like any spec)."""
    data = spec.model_dump(mode="json")
    data["preemption"].update(
        {PreemptionSpec.model_fields[k].alias or k: v for k, v in changes.items()})
    return parse_spec(data, source="scenario")
