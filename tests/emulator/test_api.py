"""The Kubernetes API emulator, driven through the official client over real HTTP."""

from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any

import kubernetes.client as k8s
import pytest
from kubernetes import dynamic, watch
from kubernetes.client.rest import ApiException

from testing.kubeapi import KubeAPI

pytestmark = pytest.mark.timeout(30)

NS = "team-a"
PTJ = ("kubeflow.org", "v1", NS, "pytorchjobs")
MERGE = "application/merge-patch+json"


def pod(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}, **meta},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "env": [{"name": "A", "value": "1"}]}]}}


def pytorchjob(name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, **meta},
            "spec": {"pytorchReplicaSpecs": {"Worker": {
                "replicas": 2, "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [{"name": "pytorch", "image": "w"}]}}}}}}


def status_of(e: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(e.body)
    assert body["kind"] == "Status" and body["code"] == e.status
    return body


@pytest.fixture
def core(kube_client: k8s.ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(kube_client)


@pytest.fixture
def custom(kube_client: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(kube_client)


# ---------------------------------------------------------------------- discovery, CRUD


def test_discovery_serves_version_groups_and_registered_crds(
        kube_client: k8s.ApiClient) -> None:
    assert k8s.VersionApi(kube_client).get_code().major == "1"
    groups = {g.name for g in k8s.ApisApi(kube_client).get_api_versions().groups}
    assert {"batch", "coordination.k8s.io", "kubeflow.org"} <= groups
    resources = k8s.CustomObjectsApi(kube_client).get_api_resources("kubeflow.org", "v1")
    assert {r.name for r in resources.resources} == {"pytorchjobs", "pytorchjobs/status"}
    crd = k8s.ApiextensionsV1Api(kube_client).read_custom_resource_definition(
        "pytorchjobs.kubeflow.org")
    assert crd.spec.names.kind == "PyTorchJob"
    group = k8s.BatchApi(kube_client).get_api_group()
    assert group.preferred_version.group_version == "batch/v1"
    dyn = dynamic.DynamicClient(kube_client)  # walks the whole discovery tree
    pytorchjobs = dyn.resources.get(api_version="kubeflow.org/v1", kind="PyTorchJob")
    assert pytorchjobs.namespaced and pytorchjobs.subresources["status"]
    pods = dyn.resources.get(api_version="v1", kind="Pod")
    pods.create(body=pod("via-dynamic"), namespace=NS)
    assert [p.metadata.name for p in pods.get(namespace=NS).items] == ["via-dynamic"]


def test_creating_a_crd_over_http_serves_its_kind(kube_client: k8s.ApiClient) -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "widgets.example.com"},
           "spec": {"group": "example.com", "scope": "Cluster",
                    "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                    "versions": [{"name": "v1", "served": True, "storage": True,
                                  "schema": {"openAPIV3Schema": {
                                      "type": "object", "x-kubernetes-preserve-unknown-fields":
                                      True}}}]}}
    k8s.ApiextensionsV1Api(kube_client).create_custom_resource_definition(crd)
    custom = k8s.CustomObjectsApi(kube_client)
    custom.create_cluster_custom_object("example.com", "v1", "widgets", {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
        "spec": {"size": 3}})
    widget = custom.get_cluster_custom_object("example.com", "v1", "widgets", "w")
    assert widget["spec"] == {"size": 3} and "namespace" not in widget["metadata"]
    with pytest.raises(ApiException) as no_status:
        custom.patch_cluster_custom_object_status("example.com", "v1", "widgets", "w",
                                                  {"status": {"x": 1}})
    assert no_status.value.status == 404  # the CRD declares no status subresource


def test_create_get_list_and_errors_are_status_objects(core: k8s.CoreV1Api) -> None:
    created = core.create_namespaced_pod(NS, pod("p1", {"app": "x"}))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.status.phase == "Pending" and created.metadata.namespace == NS
    assert core.read_namespace(NS).status.phase == "Active"  # created on first use
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_pod(NS, pod("p1"))
    assert exists.value.status == 409 and status_of(exists.value)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("nope", NS)
    assert missing.value.status == 404 and status_of(missing.value)["reason"] == "NotFound"
    generated = core.create_namespaced_pod(NS, {**pod(""), "metadata": {"generateName": "w-"}})
    assert generated.metadata.name.startswith("w-") and len(generated.metadata.name) == 7
    listing = core.list_namespaced_pod(NS)
    assert {p.metadata.name for p in listing.items} == {"p1", generated.metadata.name}
    assert int(listing.metadata.resource_version) >= int(generated.metadata.resource_version)
    with pytest.raises(ApiException) as invalid:
        core.create_namespaced_pod(NS, pod("Bad_Name"))
    assert invalid.value.status == 422
    with pytest.raises(ApiException) as bad_label:
        core.create_namespaced_pod(NS, pod("p2", {"run": "x" * 64}))
    assert bad_label.value.status == 422


def test_strict_namespaces_are_not_created_on_demand() -> None:
    with KubeAPI(auto_namespaces=False) as api, api.api_client() as client:
        core = k8s.CoreV1Api(client)
        with pytest.raises(ApiException) as missing:
            core.create_namespaced_secret("ghost", {"metadata": {"name": "c"}})
        assert missing.value.status == 404
        core.create_namespace({"metadata": {"name": "ghost"}})
        core.create_namespaced_secret("ghost", {"metadata": {"name": "c"}})


def test_replace_with_stale_resource_version_conflicts(core: k8s.CoreV1Api,
                                                       custom: k8s.CustomObjectsApi) -> None:
    cm = core.create_namespaced_secret(NS, {"metadata": {"name": "c"}, "data": {"k": "1"}})
    cm.data["k"] = "2"
    updated = core.replace_namespaced_secret("c", NS, cm)
    assert updated.data == {"k": "2"}
    cm.data["k"] = "3"  # still carries the old resourceVersion
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_secret("c", NS, cm)
    assert conflict.value.status == 409 and status_of(conflict.value)["reason"] == "Conflict"
    job = custom.create_namespaced_custom_object(*PTJ, pytorchjob("j"))
    del job["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as unconditional:
        custom.replace_namespaced_custom_object(*PTJ, "j", job)
    assert unconditional.value.status == 422  # custom resources need a resourceVersion


def test_status_subresource_and_generation(custom: k8s.CustomObjectsApi,
                                           kubeapi: KubeAPI) -> None:
    body = pytorchjob("j")
    body["status"] = {"conditions": [{"type": "Succeeded", "status": "True"}]}
    job = custom.create_namespaced_custom_object(*PTJ, body)
    assert "status" not in job and job["metadata"]["generation"] == 1
    rv = job["metadata"]["resourceVersion"]

    labelled = custom.patch_namespaced_custom_object(
        *PTJ, "j", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    assert labelled["metadata"]["resourceVersion"] != rv

    status = {"conditions": [{"type": "Created", "status": "True"}]}
    with_status = custom.patch_namespaced_custom_object_status(
        *PTJ, "j", {"status": status, "spec": {"runPolicy": {"backoffLimit": 9}}})
    assert with_status["status"] == status
    assert "runPolicy" not in with_status["spec"]  # /status changes only status
    assert with_status["metadata"]["generation"] == 1

    ignored = custom.patch_namespaced_custom_object(
        *PTJ, "j", {"status": {"conditions": []}, "spec": {"runPolicy": {"backoffLimit": 2}}})
    assert ignored["status"] == status  # the main resource ignores status
    assert ignored["metadata"]["generation"] == 2

    same = custom.patch_namespaced_custom_object_status(*PTJ, "j", {"status": status})
    assert same["metadata"]["resourceVersion"] == ignored["metadata"]["resourceVersion"]

    replaced = custom.get_namespaced_custom_object_status(*PTJ, "j")
    replaced["status"] = {"conditions": [{"type": "Running", "status": "True"}]}
    after = custom.replace_namespaced_custom_object_status(*PTJ, "j", replaced)
    assert after["status"]["conditions"][0]["type"] == "Running"
    assert kubeapi.get("pytorchjobs", NS, "j")["status"] == after["status"]  # type: ignore[index]


def test_custom_resources_are_pruned_to_their_schema(custom: k8s.CustomObjectsApi,
                                                     kubeapi: KubeAPI) -> None:
    body = pytorchjob("j")
    body["spec"]["unknownKnob"] = True
    job = custom.create_namespaced_custom_object(*PTJ, body)
    assert "unknownKnob" not in job["spec"]
    assert ("pytorchjobs.kubeflow.org", NS, "j", ".spec.unknownKnob") in kubeapi.pruned


def test_the_charts_qualificationrun_crd_is_served_with_its_status_subresource(
        custom: k8s.CustomObjectsApi, kubeapi: KubeAPI) -> None:
    assert kubeapi.kind("qr").status_subresource
    qr = ("resumequal.dev", "v1alpha1", NS, "qualificationruns")
    created = custom.create_namespaced_custom_object(*qr, {
        "apiVersion": "resumequal.dev/v1alpha1", "kind": "QualificationRun",
        "metadata": {"name": "nightly"}, "spec": {}, "status": {"phase": "Succeeded"}})
    assert "status" not in created
    machine = {"state": "armed", "legs": {"control": {"attempts": [0, 1]}}}
    status = custom.patch_namespaced_custom_object_status(*qr, "nightly", {"status": {
        "phase": "Armed", "machine": machine, "undeclared": 1}})["status"]
    assert status == {"phase": "Armed", "machine": machine}  # preserved, and pruned
    assert ("qualificationruns.resumequal.dev", NS, "nightly", ".status.undeclared") in (
        kubeapi.pruned)


# ---------------------------------------------------------------------- selectors


@pytest.mark.parametrize(("selector", "expected"), [
    ("tier=web", {"a", "b"}),
    ("tier==web", {"a", "b"}),
    ("tier!=web", {"c", "d"}),
    ("tier=web,env=prod", {"a"}),
    ("tier=web,env!=prod", {"b"}),
    ("", {"a", "b", "c", "d"}),
])
def test_label_selectors(core: k8s.CoreV1Api, selector: str, expected: set[str]) -> None:
    labels = {"a": {"tier": "web", "env": "prod"}, "b": {"tier": "web", "env": "dev"},
              "c": {"tier": "db"}, "d": {}}
    for name, lbl in labels.items():
        core.create_namespaced_pod(NS, pod(name, lbl))
    found = core.list_namespaced_pod(NS, label_selector=selector).items
    assert {p.metadata.name for p in found} == expected


def test_field_selectors_and_lists_across_namespaces(core: k8s.CoreV1Api,
                                                     custom: k8s.CustomObjectsApi) -> None:
    core.create_namespaced_pod("ns-1", pod("x"))
    core.create_namespaced_pod("ns-2", pod("x"))
    core.create_namespaced_pod("ns-2", pod("y"))
    every = core.list_pod_for_all_namespaces()
    assert len(every.items) == 3
    by_name = core.list_pod_for_all_namespaces(field_selector="metadata.name=x")
    assert {p.metadata.namespace for p in by_name.items} == {"ns-1", "ns-2"}
    not_ns1 = core.list_pod_for_all_namespaces(field_selector="metadata.namespace!=ns-1")
    assert {(p.metadata.namespace, p.metadata.name) for p in not_ns1.items} == {
        ("ns-2", "x"), ("ns-2", "y")}
    with pytest.raises(ApiException) as unsupported:
        core.list_namespaced_pod("ns-2", field_selector="spec.containers=x")
    assert unsupported.value.status == 400
    with pytest.raises(ApiException) as not_emulated:
        core.list_namespaced_pod("ns-2", label_selector="a in (b)")
    assert not_emulated.value.status == 400
    custom.create_namespaced_custom_object("kubeflow.org", "v1", "ns-1", "pytorchjobs",
                                           pytorchjob("j1"))
    custom.create_namespaced_custom_object("kubeflow.org", "v1", "ns-2", "pytorchjobs",
                                           pytorchjob("j2"))
    across = custom.list_cluster_custom_object("kubeflow.org", "v1", "pytorchjobs")
    assert {j["metadata"]["name"] for j in across["items"]} == {"j1", "j2"}


# ---------------------------------------------------------------------- patches


def test_strategic_merge_patch_is_refused(core: k8s.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("p"))
    with pytest.raises(ApiException) as refused:  # the client's default for a dict body
        core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}}})
    assert refused.value.status == 415
    assert "application/merge-patch+json" in status_of(refused.value)["message"]


