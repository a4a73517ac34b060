"""The QualificationRun CRD: structural, current, and what kubectl shows."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from resumequal_operator.crd import CHART_CRD, build_crd, crd_yaml, structural, write_crd
from resumequal_operator.main import main
from resumequal_operator.resource import QualificationRunSpec
from resumequal_operator.runstatus import QualificationRun
from resumequal_operator.validation import parse_run_spec
from testing.k8s_schemas import crd_schema, validate_qualificationrun

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("qualificationrun*.yaml"))
# Keywords a structural schema may use (apiextensions.k8s.io/v1).
ALLOWED = {
    "type", "description", "properties", "items", "additionalProperties", "required",
    "default", "enum", "nullable", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems", "minProperties",
    "maxProperties", "pattern",
    "format", "anyOf", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
}


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from _nodes(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def structural_violations(schema: dict[str, Any]) -> list[str]:
    """What the API server would reject as non-structural, one line per node."""
    bad = []
    for path, node in _nodes(schema):
        where = path or "<root>"
        unknown = set(node) - ALLOWED
        if unknown:
            bad.append(f"{where}: keywords {sorted(unknown)}")
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
        if "type" not in node and not (int_or_string or preserve):
            bad.append(f"{where}: no type")
        if "anyOf" in node and not (
                int_or_string and node["anyOf"] == [{"type": "integer"}, {"type": "string"}]):
            bad.append(f"{where}: anyOf other than int-or-string")
        if "properties" in node and "additionalProperties" in node:
            bad.append(f"{where}: properties and additionalProperties")
        if node.get("additionalProperties") is False:
            bad.append(f"{where}: additionalProperties false")
        if preserve and node.get("type") != "object":
            bad.append(f"{where}: preserve-unknown-fields on a non-object")
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if key in node and not isinstance(node[key], bool):
                bad.append(f"{where}: {key} must be a boolean")
        if "default" in node and node["default"] is None:
            bad.append(f"{where}: null default")
        if node.get("type") == "array" and "items" not in node:
            bad.append(f"{where}: array without items")
        if isinstance(node.get("description"), str) and "\n" in node["description"]:
            bad.append(f"{where}: multi-line description")
    return bad


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return build_crd()


def test_names_scope_and_version(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "qualificationruns.resumequal.dev"
    assert spec["group"] == "resumequal.dev" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "QualificationRun", "listKind": "QualificationRunList",
        "plural": "qualificationruns", "singular": "qualificationrun",
        "shortNames": ["qr"], "categories": ["resumequal"],
    }
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns(crd: dict[str, Any]) -> None:
    columns = {c["name"]: (c["type"], c["jsonPath"])
               for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ("string", ".status.phase"),
        "Verdict": ("string", ".status.verdict.result"),
        "First divergence": ("string", ".status.verdict.firstDivergenceSummary"),
        "Pin": ("string", ".status.pin"),
        "Age": ("date", ".metadata.creationTimestamp"),
    }
    schema = crd_schema(crd)
    for _, path in columns.values():
        node = schema
        for part in path.strip(".").split("."):
            if part == "metadata" and node is schema:
                break
            assert part in node["properties"], f"{path}: no {part}"
            node = node["properties"][part]


def test_schema_is_structural(crd: dict[str, Any]) -> None:
    assert structural_violations(crd_schema(crd)) == []


def test_the_structural_check_can_fail() -> None:
    bad = {"type": "object", "properties": {
        "a": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "b": {"$ref": "#/$defs/B"},
        "c": {"type": "number", "exclusiveMinimum": 0},
    }}
    found = structural_violations(bad)
    assert any(".a: no type" in f for f in found)
    assert any(".b: keywords ['$ref']" in f for f in found)
    assert any(".c: exclusiveMinimum" in f for f in found)


def test_structural_inlines_refs_and_nullables() -> None:
    defs = {"Inner": {"type": "object", "title": "Inner",
                      "properties": {"x": {"type": "integer", "exclusiveMinimum": 0}}}}
    node = {"anyOf": [{"$ref": "#/$defs/Inner"}, {"type": "null"}], "default": None,
            "description": "an\n   inner  thing"}
    out = structural(node, defs)
    assert out == {"type": "object", "nullable": True, "description": "an inner thing",
                   "properties": {"x": {"type": "integer", "minimum": 0,
                                        "exclusiveMinimum": True}}}
    with pytest.raises(ValueError, match="no structural form"):
        structural({"anyOf": [{"type": "string"}, {"type": "boolean"}]}, {})


def test_every_field_is_camel_case(crd: dict[str, Any]) -> None:
    """Kubernetes API conventions: spec and status fields (the alias generator spells new
    ones too); only the preserved machine state is free-form."""
    schema = crd_schema(crd)
    for part in ("spec", "status"):
        fields = [path for path, _ in _nodes(schema["properties"][part], part)]
        assert [f for f in fields if "_" in f.rsplit(".", 1)[-1]] == []
    world = schema["properties"]["spec"]["properties"]["world"]["properties"]
    assert {"nprocPerNode", "threadsPerRank", "maxRestarts"} <= set(world)
    placement = schema["properties"]["spec"]["properties"]
    assert {"nodeSelector", "serviceAccountName", "allowRendezvousHostKill"} <= set(placement)


def test_spec_sections_keep_the_spec_field_names(crd: dict[str, Any]) -> None:
    spec = crd_schema(crd)["properties"]["spec"]
    assert spec["required"] == ["stack", "store"]
    props = spec["properties"]
    for section in ("workload", "world", "training", "checkpoint", "preemption", "timeouts",
                    "ddp", "comparison", "controls", "matrix"):
        assert props[section]["type"] == "object", section
    assert "nprocPerNode" in props["world"]["properties"]
    assert "async" in props["checkpoint"]["properties"]  # the YAML key, not async_save
    assert props["preemption"]["properties"]["mode"]["enum"] == ["hard", "graceful"]
    nnodes = props["world"]["properties"]["nnodes"]
    assert {k: v for k, v in nnodes.items() if k != "description"} == {
        "default": 1, "minimum": 1, "maximum": 1024, "type": "integer"}
    quantity = props["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True
    assert props["workload"]["properties"]["params"]["x-kubernetes-preserve-unknown-fields"]


def test_every_property_has_a_description(crd: dict[str, Any]) -> None:
    # What kubectl explain shows for each field; metadata's is ObjectMeta's own.
    missing = [path for path, node in _nodes(crd_schema(crd))
               if path and not path.endswith(("[]", "{}")) and not node.get("description")]
    assert missing == [".metadata"]


def test_metadata_is_left_to_the_api_server(crd: dict[str, Any]) -> None:
    # A real API server refuses a CRD that says more of metadata than this ("must not
    # specify anything other than name and generateName"): it validates ObjectMeta itself.
    assert crd_schema(crd)["properties"]["metadata"] == {"type": "object"}


def test_status_is_camel_case_and_keeps_the_machine(crd: dict[str, Any]) -> None:
    status = crd_schema(crd)["properties"]["status"]["properties"]
    assert {"phase", "observedGeneration", "conditions", "pin", "runUri", "reportUrl", "legs",
            "preemption", "comparatorJob", "verdict", "startedAt", "completedAt",
            "machine"} <= set(status)
    assert status["machine"]["x-kubernetes-preserve-unknown-fields"] is True
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    verdict = status["verdict"]["properties"]
    assert {"firstDivergence", "firstDivergenceSummary", "controlsDetected",
            "controlsTotal", "paramMaxAbsDiff"} <= set(verdict)
    assert status["legs"]["additionalProperties"]["properties"]["launchedAt"]["format"] == (
        "date-time")


def test_committed_crd_is_current() -> None:
    assert CHART_CRD.exists(), f"{CHART_CRD} missing: python -m resumequal_operator.crd --write"
    assert yaml.safe_load(CHART_CRD.read_text()) == build_crd(), (
        "the chart's CRD is stale: python -m resumequal_operator.crd --write")
    assert CHART_CRD.read_text() == crd_yaml()


def test_write_crd(tmp_path: Path) -> None:
    path = write_crd(tmp_path / "crds" / "crd.yaml")
    assert yaml.safe_load(path.read_text()) == build_crd()


def test_cli_prints_the_crd() -> None:
    result = CliRunner().invoke(main, ["crd"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == build_crd()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    obj = yaml.safe_load(path.read_text())
    validate_qualificationrun(obj)
    QualificationRun.model_validate(obj)


def test_examples_exist() -> None:
    assert len(EXAMPLES) >= 2


def test_crd_validation_rejects_bad_objects() -> None:
    obj = yaml.safe_load(EXAMPLES[0].read_text())
    obj["spec"]["world"]["nnodes"] = 0
    with pytest.raises(AssertionError, match=r"\.spec\.world\.nnodes"):
        validate_qualificationrun(obj)
    obj = yaml.safe_load(EXAMPLES[0].read_text())
    obj["spec"]["world"]["nodes"] = 2
    with pytest.raises(AssertionError, match=r"\.spec\.world\.nodes"):
        validate_qualificationrun(obj)
    obj = yaml.safe_load(EXAMPLES[0].read_text())
    del obj["spec"]["stack"]["image"]
    with pytest.raises(AssertionError, match=r"\.spec\.stack.*image"):
        validate_qualificationrun(obj)
    obj = yaml.safe_load(EXAMPLES[0].read_text())
    obj["spec"]["resources"]["limits"]["cpu"] = "two"
    with pytest.raises(AssertionError, match=r"\.spec\.resources\.limits\.cpu"):
        validate_qualificationrun(obj)


def test_status_round_trips_through_the_schema() -> None:
    from resumequal_operator.runstatus import QualificationRunStatus

    status = QualificationRunStatus.model_validate({
        "phase": "Succeeded", "observedGeneration": 2, "pin": "train:1",
        "runUri": "s3://b/p/ns/run/uid", "reportUrl": "s3://b/p/ns/run/uid/report.html",
        "conditions": [{"type": "Qualified", "status": "True", "reason": "Pass",
                        "lastTransitionTime": 1_790_000_000.5}],
        "legs": {"preempted": {"job": "run-preempted-1", "attempts": 2, "steps": 12,
                               "launchedAt": 1_790_000_000, "restartSeconds": float("nan")}},
        "preemption": {"leg": "preempted", "pod": "run-preempted-1-worker-1", "rank": 2,
                       "mode": "hard", "injectedAt": 1_790_000_100},
        "verdict": {"result": "FAIL", "firstDivergence": {"step": 6, "boundary": "lr",
                                                           "rank": 1},
                    "firstDivergenceSummary": "step 6 lr rank 1",
                    "paramMaxAbsDiff": float("inf"), "controlsDetected": 4,
                    "controlsTotal": 5},
        "machine": {"phase": "Succeeded", "legs": {"control": {"steps": 12}}},
    })
    body = status.to_k8s()
    assert body["legs"]["preempted"]["launchedAt"].endswith("Z")
    assert "restartSeconds" not in body["legs"]["preempted"]  # NaN is not JSON: unknown
    assert "paramMaxAbsDiff" not in body["verdict"]
    obj = yaml.safe_load(EXAMPLES[0].read_text())
    obj["status"] = body
    validate_qualificationrun(obj)
    assert QualificationRunStatus.model_validate(body).to_k8s() == body


def _apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: absent fields get their default,
    then defaulting goes on inside what is there."""
    if isinstance(value, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = _apply_defaults(value[name], sub)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for name in value:
            value[name] = _apply_defaults(value[name], schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_apply_defaults(v, schema["items"]) for v in value]
    return value


def test_server_defaults_are_the_model_defaults(crd: dict[str, Any]) -> None:
    """What the API server stores for a minimal run is what pydantic makes of it."""
    minimal = {"stack": {"image": "train:1"}, "store": {"uri": "s3://bucket/q"},
               "world": {"nnodes": 2}, "preemption": {"rank": 2}, "training": {"steps": 9}}
    spec_schema = crd_schema(crd)["properties"]["spec"]
    stored = _apply_defaults(copy.deepcopy(minimal), spec_schema)
    assert stored["world"]["nprocPerNode"] == 2
    assert stored["training"]["optimizer"]["name"] == "adamw"  # nested sections default too
    assert stored["controls"]["omissions"][0] == "rng"
    validate_qualificationrun({"apiVersion": "resumequal.dev/v1alpha1",
                               "kind": "QualificationRun", "metadata": {"name": "r"},
                               "spec": stored})
    assert parse_run_spec(stored) == parse_run_spec(minimal)
    assert parse_run_spec(stored).model_dump() == QualificationRunSpec.model_validate(
        minimal).model_dump()
