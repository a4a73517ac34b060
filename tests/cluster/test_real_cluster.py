"""Qualifications on a real cluster: by default the local one (``testing/cluster``: a real
kube-apiserver, etcd, controller manager and scheduler, CoreDNS, the Kubeflow training
operator v1.9, Trainer v2 and JobSet, SeaweedFS, the chart installed with helm; pods run
by the node agent as real processes).

Each test applies a QualificationRun (2 nodes x 1 rank on CPU, the cut on rank 1) for one
preemption users face — a hard pod kill (deleted with grace 0), a graceful pod kill
(deleted with a grace period), a process kill (a kill order: no pod is deleted) — with
each backend (PyTorchJob, TrainJob), waits for the verdict in the status, checks what the
operator reported and exported, then deletes the run and checks that its finalizer and
the garbage collector removed everything it made. Others check what the real API server
enforces: the chart's RBAC (a rule removed, the operator refused) and Pod Security
``restricted`` in the watched namespaces.

Another cluster can be named instead: ``RESUMEQUAL_CLUSTER_KUBECONFIG`` (a cluster with
the training operator, Trainer v2 and the chart, watching ``RESUMEQUAL_CLUSTER_NAMESPACE``),
``RESUMEQUAL_CLUSTER_STORE`` (``s3://bucket/prefix``), ``RESUMEQUAL_CLUSTER_STORE_ENDPOINT``
and ``RESUMEQUAL_CLUSTER_STORE_SECRET`` (a Secret with ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` in that namespace), ``RESUMEQUAL_CLUSTER_IMAGE`` (the worker image).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from kubernetes import client, config

from tests.waiting import eventually

if TYPE_CHECKING:
    from testing.cluster.cluster import Cluster

# The first test's setup starts the whole cluster (building what is missing): minutes on
# two cores beside the rest of the suite.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]

GROUP, VERSION, PLURAL = "resumequal.dev", "v1alpha1", "qualificationruns"
TIMEOUT_S = float(os.environ.get("RESUMEQUAL_CLUSTER_TIMEOUT", "900"))
PREEMPTIONS = {
    "hard-pod": {"mode": "hard", "target": "pod"},
    "graceful-pod": {"mode": "graceful", "target": "pod", "graceSeconds": 60},
    "hard-process": {"mode": "hard", "target": "process"},
}
BACKENDS = ("pytorchjob", "trainjob")


@dataclass(frozen=True)
class Target:
    """Where the runs go and what they name."""

    api: client.ApiClient
    namespace: str
    store: str
    endpoint: str | None
    secret: str | None
    image: str
    local: Cluster | None


@pytest.fixture(scope="module")
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    kubeconfig = os.environ.get("RESUMEQUAL_CLUSTER_KUBECONFIG")
    if kubeconfig:
        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        with client.ApiClient(configuration) as api:
            yield Target(api, os.environ.get("RESUMEQUAL_CLUSTER_NAMESPACE", "resumequal-e2e"),
                         os.environ["RESUMEQUAL_CLUSTER_STORE"],
                         os.environ.get("RESUMEQUAL_CLUSTER_STORE_ENDPOINT"),
                         os.environ.get("RESUMEQUAL_CLUSTER_STORE_SECRET"),
                         os.environ.get("RESUMEQUAL_CLUSTER_IMAGE", "resumequal-worker:dev"),
                         None)
        return
    from testing.cluster import cluster as local

    running: Cluster = request.getfixturevalue("local_cluster")
    api = request.getfixturevalue("cluster_admin")
    yield Target(api, "resumequal-e2e", f"s3://{local.BUCKET}/e2e", running.s3_in_cluster,
                 local.S3_SECRET, local.WORKER_IMAGE, running)


def manifest(target: Target, name: str, backend: str, preemption: dict[str, Any]) -> dict[str, Any]:
    store: dict[str, Any] = {"uri": target.store, "addressingStyle": "path"}
    if target.endpoint:
        store["endpointUrl"] = target.endpoint
    if target.secret:
        store["credentialsSecret"] = target.secret
    return {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "QualificationRun",
        "metadata": {"name": name, "namespace": target.namespace},
        "spec": {
            "stack": {"image": target.image, "pin": f"e2e-{name}",
                      **({"imagePullPolicy": "IfNotPresent"} if backend == "pytorchjob"
                         else {})},
            "store": store,
            "backend": backend,
            "workload": {"name": "tiny-gpt"},
            "world": {"nnodes": 2, "nprocPerNode": 1, "backend": "gloo"},
            "training": {"steps": 8, "accumulationSteps": 2},
            "checkpoint": {"everySteps": 2},
            "preemption": {"step": 5, "microstep": 1, "rank": 1, **preemption},
            "timeouts": {"armSeconds": 240, "processGroupSeconds": 300, "restartSeconds": 300,
                         "legSeconds": 900},
            "controls": {"enabled": False},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            "retention": {"policy": "Delete"},
        },
    }


def _get(objects: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = objects.get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                   PLURAL, name)
        return obj
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def _wait_ended(objects: client.CustomObjectsApi, namespace: str, name: str
                ) -> tuple[dict[str, Any], list[str]]:
    phases: list[str] = []
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        status = (_get(objects, namespace, name) or {}).get("status") or {}
        phase = status.get("phase")
        if phase and (not phases or phases[-1] != phase):
            phases.append(phase)
        if phase in ("Succeeded", "Failed"):
            return status, phases
        assert time.monotonic() < deadline, f"no verdict within {TIMEOUT_S:g}s: {phases}"
        time.sleep(2)


def _delete_and_wait_gone(objects: client.CustomObjectsApi, namespace: str, name: str) -> None:
    objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    gone_by = time.monotonic() + 120
    while _get(objects, namespace, name) is not None:
        assert time.monotonic() < gone_by, "the run's finalizer did not finish"
        time.sleep(1)


def _operator_metrics(target: Target) -> str:
    """The operator's /metrics, scraped at its pod's address as Prometheus scrapes it."""
    core = client.CoreV1Api(target.api)
    pods = core.list_namespaced_pod("resumequal-system",
                                    label_selector="app.kubernetes.io/name=resumequal").items
    running = [p for p in pods if p.status.phase == "Running" and p.status.pod_ip]
    assert running, "no running operator pod"
    with urllib.request.urlopen(f"http://{running[0].status.pod_ip}:8080/metrics",
                                timeout=10) as r:
        return str(r.read().decode())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("preemption", PREEMPTIONS.values(), ids=PREEMPTIONS.keys())
def test_a_qualification_run_gets_its_verdict_on_a_real_cluster(
    target: Target, backend: str, preemption: dict[str, Any],
) -> None:
    objects = client.CustomObjectsApi(target.api)
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    objects.create_namespaced_custom_object(GROUP, VERSION, target.namespace, PLURAL,
                                            manifest(target, name, backend, preemption))
    try:
        status, phases = _wait_ended(objects, target.namespace, name)
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        assert status["phase"] == "Succeeded", f"phases {phases}; Ready: {conditions.get('Ready')}"
        verdict = status["verdict"]
        assert verdict["result"] == "PASS", verdict
        assert verdict["firstDivergenceSummary"] == "none"
        assert conditions["Qualified"]["status"] == "True"
        assert conditions["Ready"]["status"] == "True"
        assert status["pin"] == f"e2e-{name}"
        assert status["reportUrl"].endswith("/report.html")
        reported = status["preemption"]
        assert reported["rank"] == 1 and reported["mode"] == preemption["mode"]
        node1 = "-worker-1" if backend == "pytorchjob" else "-node-0-1-"
        assert node1 in reported["pod"], reported
        assert status["legs"]["preempted"]["attempts"] >= 2
        assert status["legs"]["preempted"]["restartSeconds"] > 0
        # The operator writes Events from a thread of its own, after the status at times.
        eventually(lambda: any(e.reason == "PreemptionInjected" for e in client.CoreV1Api(
            target.api).list_namespaced_event(
                target.namespace, field_selector=f"involvedObject.name={name}").items),
            30, "the PreemptionInjected Event", interval=1.0)
        if target.local is not None:
            passed = [line for line in _operator_metrics(target).splitlines()
                      if line.startswith("resumequal_qualification_passed{")
                      and f'run="{name}"' in line]
            assert len(passed) == 1 and passed[0].endswith(" 1.0"), passed
    finally:
        _delete_and_wait_gone(objects, target.namespace, name)
    group, version, plural = (("kubeflow.org", "v1", "pytorchjobs") if backend == "pytorchjob"
                              else ("trainer.kubeflow.org", "v1alpha1", "trainjobs"))
    selector = f"resumequal.dev/run={name}"

    def nothing_left() -> bool:
        jobs = objects.list_namespaced_custom_object(group, version, target.namespace, plural,
                                                     label_selector=selector)["items"]
        core = client.CoreV1Api(target.api)
        pods = core.list_namespaced_pod(target.namespace, label_selector=selector).items
        return not jobs and not pods

    # The garbage collector deletes what the run owned (jobs, their pods, the key Secret).
    eventually(nothing_left, 120, "the run's jobs and pods gone", interval=1.0)


def test_the_real_api_server_refuses_the_operator_what_its_rbac_does_not_grant(
    target: Target,
) -> None:
    if target.local is None:
        pytest.skip("changes the chart's Role: only on the local cluster")
    rbac = client.RbacAuthorizationV1Api(target.api)
    role = rbac.read_namespaced_role("resumequal", target.namespace)
    original = [r for r in role.rules]
    # Without "create secrets" the operator cannot make the run's checkpoint key Secret.
    role.rules = [r for r in role.rules if r.resources != ["secrets"]]
    assert len(role.rules) == len(original) - 1
    rbac.replace_namespaced_role("resumequal", target.namespace, role)
    objects = client.CustomObjectsApi(target.api)
    name = f"e2e-rbac-{uuid.uuid4().hex[:6]}"
    body = manifest(target, name, "pytorchjob", PREEMPTIONS["hard-pod"])
    body["spec"]["timeouts"]["backendErrorSeconds"] = 20  # then the run gives up
    try:
        objects.create_namespaced_custom_object(GROUP, VERSION, target.namespace, PLURAL, body)

        def refused() -> str | None:
            status = (_get(objects, target.namespace, name) or {}).get("status") or {}
            text = str(((status.get("machine") or {}).get("errors") or {}).get("message"))
            return text if "403" in text else None

        # While it retries, the status says what the API server refused, and why.
        message = eventually(refused, 60, "a 403 in the run's status", interval=1.0)
        assert ('HTTP 403 Forbidden: secrets is forbidden: User "system:serviceaccount:'
                'resumequal-system:resumequal" cannot create resource "secrets"') in message
        status, phases = _wait_ended(objects, target.namespace, name)
        ready = {c["type"]: c for c in status["conditions"]}["Ready"]
        assert status["phase"] == "Failed" and ready["status"] == "False", (phases, ready)
        assert "403 Forbidden" in ready["message"] and "secrets" in ready["message"], ready
    finally:
        role = rbac.read_namespaced_role("resumequal", target.namespace)
        role.rules = original
        rbac.replace_namespaced_role("resumequal", target.namespace, role)
        _delete_and_wait_gone(objects, target.namespace, name)


def test_pod_security_restricted_refuses_a_privileged_pod(target: Target) -> None:
    core = client.CoreV1Api(target.api)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged-probe"},
           "spec": {"containers": [{"name": "c", "image": target.image,
                                    "securityContext": {"privileged": True}}]}}
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod(target.namespace, pod)
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'violates PodSecurity "restricted:latest"' in message, message
    assert 'privileged (container "c" must not set securityContext.privileged=true)' in message
    # Nothing of it exists.
    assert not [p for p in core.list_namespaced_pod(target.namespace).items
                if p.metadata.name == "privileged-probe"]