def test_merge_patch_and_no_json_patch(core: k8s.CoreV1Api,
                                       custom: k8s.CustomObjectsApi) -> None:
    core.create_namespaced_secret(NS, {"metadata": {"name": "c"}, "data": {"a": "MQ=="}})
    patched = core.patch_namespaced_secret("c", NS, {"data": {"a": None, "b": "Mg=="}},
                                           _content_type=MERGE)
    assert patched.data == {"b": "Mg=="}
    with pytest.raises(ApiException) as json_patch:  # the client's type for a list body
        core.patch_namespaced_secret("c", NS, [{"op": "remove", "path": "/data/b"}])
    assert json_patch.value.status == 415
    custom.create_namespaced_custom_object(*PTJ, pytorchjob("j"))
    merged = custom.patch_namespaced_custom_object(*PTJ, "j", {"spec": {"runPolicy": {
        "cleanPodPolicy": "All"}}, "metadata": {"labels": {"x": "y"}}})
    assert merged["spec"]["runPolicy"] == {"cleanPodPolicy": "All"}
    assert merged["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    unset = custom.patch_namespaced_custom_object(*PTJ, "j", {"metadata": {"labels": {"x": None}}})
    assert not unset["metadata"].get("labels")
    stale = {"metadata": {"resourceVersion": "1", "labels": {"z": "1"}}}
    with pytest.raises(ApiException) as conflict:
        custom.patch_namespaced_custom_object(*PTJ, "j", stale)
    assert conflict.value.status == 409
    with pytest.raises(ApiException) as strategic:
        custom.patch_namespaced_custom_object(
            *PTJ, "j", {"spec": {}}, _content_type="application/strategic-merge-patch+json")
    assert strategic.value.status == 415


# ---------------------------------------------------------------------- watch


def _stream(func: Any, *args: Any, count: int | None = None,
            **kwargs: Any) -> list[tuple[str, str]]:
    """The events of one watch: until ``count`` arrived, or until the server's timeout."""
    w = watch.Watch()
    seen = []
    for e in w.stream(func, *args, **kwargs):
        seen.append((e["type"], e["raw_object"]["metadata"].get("name", "")))
        if len(seen) == count:
            w.stop()
    return seen


def test_watch_streams_changes_after_a_resource_version(core: k8s.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("before"))
    start = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod("p", {"role": "w"}))
    for labels in ({"extra": "1"}, {"role": "x"}):  # the second leaves the selection
        core.patch_namespaced_pod("p", NS, {"metadata": {"labels": labels}}, _content_type=MERGE)
    core.delete_namespaced_pod("before", NS)
    core.create_namespaced_pod("elsewhere", pod("other", {"role": "w"}))
    seen = _stream(core.list_namespaced_pod, NS, resource_version=start, timeout_seconds=1)
    assert seen == [("ADDED", "p"), ("MODIFIED", "p"), ("MODIFIED", "p"), ("DELETED", "before")]
    selective = _stream(core.list_pod_for_all_namespaces, resource_version=start,
                        label_selector="role=w", count=4, timeout_seconds=5)
    assert selective == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p"), ("ADDED", "other")]
    initial = _stream(core.list_namespaced_pod, NS, count=1, timeout_seconds=5)
    assert initial == [("ADDED", "p")]
    with pytest.raises(ApiException) as streaming_list:  # nothing under test asks for one
        _stream(core.list_namespaced_pod, NS, send_initial_events=True,
                resource_version_match="NotOlderThan", count=1, timeout_seconds=5)
    assert streaming_list.value.status == 400


