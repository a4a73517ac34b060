"""The chart's RBAC against what the operator really asks of the API server.

One operator does everything it ever does — applies its CRD (create, then update), elects
itself through a Lease, drives a run from apply to verdict with a pod kill, and lets the
run go through its finalizer on deletion, on the pod cluster — while the proxy between
them records every HTTP request.
Each request must be allowed by a rule the chart binds to the operator's ServiceAccount,
and every rule must be used by some request: no verb granted that nothing uses.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import helm_python as helm
import pytest
import yaml

from resumequal_operator.crdsync import CRD_NAME, DIGEST_ANNOTATION, ensure_crd
from resumequal_operator.kube import QUALIFICATION_RUNS, Kube
from testing.cluster.node.scriptnode import NodeRuntime
from testing.cluster.podcluster import PodCluster
from testing.cluster.testapi import RealAPI
from testing.operator.harness import (
    NAMESPACE,
    Admission,
    Operators,
    run_manifest,
    s3_store,
    store_s3,
    wait_phase,
)
from testing.operator.workers import Workers
from tests.s3server import use_dummy_credentials

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS

CHART = Path(__file__).resolve().parents[2] / "charts/resumequal"
RELEASE = "rq"
SERVICE_ACCOUNT = "rq-resumequal"

# Granted without the operator ever requesting it: the jobs and the Secret it creates are
# owned by the run with blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
# admission plugin allows only to who may update the owner's finalizers.
NOT_A_REQUEST = {("resumequal.dev", "qualificationruns/finalizers", "update")}
# Requested only by a resize run, which the scripted workers below do not play: its Worker
# replicas read, then patched down at the kill and up at the grow
# (tests/cluster reads them from the real API server's audit log, and
# tests/operator/test_backend.py records them). Otherwise a leg's PyTorchJob is read from
# the operator's watch of its jobs, and read from the API server only while a job just
# created is not watched yet.
RESIZE_ONLY = {("kubeflow.org", "pytorchjobs", "patch"), ("kubeflow.org", "pytorchjobs", "get")}
# Requested only to follow a zoom Job (a FAIL with zoom: onFail; tests/operator/
# test_lifecycle.py), or to read a job that exists but is not watched yet (the comparator
# Job's create answered 409; without a watch of Jobs, as in tests/operator/test_backend.py,
# every read): the comparator Job of this run is created without a GET first and then
# read from the operator's watch of its Jobs.
ZOOM_OR_LAG_ONLY = {("batch", "jobs", "get")}


@dataclass(frozen=True)
class Request:
    """One API request as RBAC sees it."""

    verb: str
    group: str
    resource: str  # with its subresource: qualificationruns/status
    namespace: str | None
    name: str | None

    def __str__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource} {self.name or ''}{where}"


def request_of(method: str, target: str) -> Request:
    """``GET /apis/batch/v1/namespaces/q/jobs?labelSelector=...`` as RBAC's attributes
    (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go, for the paths we use)."""
    url = urlsplit(target)
    parts = url.path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        raise AssertionError(f"not a resource request: {method} {target}")
    namespace = None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = rest[0], (rest[1] if len(rest) > 1 else None), rest[2:]
    if method == "GET":
        watch = parse_qs(url.query).get("watch") == ["true"]
        verb = "get" if name else ("watch" if watch else "list")
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
    return Request(verb, group, "/".join([resource, *sub]), namespace, name)


@dataclass(frozen=True)
class Rule:
    role: str
    namespace: str | None  # None: a ClusterRole
    group: str
    resource: str
    verb: str
    names: tuple[str, ...]

    def allows(self, r: Request) -> bool:
        return ((self.namespace is None or self.namespace == r.namespace)
                and (self.group, self.resource, self.verb) == (r.group, r.resource, r.verb)
                and (not self.names or r.name in self.names))


def bound_rules(objs: list[dict[str, Any]]) -> list[Rule]:
    """Every rule of every Role and ClusterRole bound to the operator's ServiceAccount."""
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    out: list[Rule] = []
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == SERVICE_ACCOUNT
                   for s in b["subjects"]):
            continue
        namespace = b["metadata"].get("namespace")
        ref = b["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role["rules"]:
            out += [Rule(role["metadata"]["name"], namespace, g, res, v,
                         tuple(rule.get("resourceNames") or ()))
                    for g in rule["apiGroups"] for res in rule["resources"]
                    for v in rule["verbs"]]
    return out


def chart_rules(values: dict[str, Any] | None = None) -> list[Rule]:
    """The RBAC of the chart installed in the test namespace, watching it (``values``
    added)."""
    with helm.Chart.load(CHART) as chart:
        out = chart.render({"watch": {"namespaces": [NAMESPACE]}, **(values or {})},
                           name=RELEASE, namespace=NAMESPACE)
    objs = [d for name, text in sorted(out.items()) if not name.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]
    return bound_rules(objs)


@pytest.fixture(scope="module")
def requests(s3_server: SeaweedFS, pod_cluster: PodCluster) -> Iterator[list[Request]]:
    """Every request one operator made over its whole working life."""
    with pytest.MonkeyPatch.context() as mp:
        use_dummy_credentials(mp)
        api = RealAPI(pod_cluster.api, NAMESPACE)
        api.add_validator(Admission())
        # The chart installed the CRD: gone, as before the operator's first start (put
        # back when the module ends).
        api.delete("customresourcedefinitions", "", CRD_NAME)
        kube = Kube(api.api_client())
        try:
            assert ensure_crd(kube, "apply") == "created"
            api.patch("customresourcedefinitions", "", CRD_NAME,
                      {"metadata": {"annotations": {DIGEST_ANNOTATION: "an-older-schema"}}})
            assert ensure_crd(kube, "apply") == "updated"
        finally:
            kube.close()
        store = s3_store(s3_server.endpoint, s3_server.new_bucket())
        workers = Workers(s3=store_s3(store))
        ops = Operators(api, endpoints=(s3_server.endpoint,))
        # A status write that conflicts once: the run is read again (its only read; every
        # reconcile takes it from the watch).
        api.inject_fault(method="PUT", kind=QUALIFICATION_RUNS.plural + ".resumequal.dev",
                         subresource="status", code=409, times=1, message="the object changed")
        pod_cluster.scripts.bind(lambda: NodeRuntime(workers))
        try:
            ops.start()
            api.create(QUALIFICATION_RUNS.plural, run_manifest("rbac", store))
            run = wait_phase(api, "rbac", ("Succeeded", "Failed"), timeout=120)
            assert run["status"]["phase"] == "Succeeded"
            api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "rbac")
            api.wait_for(
                lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "rbac") is None,
                10, "the finalizer to let the run go")
            ops.stop_all()  # releases the Lease
            yield [request_of(m, p) for m, p in api.requests]
        finally:
            try:
                ops.stop_all()
                api.close()
            finally:
                pod_cluster.scripts.unbind()


