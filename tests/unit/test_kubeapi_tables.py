"""What the API emulator serves kubectl, without a socket: JSONPath and Table printing of
custom resources, OpenAPI v3 documents, and strict field validation in the store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.kubeapi import jsonpath, openapi, tables
from tests.kubeapi.api import PYTORCHJOB_CRD, QUALIFICATIONRUN_CRD, KubeAPI
from tests.kubeapi.errors import ApiError
from tests.kubeapi.resources import Registry, kinds_from_crd
from tests.kubeapi.store import FieldValidation, Store

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
STAMP = "2027-01-15T07:55:00Z"  # five minutes earlier


def obj(status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "x.io/v1", "kind": "Thing",
            "metadata": {"name": "t1", "namespace": "ns", "creationTimestamp": STAMP,
                         "resourceVersion": "7", **meta},
            "spec": {"size": 3, "ratio": 0.5, "on": True, "tags": ["a", "b"],
                     "limits": {"cpu": "2"}},
            "status": status or {}}


# ------------------------------------------------------------------------------ jsonpath


@pytest.mark.parametrize(("path", "found"), [
    (".spec.size", [3]),
    (".spec.tags[0]", ["a"]),
    (".spec.tags[-1]", ["b"]),
    (".spec.tags[-1:]", ["b"]),
    (".spec.tags[0:2]", ["a", "b"]),
    (".spec.tags[*]", ["a", "b"]),
    (".spec['limits'].cpu", ["2"]),
    (".spec.limits.*", ["2"]),
    ("..cpu", ["2"]),
    (".spec.missing", []),
    (".spec.missing.deeper", []),
    ('.status.conditions[?(@.type=="Ready")].status', ["False"]),
    (".status.conditions[?(@.reason)].type", ["Ready"]),
    (".status.conditions[?(@.n > 1)].type", ["Qualified"]),
    (".status.conditions[-1:].type", ["Qualified"]),
])
def test_jsonpath_finds_what_client_go_finds(path: str, found: list[Any]) -> None:
    data = obj({"conditions": [{"type": "Ready", "status": "False", "reason": "Failed", "n": 1},
                               {"type": "Qualified", "status": "True", "n": 2}]})
    assert jsonpath.find(data, jsonpath.parse(path)) == found
    assert jsonpath.find(data, jsonpath.parse("{" + path + "}")) == found


@pytest.mark.parametrize("path", [".spec.tags[5]", ".spec.size[0]", ".spec.limits[?(@.x)]",
                                  '.status.conditions[?(@.n == "1")]'])
def test_jsonpath_errors_where_client_go_errors(path: str) -> None:
    data = obj({"conditions": [{"type": "Ready", "n": 1}]})
    with pytest.raises(jsonpath.JSONPathError):
        jsonpath.find(data, jsonpath.parse(path))


def test_an_empty_list_has_no_last_element() -> None:
    # [-1:] on [] is out of bounds in client-go: no result, so an empty State cell.
    with pytest.raises(jsonpath.JSONPathError):
        jsonpath.find({"c": []}, jsonpath.parse(".c[-1:].type"))


@pytest.mark.parametrize("path", [".a[", ".a[?(@.x ~ 1)]", ".a['x'", ".a[0,1]"])
def test_jsonpath_refuses_what_it_cannot_parse(path: str) -> None:
    with pytest.raises(jsonpath.JSONPathError):
        jsonpath.parse(path)


@pytest.mark.parametrize(("value", "text"), [
    ("PASS", "PASS"), (3, "3"), (True, "true"), (None, "<no value>"),
    ({"a": [1, 2]}, '{"a":[1,2]}'), (0.5, "0.5"), (1.0, "1"), (100000.0, "100000"),
    (1e6, "1e+06"), (1234567.0, "1.234567e+06"), (1e-05, "1e-05"), (0.0001, "0.0001"),
    (-2.5e-07, "-2.5e-07"), (float("inf"), "+Inf"),
])
def test_values_print_like_go(value: Any, text: str) -> None:
    assert jsonpath.text(value) == text


# ------------------------------------------------------------------------------ tables


@pytest.mark.parametrize(("seconds", "human"), [
    # k8s.io/apimachinery/pkg/util/duration/duration_test.go
    (1, "1s"), (70, "70s"), (190, "3m10s"), (70 * 60, "70m"), (47 * 3600, "47h"),
    (49 * 3600, "2d1h"), ((8 * 24 + 2) * 3600, "8d"), (367 * 24 * 3600, "367d"),
    ((365 * 2 * 24 + 25) * 3600, "2y1d"), ((365 * 8 * 24 + 2) * 3600, "8y"),
    (-2, "<invalid>"), (-1.999, "0s"), (0, "0s"), (119.999, "119s"), (120, "2m"),
    (599.999, "9m59s"), (601, "10m"), (3 * 3600 - 0.001, "179m"), (3 * 3600 + 60, "3h1m"),
    (8 * 3600 - 0.001, "7h59m"), (8 * 3600 + 59 * 60, "8h"), (2 * 24 * 3600, "2d"),
    (8 * 24 * 3600 - 0.001, "7d23h"), (2 * 365 * 24 * 3600 - 0.001, "729d"),
    (2 * 365 * 24 * 3600 + 24 * 3600, "2y1d"), (8 * 365 * 24 * 3600 - 0.001, "7y364d"),
])
def test_human_duration_is_apimachinerys(seconds: float, human: str) -> None:
    assert tables.human_duration(seconds) == human


COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
    {"name": "Ratio", "type": "number", "jsonPath": ".spec.ratio", "priority": 1},
    {"name": "On", "type": "boolean", "jsonPath": ".spec.on"},
    {"name": "Tags", "type": "string", "jsonPath": ".spec.tags"},
    {"name": "Wrong", "type": "integer", "jsonPath": ".spec.on"},
    {"name": "Broken", "type": "string", "jsonPath": ".spec.tags[9]"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def test_cells_follow_the_column_types() -> None:
    cols = tables.columns(COLUMNS)
    assert [c.definition["name"] for c in cols] == ["Name", *(c["name"] for c in COLUMNS)]
    assert cols[3].definition["priority"] == 1
    assert cols[1].definition["description"] == (
        "Custom resource definition column (in JSONPath format): .status.phase")
    # Phase missing: null; a list printed as JSON for a string column; a bool is no integer;
    # an index out of range is an empty cell; Age from the creation time.
    assert tables.cells(obj(), cols, NOW) == [
        "t1", None, 3, 0.5, True, '["a","b"]', None, None, "5m"]
    assert tables.cells(obj({"phase": "Armed"}), cols, NOW)[1] == "Armed"


@pytest.mark.parametrize(("stamp", "age"), [("", "<unknown>"), ("yesterday", "<invalid>"),
                                            ("2027-01-15T07:55:00", "<invalid>"),
                                            ("2027-01-15T08:00:03Z", "<invalid>")])
def test_dates_that_are_not_rfc3339_times(stamp: str, age: str) -> None:
    cols = tables.columns([{"name": "When", "type": "date", "jsonPath": ".status.at"}])
    assert tables.cells(obj({"at": stamp}), cols, NOW)[1] == age


def test_a_version_without_columns_gets_age() -> None:
    cols = tables.columns([])
    assert [c.definition["name"] for c in cols] == ["Name", "Age"]
    assert tables.cells(obj(), cols, NOW) == ["t1", "5m"]


def test_table_rows_carry_partial_metadata_unless_asked_otherwise() -> None:
    cols = tables.columns(COLUMNS[:1])
    table = tables.table([obj({"phase": "Armed"})], cols, resource_version="9", now=NOW)
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert table["metadata"] == {"resourceVersion": "9"}
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Phase"]
    [row] = table["rows"]
    assert row["cells"] == ["t1", "Armed"]
    assert row["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj()["metadata"]}
    full = tables.table([obj()], cols, resource_version="9", include="Object", headers=False)
    assert full["rows"][0]["object"]["spec"]["size"] == 3
    assert full["columnDefinitions"] is None
    assert "object" not in tables.table([obj()], cols, resource_version="9",
                                        include="None")["rows"][0]
    assert tables.include_object(None) == "Metadata"
    with pytest.raises(ApiError, match="unrecognized includeObject value"):
        tables.include_object("Everything")


@pytest.mark.parametrize(("accept", "wanted"), [
    ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;"
     "g=meta.k8s.io,application/json", "meta.k8s.io/v1"),
    ("application/json;as=Table;v=v1beta1;g=meta.k8s.io", "meta.k8s.io/v1beta1"),
    ("application/json", None),
    ("application/json, */*", None),
    ("application/vnd.kubernetes.protobuf,application/json", None),
    ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,"
     "application/json;as=Table;v=v1;g=meta.k8s.io", "meta.k8s.io/v1"),
    ("application/json;as=Table;v=v2;g=meta.k8s.io", None),
    (None, None),
])
def test_accept_negotiation(accept: str | None, wanted: str | None) -> None:
    assert tables.negotiate(accept) == wanted


def test_the_chart_crd_prints_the_readme_columns() -> None:
    [kind] = KubeAPI().register_crd(QUALIFICATIONRUN_CRD)
    cols = tables.columns(kind.printer_columns or ())
    assert [c.definition["name"] for c in cols] == [
        "Name", "Phase", "Verdict", "First divergence", "Pin", "Age"]
    run = {"metadata": {"name": "n", "creationTimestamp": STAMP},
           "status": {"phase": "Succeeded", "pin": "train:1", "verdict": {
               "result": "FAIL", "firstDivergenceSummary": "step 6 lr rank 1"}}}
    assert tables.cells(run, cols, NOW) == [
        "n", "Succeeded", "FAIL", "step 6 lr rank 1", "train:1", "5m"]


# ------------------------------------------------------------------------------ openapi


def _registry() -> Registry:
    api = KubeAPI()
    api.register_pytorchjob_crd()
    api.register_crd(QUALIFICATIONRUN_CRD)
    return api.registry


def _patch_op(doc: dict[str, Any], kind: str) -> dict[str, Any]:
    ops = [p["patch"] for p in doc["paths"].values()
           if "patch" in p and p["patch"]["x-kubernetes-group-version-kind"]["kind"] == kind
           and not p["patch"]["operationId"].endswith("Status")]
    assert len(ops) == 1, ops
    return ops[0]


def test_openapi_index_names_each_group_version_with_its_hash() -> None:
    registry = _registry()
    index = openapi.index(registry)["paths"]
    assert {"api/v1", "apis/batch/v1", "apis/kubeflow.org/v1",
            "apis/resumequal.dev/v1alpha1"} <= set(index)
    url = index["apis/resumequal.dev/v1alpha1"]["serverRelativeURL"]
    _, etag = openapi.encode(openapi.document(registry, "apis/resumequal.dev/v1alpha1"))
    assert url == f"/openapi/v3/apis/resumequal.dev/v1alpha1?hash={etag}"
    assert len(etag) == 128 and etag == etag.upper()
    with pytest.raises(ApiError, match="could not find"):
        openapi.document(registry, "apis/nothing.io/v1")


def test_a_custom_resource_accepts_field_validation_but_no_strategic_merge() -> None:
    doc = openapi.document(_registry(), "apis/resumequal.dev/v1alpha1")
    op = _patch_op(doc, "QualificationRun")
    assert op["x-kubernetes-group-version-kind"] == {
        "group": "resumequal.dev", "version": "v1alpha1", "kind": "QualificationRun"}
    assert {p["name"] for p in op["parameters"] if p["in"] == "query"} >= {
        "fieldValidation", "dryRun"}
    assert set(op["requestBody"]["content"]) == {"application/json-patch+json",
                                                 "application/merge-patch+json"}
    schema = doc["components"]["schemas"]["dev.resumequal.v1alpha1.QualificationRun"]
    assert schema["x-kubernetes-group-version-kind"][0]["kind"] == "QualificationRun"
    assert "nprocPerNode" in schema["properties"]["spec"]["properties"]["world"]["properties"]
    assert schema["properties"]["metadata"]["allOf"] == [
        {"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]
    # Every reference resolves inside the document.
    refs = {v for v in _values(doc, "$ref")}
    assert {r.removeprefix("#/components/schemas/") for r in refs} <= set(
        doc["components"]["schemas"])


def test_a_built_in_kind_takes_strategic_merge() -> None:
    doc = openapi.document(_registry(), "api/v1")
    op = _patch_op(doc, "Pod")
    assert "application/strategic-merge-patch+json" in op["requestBody"]["content"]
    assert op["operationId"] == "patchNamespacedPod"
    assert "/api/v1/namespaces/{namespace}/pods/{name}/status" in doc["paths"]
    assert "/api/v1/pods" in doc["paths"]  # list across namespaces
    assert "/api/v1/namespaces/{name}" in doc["paths"]  # cluster scoped


def _values(node: Any, key: str) -> list[Any]:
    if isinstance(node, dict):
        return [v for k, sub in node.items() for v in ([sub] if k == key else [])
                + _values(sub, key)]
    if isinstance(node, list):
        return [v for sub in node for v in _values(sub, key)]
    return []


# ------------------------------------------------------------------------------ fieldValidation


def _store() -> tuple[Store, Any]:
    registry = Registry()
    [kind] = kinds_from_crd(_crd())
    registry.add(kind)
    return Store(registry), kind


def _crd() -> dict[str, Any]:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "things.x.io"},
            "spec": {"group": "x.io", "scope": "Namespaced",
                     "names": {"kind": "Thing", "plural": "things"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {
                                       "type": "object", "properties": {"spec": {
                                           "type": "object", "properties": {
                                               "size": {"type": "integer"},
                                               "tags": {"type": "array", "items": {
                                                   "type": "object", "properties": {
                                                       "k": {"type": "string"}}}}}}}}}}]}}


def _thing(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "x.io/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": spec}


def test_strict_field_validation_refuses_unknown_fields_naming_them() -> None:
    store, kind = _store()
    with pytest.raises(ApiError) as info:
        store.create(kind, "ns", _thing(size=1, colour="red", tags=[{"k": "a", "v": 1}]),
                     validation=FieldValidation("Strict"))
    assert info.value.code == 400
    assert info.value.message == (
        'Thing in version "v1" cannot be handled as a Thing: strict decoding error: unknown '
        'field "spec.colour", unknown field "spec.tags[0].v"')
    assert store.select(kind, "ns")[0] == []
    store.create(kind, "ns", _thing(size=1), validation=FieldValidation("Strict"))
    with pytest.raises(ApiError) as info:
        store.patch(kind, "ns", "t", {"spec": {"colour": "red"}},
                    "application/merge-patch+json", validation=FieldValidation("Strict"))
    assert info.value.code == 422
    assert info.value.message.startswith(' "" is invalid: patch: Invalid value: "{')
    assert info.value.message.endswith('strict decoding error: unknown field "spec.colour"')


def test_warn_prunes_and_warns_and_ignore_prunes_quietly() -> None:
    store, kind = _store()
    warn = FieldValidation()
    assert warn.directive == "Warn"  # the server's default
    created = store.create(kind, "ns", _thing(size=1, colour="red"), validation=warn)
    assert created["spec"] == {"size": 1}
    assert warn.warnings == ['unknown field "spec.colour"']
    quiet = FieldValidation("Ignore")
    store.patch(kind, "ns", "t", {"spec": {"shade": "dark"}}, "application/merge-patch+json",
                validation=quiet)
    assert quiet.warnings == []
    assert json.dumps(store.get(kind, "ns", "t")["spec"]) == '{"size": 1}'


def test_pytorchjob_state_column_reads_the_last_condition() -> None:
    api = KubeAPI()
    [kind] = api.register_crd(PYTORCHJOB_CRD)
    cols = tables.columns(kind.printer_columns or ())
    assert [c.definition["name"] for c in cols] == ["Name", "State", "Age"]
    job = {"metadata": {"name": "j", "creationTimestamp": STAMP},
           "status": {"conditions": [{"type": "Created"}, {"type": "Running"}]}}
    assert tables.cells(job, cols, NOW) == ["j", "Running", "5m"]
    job["status"]["conditions"] = []
    assert tables.cells(job, cols, NOW) == ["j", None, "5m"]