def test_watch_custom_objects_in_a_namespace_and_across_namespaces(
        custom: k8s.CustomObjectsApi, kubeapi: KubeAPI) -> None:
    start = str(kubeapi.resource_version)
    custom.create_namespaced_custom_object(*PTJ, pytorchjob("a"))
    custom.create_namespaced_custom_object("kubeflow.org", "v1", "other", "pytorchjobs",
                                           pytorchjob("b"))
    custom.patch_namespaced_custom_object_status(*PTJ, "a", {"status": {"conditions": [
        {"type": "Created", "status": "True"}]}})
    custom.delete_namespaced_custom_object(*PTJ, "a")
    here = _stream(custom.list_namespaced_custom_object, *PTJ, resource_version=start,
                   count=3, timeout_seconds=5)
    assert here == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]
    everywhere = _stream(custom.list_cluster_custom_object, "kubeflow.org", "v1", "pytorchjobs",
                         resource_version=start, field_selector="metadata.name=b", count=1,
                         timeout_seconds=5)
    assert everywhere == [("ADDED", "b")]


def test_watch_delivers_live_events_and_honours_timeout(core: k8s.CoreV1Api,
                                                         kubeapi: KubeAPI) -> None:
    rv = core.list_namespaced_pod(NS).metadata.resource_version

    def later() -> None:
        time.sleep(0.2)
        kubeapi.create("pods", pod("live"), namespace=NS)

    thread = threading.Thread(target=later)
    thread.start()
    t0 = time.monotonic()
    seen = _stream(core.list_namespaced_pod, NS, resource_version=rv, timeout_seconds=1,
                   allow_watch_bookmarks=True)
    thread.join()
    assert seen == [("ADDED", "live"), ("BOOKMARK", "")]
    assert 0.9 <= time.monotonic() - t0 < 5