def test_every_request_the_operator_makes_is_allowed(requests: list[Request]) -> None:
    rules = chart_rules()
    denied = sorted({str(r) for r in requests if not any(rule.allows(r) for rule in rules)})
    assert denied == []


def test_every_rule_is_used(requests: list[Request]) -> None:
    unused = {(rule.role, rule.group, rule.resource, rule.verb) for rule in chart_rules()
              if (rule.group, rule.resource, rule.verb)
              not in NOT_A_REQUEST | RESIZE_ONLY | ZOOM_OR_LAG_ONLY
              and not any(rule.allows(r) for r in requests)}
    assert unused == set()
    # The rules no request of this run uses are still granted (the operator's creates
    # need the one, a resize, a zoom or a lagging watch the others).
    assert {(r.group, r.resource, r.verb) for r in chart_rules()} >= (
        NOT_A_REQUEST | RESIZE_ONLY | ZOOM_OR_LAG_ONLY)


def test_the_life_covered_every_kind_of_request(requests: list[Request]) -> None:
    # A sanity check of the run above: what the test relies on happened.
    seen = {(r.resource, r.verb) for r in requests}
    assert {("pods", "delete"), ("secrets", "create"), ("leases", "update"),
            ("customresourcedefinitions", "create"), ("customresourcedefinitions", "update"),
            ("qualificationruns", "watch"), ("qualificationruns/status", "update"),
            ("pytorchjobs", "watch"), ("jobs", "watch")} <= seen
