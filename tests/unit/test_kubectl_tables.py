"""What the API emulator serves kubectl, without a socket: Table printing of custom
resources, OpenAPI v3 documents, and strict field validation in the store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testing.kubeapi import kubectl
from testing.kubeapi.api import PYTORCHJOB_CRD, QUALIFICATIONRUN_CRD, KubeAPI
from testing.kubeapi.errors import ApiError
from testing.kubeapi.resources import Kind, Registry, kinds_from_crd
from testing.kubeapi.store import FieldValidation, Store

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
STAMP = "2027-01-15T07:55:00Z"  # five minutes earlier


def obj(status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "x.io/v1", "kind": "Thing",
            "metadata": {"name": "t1", "namespace": "ns", "creationTimestamp": STAMP,
                         "resourceVersion": "7", **meta},
            "spec": {"size": 3, "ratio": 0.5, "on": True, "tags": ["a", "b"],
                     "limits": {"cpu": "2"}},
            "status": status or {}}


# ------------------------------------------------------------------------------ JSONPath


@pytest.mark.parametrize(("path", "found"), [
    (".spec.size", [3]),
    (".spec.tags[0]", ["a"]),
    (".spec.tags[-1]", ["b"]),
    (".spec.tags[-1:]", ["b"]),
    (".spec.tags[0:2]", ["a", "b"]),
    (".spec.missing", []),
    (".spec.missing.deeper", []),
    (".status.conditions[-1:].type", ["Qualified"]),
])
def test_jsonpath_finds_what_client_go_finds(path: str, found: list[Any]) -> None:
    data = obj({"conditions": [{"type": "Ready"}, {"type": "Qualified"}]})
    assert kubectl.find(data, path) == found


@pytest.mark.parametrize("path", [".spec.tags[5]", ".spec.size[0]", ".spec.tags[?(@.x)]",
                                  "..cpu", ".spec.tags[*]"])
def test_jsonpath_errors_where_client_go_errors_or_is_not_emulated(path: str) -> None:
    with pytest.raises(ValueError):
        kubectl.find(obj(), path)


def test_an_empty_list_has_no_last_element() -> None:
    # [-1:] on [] is out of bounds in client-go: no result, so an empty State cell.
    with pytest.raises(ValueError):
        kubectl.find({"c": []}, ".c[-1:].type")


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
    assert kubectl.human_duration(seconds) == human


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


def kind_with(cols: list[dict[str, Any]] | None) -> Kind:
    return Kind(group="x.io", version="v1", kind="Thing", plural="things", namespaced=True,
                status_subresource=False, printer_columns=tuple(cols or ()))


def test_cells_follow_the_column_types() -> None:
    cols = kubectl.columns(kind_with(COLUMNS))
    assert [c["name"] for c in cols] == ["Name", *(c["name"] for c in COLUMNS)]
    assert cols[3]["priority"] == 1
    assert cols[1]["description"] == (
        "Custom resource definition column (in JSONPath format): .status.phase")
    # Phase missing: null; a list printed as JSON for a string column; a bool is no integer;
    # an index out of range is an empty cell; Age from the creation time.
    assert kubectl.cells(obj(), cols, NOW) == [
        "t1", None, 3, 0.5, True, '["a","b"]', None, None, "5m"]
    assert kubectl.cells(obj({"phase": "Armed"}), cols, NOW)[1] == "Armed"
    assert kubectl.cells(obj({"phase": None}), cols, NOW)[1] == "<no value>"


@pytest.mark.parametrize(("stamp", "age"), [("", "<unknown>"), ("yesterday", "<invalid>"),
                                            ("2027-01-15T07:55:00", "<invalid>"),
                                            ("2027-01-15T08:00:03Z", "<invalid>")])
def test_dates_that_are_not_rfc3339_times(stamp: str, age: str) -> None:
    cols = kubectl.columns(kind_with([{"name": "When", "type": "date",
                                       "jsonPath": ".status.at"}]))
    assert kubectl.cells(obj({"at": stamp}), cols, NOW)[1] == age


def test_a_version_without_columns_gets_age() -> None:
    cols = kubectl.columns(kind_with([]))
    assert [c["name"] for c in cols] == ["Name", "Age"]
    assert kubectl.cells(obj(), cols, NOW) == ["t1", "5m"]


def test_table_rows_carry_partial_metadata_unless_asked_otherwise() -> None:
    kind = kind_with(COLUMNS[:1])
    table = kubectl.table([obj({"phase": "Armed"})], kind, resource_version="9", now=NOW)
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert table["metadata"] == {"resourceVersion": "9"}
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Phase"]
    assert all("jsonPath" not in c for c in table["columnDefinitions"])
    [row] = table["rows"]
    assert row["cells"] == ["t1", "Armed"]
    assert row["object"] == {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj()["metadata"]}
    full = kubectl.table([obj()], kind, resource_version="9", include="Object", headers=False)
    assert full["rows"][0]["object"]["spec"]["size"] == 3
    assert full["columnDefinitions"] is None
    assert "object" not in kubectl.table([obj()], kind, resource_version="9",
                                         include="None")["rows"][0]
    with pytest.raises(ApiError, match="unrecognized includeObject value"):
        kubectl.table([], kind, resource_version="9", include="Everything")


@pytest.mark.parametrize(("accept", "wanted"), [
    ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;"
     "g=meta.k8s.io,application/json", True),
    ("application/json", False),
    ("application/json, */*", False),
    ("application/vnd.kubernetes.protobuf,application/json", False),
    ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,"
     "application/json;as=Table;v=v1;g=meta.k8s.io", True),
    ("application/json;as=Table;v=v2;g=meta.k8s.io", False),
    (None, False),
])
def test_accept_negotiation(accept: str | None, wanted: bool) -> None:
    assert kubectl.wants_table(accept) == wanted


def test_the_chart_crd_prints_the_readme_columns() -> None:
    [kind] = KubeAPI().register_crd(QUALIFICATIONRUN_CRD)
    cols = kubectl.columns(kind)
    assert [c["name"] for c in cols] == [
        "Name", "Phase", "Verdict", "First divergence", "Pin", "Age"]
    run = {"metadata": {"name": "n", "creationTimestamp": STAMP},
           "status": {"phase": "Succeeded", "pin": "train:1", "verdict": {
               "result": "FAIL", "firstDivergenceSummary": "step 6 lr rank 1"}}}
    assert kubectl.cells(run, cols, NOW) == [
        "n", "Succeeded", "FAIL", "step 6 lr rank 1", "train:1", "5m"]


# ------------------------------------------------------------------------------ openapi


def _registry() -> Registry:
    api = KubeAPI()
    api.register_pytorchjob_crd()
    api.register_crd(QUALIFICATIONRUN_CRD)
    return api.registry


def test_openapi_index_names_each_group_version_with_its_hash() -> None:
    index = kubectl.openapi_index(_registry())["paths"]
    assert {"api/v1", "apis/batch/v1", "apis/kubeflow.org/v1",
            "apis/resumequal.dev/v1alpha1"} <= set(index)
    url = index["apis/resumequal.dev/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/resumequal.dev/v1alpha1?hash=")
    with pytest.raises(ApiError, match="could not find"):
        kubectl.openapi_document(_registry(), "apis/nothing.io/v1")


def test_each_kind_offers_field_validation_on_patch_but_no_strategic_merge() -> None:
    doc = kubectl.openapi_document(_registry(), "apis/resumequal.dev/v1alpha1")
    [op] = [p["patch"] for p in doc["paths"].values()]
    assert op["x-kubernetes-group-version-kind"] == {
        "group": "resumequal.dev", "version": "v1alpha1", "kind": "QualificationRun"}
    assert {p["name"] for p in op["parameters"] if p["in"] == "query"} >= {"fieldValidation"}
    assert set(op["requestBody"]["content"]) == {"application/merge-patch+json"}
    pods = kubectl.openapi_document(_registry(), "api/v1")["paths"]
    assert "/api/v1/namespaces/{namespace}/pods/{name}" in pods
    assert "/api/v1/namespaces/{name}" in pods  # cluster scoped


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
    cols = kubectl.columns(kind)
    assert [c["name"] for c in cols] == ["Name", "State", "Age"]
    job = {"metadata": {"name": "j", "creationTimestamp": STAMP},
           "status": {"conditions": [{"type": "Created"}, {"type": "Running"}]}}
    assert kubectl.cells(job, cols, NOW) == ["j", "Running", "5m"]
    job["status"]["conditions"] = []
    assert kubectl.cells(job, cols, NOW) == ["j", None, "5m"]