def test_a_watch_woken_by_other_kinds_still_gets_its_own_events(core: k8s.CoreV1Api,
                                                                kubeapi: KubeAPI) -> None:
    rv = core.list_namespaced_pod(NS).metadata.resource_version

    def later() -> None:  # secrets in between: the pod watch waits through them
        for i in range(20):
            kubeapi.create("secrets", {"metadata": {"name": f"s{i}"}}, namespace=NS)
            time.sleep(0.01)
        kubeapi.create("pods", pod("after"), namespace=NS)
        kubeapi.create("secrets", {"metadata": {"name": "last"}}, namespace=NS)
        kubeapi.create("pods", pod("then"), namespace=NS)

    thread = threading.Thread(target=later)
    thread.start()
    seen = _stream(core.list_namespaced_pod, NS, resource_version=rv, count=2,
                   timeout_seconds=5)
    thread.join()
    assert seen == [("ADDED", "after"), ("ADDED", "then")]


def test_a_kinds_waiters_wake_for_that_kind_only(kubeapi: KubeAPI) -> None:
    store = kubeapi.store
    pods, anything = store.changed_for({"pods"}), store.changed
    woken: list[str] = []

    def wait(name: str, condition: threading.Condition) -> None:
        with condition:
            if condition.wait(timeout=5):
                woken.append(name)

    waiters = [threading.Thread(target=wait, args=("pods", pods)),
               threading.Thread(target=wait, args=("any", anything))]
    for t in waiters:
        t.start()
    time.sleep(0.2)  # both waiting
    kubeapi.create("secrets", {"metadata": {"name": "s", "namespace": NS}})
    waiters[1].join(timeout=5)
    time.sleep(0.2)
    assert woken == ["any"]  # a secret wakes what waits for any change, not the pods' waiters
    kubeapi.create("pods", pod("p", namespace=NS))
    waiters[0].join(timeout=5)
    assert woken == ["any", "pods"]
    assert store.changed_for(["pods"]) is pods  # one condition per set of kinds


