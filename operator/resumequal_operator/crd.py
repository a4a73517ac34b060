"""The QualificationRun CRD, generated from the pydantic models in :mod:`.resource`.

Kubernetes wants a *structural* OpenAPI v3 schema: every node typed, no ``$ref``, no
``anyOf`` beyond the int-or-string form, ``nullable`` instead of ``null`` types, draft-4
style exclusive bounds. :func:`structural` turns pydantic's JSON Schema into that.

``python -m resumequal_operator.crd --write`` refreshes the chart's copy; a test checks it
is current.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, TypeAdapter

from resumequal_operator.resource import (
    GROUP,
    KIND,
    PLURAL,
    SINGULAR,
    VERSION,
    QualificationRunSpec,
)
from resumequal_operator.runstatus import QualificationRunStatus

Schema = dict[str, Any]

CRD_NAME = f"{PLURAL}.{GROUP}"
CHART_CRD = Path(__file__).resolve().parents[2] / "charts/resumequal/crds" / f"{CRD_NAME}.yaml"
HEADER = "# Generated from resumequal_operator.resource (resumequal-operator crd); do not edit.\n"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Verdict", "type": "string", "jsonPath": ".status.verdict.result"},
    {"name": "First divergence", "type": "string",
     "jsonPath": ".status.verdict.firstDivergenceSummary"},
    {"name": "Pin", "type": "string", "jsonPath": ".status.pin"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# JSON Schema keywords with no place (or no meaning) in a CRD schema.
_DROPPED = frozenset({"title", "propertyNames", "$defs", "examples"})


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline ``$ref``; siblings of the reference (a field's description) win."""
    ref = node.get("$ref")
    if ref is None:
        return node
    target = defs[ref.removeprefix("#/$defs/")]
    merged = {**copy.deepcopy(target), **{k: v for k, v in node.items() if k != "$ref"}}
    return _resolve(merged, defs)


def _int_or_string(options: list[Schema]) -> Schema | None:
    types = sorted(str(o.get("type")) for o in options)
    if types != ["integer", "string"]:
        return None
    # Bounds and patterns of either branch apply to the node (a pattern only to strings).
    return {"x-kubernetes-int-or-string": True,
            **{k: v for o in options for k, v in o.items() if k != "type"}}


def structural(node: Schema, defs: dict[str, Schema]) -> Schema:
    """One pydantic JSON Schema node as a structural OpenAPI v3 schema node."""
    node = _resolve(node, defs)
    out: Schema = {}
    options = node.get("anyOf")
    if options is not None:
        options = [_resolve(o, defs) for o in options]
        nullable = any(o.get("type") == "null" for o in options)
        rest = [o for o in options if o.get("type") != "null"]
        merged = _int_or_string(rest) if len(rest) == 2 else (rest[0] if len(rest) == 1 else None)
        if merged is None:
            raise ValueError(f"no structural form for anyOf {options}")
        siblings = {k: v for k, v in node.items() if k != "anyOf"}
        out = structural({**merged, **siblings}, defs)
        if out.get("x-kubernetes-int-or-string"):
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        if nullable:
            out["nullable"] = True
        if out.get("default", 0) is None:
            del out["default"]  # null is what an absent nullable field means anyway
        return out
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "properties":
            out[key] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        elif key == "prefixItems":
            # Fixed-length tuples of one type (e.g. Adam's betas): items plus the bounds.
            kinds = [structural(sub, defs) for sub in value]
            if any(k != kinds[0] for k in kinds):
                raise ValueError(f"no structural form for a mixed tuple {value}")
            out["items"] = kinds[0]
        elif key == "additionalProperties":
            if value is True:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = structural(value, defs)
            # False (extra="forbid") is implied: the API server prunes unknown fields and
            # strict field validation (kubectl's default) rejects them.
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "description":
            out[key] = " ".join(value.split())
        else:
            out[key] = value
    shapeless = "properties" not in out and "additionalProperties" not in out
    if out.get("type") == "object" and shapeless:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _factory_defaults(model: type[BaseModel], schema: Schema) -> None:
    """Defaults pydantic builds with a factory, which its JSON Schema leaves out: ``{}`` for
    a section (the server then fills in the section's own defaults), and non-empty lists.
    So a stored QualificationRun shows the whole configuration it ran with."""
    for name, field in model.model_fields.items():
        node = schema["properties"][field.alias or name]
        ann = field.annotation
        if field.default_factory is not None:
            value = field.default_factory()  # type: ignore[call-arg]
            if isinstance(value, BaseModel):
                node["default"] = {}
            elif value:
                node["default"] = TypeAdapter(type(value)).dump_python(value, mode="json")
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            _factory_defaults(ann, node)


def _model_schema(model: type[QualificationRunSpec] | type[QualificationRunStatus]) -> Schema:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = structural(raw, raw.get("$defs", {}))
    _factory_defaults(model, schema)
    return schema


def open_api_schema() -> Schema:
    """The openAPIV3Schema of a whole QualificationRun object."""
    spec = _model_schema(QualificationRunSpec)
    status = _model_schema(QualificationRunStatus)
    # Conditions are keyed by type: server-side apply merges them by that key.
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    conditions["items"]["required"] = ["type", "status"]
    status["properties"]["machine"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "description": status["properties"]["machine"]["description"],
    }
    return {
        "type": "object",
        "description": "A qualification of a training stack (an image) for exact resumption "
        "after preemption.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"{GROUP}/{VERSION}"},
            "kind": {"type": "string", "description": KIND},
            # The API server refuses any more than this for metadata: it validates
            # ObjectMeta itself (apiextensions validation, "must not specify anything other
            # than name and generateName").
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }


# The digest of the CRD's spec, on the CRD itself: how the operator tells at start-up that
# the installed CRD is the one it was built with (Helm never upgrades crds/).
DIGEST_ANNOTATION = "resumequal.dev/schema-digest"


def crd_digest(spec: dict[str, Any]) -> str:
    """A digest of a CRD spec that does not depend on key order."""
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:20]


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition of QualificationRun (resumequal.dev/v1alpha1)."""
    spec = _crd_spec()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/name": "resumequal"},
            "annotations": {DIGEST_ANNOTATION: crd_digest(spec)},
        },
        "spec": spec,
    }


def _crd_spec() -> dict[str, Any]:
    return {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "kind": KIND,
            "listKind": f"{KIND}List",
            "plural": PLURAL,
            "singular": SINGULAR,
            "shortNames": ["qr"],
            "categories": ["resumequal"],
        },
        "versions": [{
            "name": VERSION,
            "served": True,
            "storage": True,
            "subresources": {"status": {}},
            "additionalPrinterColumns": PRINTER_COLUMNS,
            "schema": {"openAPIV3Schema": open_api_schema()},
        }],
    }


def crd_yaml() -> str:
    """The CRD as the YAML document the chart ships."""
    return HEADER + yaml.safe_dump(build_crd(), sort_keys=False, width=100)


def write_crd(path: Path = CHART_CRD) -> Path:
    """Write the CRD where the chart takes it from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(crd_yaml())
    return path


def _main() -> None:
    parser = argparse.ArgumentParser(description="Print or write the QualificationRun CRD.")
    parser.add_argument("--write", action="store_true", help=f"write {CHART_CRD}")
    args = parser.parse_args()
    if args.write:
        print(write_crd())
    else:
        print(crd_yaml(), end="")


if __name__ == "__main__":
    _main()