def test_watch_from_a_compacted_resource_version_raises_410(core: k8s.CoreV1Api,
                                                            kubeapi: KubeAPI) -> None:
    old = core.create_namespaced_pod(NS, pod("p")).metadata.resource_version
    core.patch_namespaced_pod("p", NS, {"metadata": {"labels": {"a": "b"}}}, _content_type=MERGE)
    kubeapi.compact()
    for kwargs in ({"timeout_seconds": 1}, {}):  # without a timeout the client retries once
        with pytest.raises(ApiException) as gone:
            _stream(core.list_namespaced_pod, NS, resource_version=old, **kwargs)
        assert gone.value.status == 410
        assert "too old resource version" in gone.value.reason
    fresh = core.list_namespaced_pod(NS).metadata.resource_version
    assert _stream(core.list_namespaced_pod, NS, resource_version=fresh, timeout_seconds=0.3) == []


def test_ended_watches_resume_from_the_last_resource_version(core: k8s.CoreV1Api,
                                                             kubeapi: KubeAPI) -> None:
    rv = core.list_namespaced_pod(NS).metadata.resource_version
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def follow() -> None:  # no timeout: the client reconnects by itself after a clean end
        for e in w.stream(core.list_namespaced_pod, NS, resource_version=rv):
            seen.append((e["type"], e["raw_object"]["metadata"]["name"]))
            if len(seen) == 2:
                w.stop()

    thread = threading.Thread(target=follow)
    thread.start()
    kubeapi.create("pods", pod("one"), namespace=NS)
    kubeapi.wait_for(lambda: seen, timeout=5)
    kubeapi.end_watches()
    kubeapi.create("pods", pod("two"), namespace=NS)
    thread.join(timeout=5)
    assert seen == [("ADDED", "one"), ("ADDED", "two")]
    assert sum("watch=True" in path for _, path in kubeapi.requests) == 2


def test_bounded_history_expires_old_watches() -> None:
    with KubeAPI(history=3) as api, api.api_client() as client:
        core = k8s.CoreV1Api(client)
        start = core.create_namespaced_secret(
            NS, {"metadata": {"name": "c"}}).metadata.resource_version
        for i in range(4):
            core.patch_namespaced_secret("c", NS, {"data": {"i": str(i)}}, _content_type=MERGE)
        with pytest.raises(ApiException) as gone:
            _stream(core.list_namespaced_secret, NS, resource_version=start,
                    timeout_seconds=1)
        assert gone.value.status == 410


# ---------------------------------------------------------------------- delete, finalizers, GC


def test_finalizers_hold_deletion_until_removed(core: k8s.CoreV1Api, kubeapi: KubeAPI) -> None:
    core.create_namespaced_secret(NS, {"metadata": {"name": "c",
                                                        "finalizers": ["example.com/keep"]}})
    core.delete_namespaced_secret("c", NS)
    held = core.read_namespaced_secret("c", NS)
    assert held.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as add:
        core.patch_namespaced_secret("c", NS, {"metadata": {"finalizers": [
            "example.com/keep", "more"]}}, _content_type=MERGE)
    assert add.value.status == 422
    core.patch_namespaced_secret("c", NS, {"metadata": {"finalizers": None}},
                                 _content_type=MERGE)
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_secret("c", NS)
    assert gone.value.status == 404
    assert [e.type for e in kubeapi.history("secrets")] == [
        "ADDED", "MODIFIED", "DELETED"]


def test_owner_deletion_collects_dependents_recursively(core: k8s.CoreV1Api,
                                                        custom: k8s.CustomObjectsApi,
                                                        kubeapi: KubeAPI) -> None:
    job = custom.create_namespaced_custom_object(*PTJ, pytorchjob("j"))
    ref = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j",
           "uid": job["metadata"]["uid"], "controller": True}
    p = core.create_namespaced_pod(NS, pod("j-worker-0", ownerReferences=[ref]))
    pod_ref = {"apiVersion": "v1", "kind": "Pod", "name": "j-worker-0", "uid": p.metadata.uid}
    core.create_namespaced_secret(NS, {"metadata": {"name": "grandchild",
                                                        "ownerReferences": [pod_ref]}})
    keeper = core.create_namespaced_secret(NS, {"metadata": {"name": "keeper"}})
    keeper_ref = {"apiVersion": "v1", "kind": "Secret", "name": "keeper",
                  "uid": keeper.metadata.uid}
    core.create_namespaced_secret(NS, {"metadata": {"name": "shared",
                                                        "ownerReferences": [ref, keeper_ref]}})
    custom.delete_namespaced_custom_object(*PTJ, "j")
    assert kubeapi.get("pods", NS, "j-worker-0") is None
    assert kubeapi.get("secrets", NS, "grandchild") is None
    shared = kubeapi.get("secrets", NS, "shared")
    assert shared is not None and shared["metadata"]["ownerReferences"] == [keeper_ref]
    causes = {(d.kind, d.name): d.cause for d in kubeapi.deletions}
    assert causes == {("pytorchjobs.kubeflow.org", "j"): "api",
                      ("pods", "j-worker-0"): "garbage-collector",
                      ("secrets", "grandchild"): "garbage-collector"}


def test_batch_jobs_orphan_pods_unless_told_otherwise(kube_client: k8s.ApiClient,
                                                      kubeapi: KubeAPI) -> None:
    batch, core = k8s.BatchV1Api(kube_client), k8s.CoreV1Api(kube_client)
    template = {"spec": {"restartPolicy": "Never",
                         "containers": [{"name": "c", "image": "x"}]}}
    for name in ("orphaning", "collecting"):
        job = batch.create_namespaced_job(NS, {"metadata": {"name": name},
                                               "spec": {"template": template}})
        assert job.spec.template.metadata.labels["job-name"] == name
        ref = {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": job.metadata.uid}
        core.create_namespaced_pod(NS, pod(f"{name}-pod", ownerReferences=[ref]))
    batch.delete_namespaced_job("orphaning", NS)
    left = core.read_namespaced_pod("orphaning-pod", NS)
    assert not left.metadata.owner_references
    batch.delete_namespaced_job("collecting", NS, propagation_policy="Background")
    assert kubeapi.get("pods", NS, "collecting-pod") is None
    assert kubeapi.get("jobs", NS, "collecting") is None


def test_deletions_record_grace_period_and_policy(core: k8s.CoreV1Api, kubeapi: KubeAPI) -> None:
    core.create_namespaced_pod(NS, pod("p"))
    core.create_namespaced_pod(NS, pod("q"))
    core.delete_namespaced_pod("p", NS, body=k8s.V1DeleteOptions(grace_period_seconds=0))
    core.delete_namespaced_pod("q", NS, grace_period_seconds=5,
                               propagation_policy="Orphan")
    record = {d.name: (d.grace_period_seconds, d.propagation_policy, d.cause)
              for d in kubeapi.deletions_of("pods")}
    assert record == {"p": (0, "Background", "api"), "q": (5, "Orphan", "api")}
    core.create_namespaced_pod(NS, pod("r"))
    with pytest.raises(ApiException) as foreground:
        core.delete_namespaced_pod("r", NS, propagation_policy="Foreground")
    assert foreground.value.status == 400  # not emulated
    with pytest.raises(ApiException) as missing:
        core.delete_namespaced_pod("p", NS)
    assert missing.value.status == 404


def test_dry_run_and_delete_collection_are_refused_not_faked(core: k8s.CoreV1Api,
                                                              kubeapi: KubeAPI) -> None:
    with pytest.raises(ApiException) as dry:
        core.create_namespaced_pod(NS, pod("d"), dry_run="All")
    assert dry.value.status == 400 and kubeapi.get("pods", NS, "d") is None
    core.create_namespaced_pod(NS, pod("a"))
    with pytest.raises(ApiException) as collection:
        core.delete_collection_namespaced_pod(NS)
    assert collection.value.status == 405 and kubeapi.get("pods", NS, "a") is not None


def test_namespace_deletion_is_not_emulated(core: k8s.CoreV1Api, kubeapi: KubeAPI) -> None:
    core.create_namespaced_pod("kept", pod("p"))
    with pytest.raises(ApiException) as refused:
        core.delete_namespace("kept")
    assert refused.value.status == 405 and len(kubeapi.list("pods", "kept")) == 1


# ---------------------------------------------------------------------- admission, helpers


def test_validators_reject_with_422_and_created_log_keeps_everything(
        core: k8s.CoreV1Api, kubeapi: KubeAPI) -> None:
    def no_latest(obj: dict[str, Any]) -> str | None:
        for c in obj.get("spec", {}).get("containers", []):
            if c.get("image", "").endswith(":latest"):
                return f"spec.containers[{c['name']}].image: no :latest"
        return None

    def labelled(obj: dict[str, Any]) -> None:
        assert obj["metadata"].get("labels"), "metadata.labels: required"

    kubeapi.add_validator(no_latest)
    kubeapi.add_validator(labelled)
    bad = pod("p", {"a": "b"})
    bad["spec"]["containers"][0]["image"] = "busybox:latest"
    with pytest.raises(ApiException) as denied:
        core.create_namespaced_pod(NS, bad)
    assert denied.value.status == 422 and "no :latest" in status_of(denied.value)["message"]
    with pytest.raises(ApiException) as unlabelled:
        core.create_namespaced_pod(NS, pod("p"))
    assert "metadata.labels: required" in status_of(unlabelled.value)["message"]
    core.create_namespaced_pod(NS, pod("p", {"a": "b"}))
    with pytest.raises(ApiException) as patched:
        core.patch_namespaced_pod("p", NS, {"spec": {"containers": [
            {"name": "main", "image": "x:latest"}]}}, _content_type=MERGE)
    assert patched.value.status == 422
    core.delete_namespaced_pod("p", NS)
    assert [p["metadata"]["name"] for p in kubeapi.created("pods")] == ["p"]


def test_in_process_accessors_emit_events_and_wait_for(kubeapi: KubeAPI,
                                                       core: k8s.CoreV1Api) -> None:
    kubeapi.create("secrets", {"metadata": {"name": "c", "namespace": NS}})
    kubeapi.patch("secret", NS, "c", {"data": {"x": "1"}})

    def later() -> None:
        time.sleep(0.1)
        core.patch_namespaced_secret("c", NS, {"data": {"x": "2"}}, _content_type=MERGE)

    threading.Thread(target=later).start()
    got = kubeapi.wait_for(lambda: (kubeapi.get("secrets", NS, "c") or {}).get(
        "data", {}).get("x") == "2" and "done", timeout=5)
    assert got == "done"
    assert [e.type for e in kubeapi.history("secrets")] == ["ADDED", "MODIFIED", "MODIFIED"]
    with pytest.raises(TimeoutError, match="never"):
        kubeapi.wait_for(lambda: False, timeout=0.1, message="never")
    kubeapi.delete("secrets", NS, "c")
    assert kubeapi.get("secrets", NS, "c") is None


def test_concurrent_optimistic_writers_lose_no_update(kubeapi: KubeAPI) -> None:
    kubeapi.create("secrets", {"metadata": {"name": "counter"}, "data": {"n": "0"}}, NS)
    conflicts = []

    def increment(times: int) -> None:
        with kubeapi.api_client() as client:
            core = k8s.CoreV1Api(client)
            for _ in range(times):
                while True:
                    cm = core.read_namespaced_secret("counter", NS)
                    cm.data["n"] = str(int(cm.data["n"]) + 1)
                    try:
                        core.replace_namespaced_secret("counter", NS, cm)
                        break
                    except ApiException as e:
                        assert e.status == 409
                        conflicts.append(1)

    threads = [threading.Thread(target=increment, args=(10,)) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (kubeapi.get("secrets", NS, "counter") or {})["data"]["n"] == "60"
    assert conflicts  # six writers on one object do collide


def test_leases_support_optimistic_leader_election(kube_client: k8s.ApiClient) -> None:
    coord = k8s.CoordinationV1Api(kube_client)
    lease = coord.create_namespaced_lease(NS, {"metadata": {"name": "op"}, "spec": {
        "holderIdentity": "a", "leaseDurationSeconds": 15}})
    mine = coord.read_namespaced_lease("op", NS)
    mine.spec.holder_identity = "b"
    coord.replace_namespaced_lease("op", NS, mine)
    lease.spec.holder_identity = "c"
    with pytest.raises(ApiException) as lost:
        coord.replace_namespaced_lease("op", NS, lease)
    assert lost.value.status == 409
    assert coord.read_namespaced_lease("op", NS).spec.holder_identity == "b"


def test_injected_faults_and_restart_on_the_same_port(kubeapi: KubeAPI,
                                                       core: k8s.CoreV1Api) -> None:
    kubeapi.inject_fault(method="POST", kind="pods", code=500, times=1)
    with pytest.raises(ApiException) as injected:
        core.create_namespaced_pod(NS, pod("p"))
    assert injected.value.status == 500
    core.create_namespaced_pod(NS, pod("p"))
    url = kubeapi.url
    kubeapi.stop()
    kubeapi.start()
    assert kubeapi.url == url
    assert core.read_namespaced_pod("p", NS).metadata.name == "p"


# ---------------------------------------------------------------------- what kubectl asks for

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def _http(kubeapi: KubeAPI, path: str, accept: str = "application/json",
          method: str = "GET", body: Any = None,
          content_type: str = "application/json") -> tuple[int, dict[str, str], bytes]:
    """One raw request, redirects not followed (the client's view of the wire)."""
    conn = http.client.HTTPConnection(kubeapi.url.removeprefix("http://"), timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Accept": accept,
                                                        "Content-Type": content_type})
        response = conn.getresponse()
        warnings = ", ".join(response.headers.get_all("Warning") or [])
        headers = {**dict(response.headers), "Warning": warnings}
        return response.status, headers, response.read()
    finally:
        conn.close()


def test_custom_resources_are_printed_as_tables(custom: k8s.CustomObjectsApi,
                                                kubeapi: KubeAPI) -> None:
    custom.create_namespaced_custom_object(*PTJ, pytorchjob("j"))
    kubeapi.patch_status("pytorchjobs", NS, "j", {"conditions": [
        {"type": "Created", "status": "True"}, {"type": "Running", "status": "True"}]})
    base = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
    code, _, body = _http(kubeapi, base, TABLE)
    table = json.loads(body)
    assert code == 200 and (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "State", "Age"]
    [row] = table["rows"]
    assert row["cells"][:2] == ["j", "Running"] and row["cells"][2].endswith("s")
    assert row["object"]["kind"] == "PartialObjectMetadata"
    one = json.loads(_http(kubeapi, f"{base}/j?includeObject=Object", TABLE)[2])
    assert one["rows"][0]["object"]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    # Plain JSON for clients that do not ask, and for built-in kinds (printed client-side).
    assert json.loads(_http(kubeapi, base)[2])["kind"] == "PyTorchJobList"
    assert json.loads(_http(kubeapi, f"/api/v1/namespaces/{NS}/pods", TABLE)[2])["kind"] == (
        "PodList")


def test_a_table_watch_sends_column_definitions_once(custom: k8s.CustomObjectsApi,
                                                     kubeapi: KubeAPI) -> None:
    custom.create_namespaced_custom_object(*PTJ, pytorchjob("a"))
    custom.create_namespaced_custom_object(*PTJ, pytorchjob("b"))
    path = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs?watch=true&timeoutSeconds=1"
    code, _, body = _http(kubeapi, path, TABLE)
    events = [json.loads(line) for line in body.decode().splitlines()]
    assert code == 200 and [e["type"] for e in events] == ["ADDED", "ADDED"]
    assert [e["object"]["rows"][0]["cells"][0] for e in events] == ["a", "b"]
    assert events[0]["object"]["columnDefinitions"][1]["name"] == "State"
    assert events[1]["object"]["columnDefinitions"] is None


def test_openapi_v3_index_and_documents(kubeapi: KubeAPI) -> None:
    code, _, body = _http(kubeapi, "/openapi/v3")
    url = json.loads(body)["paths"]["apis/kubeflow.org/v1"]["serverRelativeURL"]
    code, _, body = _http(kubeapi, url)
    assert code == 200
    assert "/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}" in json.loads(
        body)["paths"]
    assert _http(kubeapi, "/openapi/v3/apis/nothing.io/v1")[0] == 404
    assert _http(kubeapi, "/openapi/v2")[0] == 404


def test_field_validation_strict_fails_and_warn_warns(kubeapi: KubeAPI) -> None:
    base = f"/apis/kubeflow.org/v1/namespaces/{NS}/pytorchjobs"
    body = pytorchjob("j")
    body["spec"]["unknownKnob"] = True
    code, _, out = _http(kubeapi, f"{base}?fieldValidation=Strict", method="POST", body=body)
    assert code == 400 and json.loads(out)["message"].endswith(
        'strict decoding error: unknown field "spec.unknownKnob"')
    code, headers, out = _http(kubeapi, base, method="POST", body=body)
    assert code == 201 and "unknownKnob" not in json.loads(out)["spec"]
    assert headers["Warning"] == '299 - "unknown field \\"spec.unknownKnob\\""'
    code, _, out = _http(kubeapi, f"{base}/j?fieldValidation=Strict", method="PATCH",
                         body={"spec": {"unknownKnob": 1}},
                         content_type="application/merge-patch+json")
    assert code == 422 and "strict decoding error" in json.loads(out)["message"]
    assert _http(kubeapi, f"{base}?fieldValidation=Loose", method="POST", body=body)[0] == 422
