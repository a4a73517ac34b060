"""A real qualification on a real cluster: kind + Kubeflow training operator + MinIO.

Opt-in (``pytest -m cluster``) and skipped unless the cluster is named. What it needs:

- ``RESUMEQUAL_CLUSTER_KUBECONFIG`` (or ``KUBECONFIG``): a cluster with the Kubeflow
  training operator (v1.9, PyTorchJob) and the resumequal chart installed, watching
  ``RESUMEQUAL_CLUSTER_NAMESPACE`` (default ``resumequal-e2e``);
- ``RESUMEQUAL_CLUSTER_STORE``: ``s3://bucket/prefix`` on an S3 endpoint the pods reach,
  with ``RESUMEQUAL_CLUSTER_STORE_ENDPOINT`` (e.g. ``http://minio.minio:9000``) and
  ``RESUMEQUAL_CLUSTER_STORE_SECRET``: a Secret in that namespace with
  ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (the operator reads the store with its
  own AWS environment, set through the chart's ``operator.extraEnv``, and may send it only
  to an endpoint in the chart's ``allowlist.endpoints``, which must list this one);
- ``RESUMEQUAL_CLUSTER_IMAGE``: the worker image loaded into the cluster (default
  ``resumequal-worker:dev``); ``RESUMEQUAL_CLUSTER_TIMEOUT``: seconds to wait (default 1800);
- ``RESUMEQUAL_CLUSTER_BACKEND``: ``pytorchjob`` (default) or ``trainjob``: the legs as
  Kubeflow Trainer v2 TrainJobs (Trainer v2 installed, the chart with
  ``trainjob.enabled=true``).

It applies a QualificationRun (2 nodes x 1 rank on CPU, the cut on rank 1, pod worker-1)
for each preemption users face — a hard pod kill (deleted with grace 0), a graceful pod
kill (deleted with a grace period), a process kill (a kill order: no pod is deleted) —
waits for the verdict in the status, checks what the operator reported, then deletes the
run and checks that its finalizer removed every job.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.waiting import eventually

pytestmark = pytest.mark.cluster

KUBECONFIG = os.environ.get("RESUMEQUAL_CLUSTER_KUBECONFIG") or os.environ.get("KUBECONFIG")
STORE = os.environ.get("RESUMEQUAL_CLUSTER_STORE")
NAMESPACE = os.environ.get("RESUMEQUAL_CLUSTER_NAMESPACE", "resumequal-e2e")
IMAGE = os.environ.get("RESUMEQUAL_CLUSTER_IMAGE", "resumequal-worker:dev")
ENDPOINT = os.environ.get("RESUMEQUAL_CLUSTER_STORE_ENDPOINT")
SECRET = os.environ.get("RESUMEQUAL_CLUSTER_STORE_SECRET")
TIMEOUT = float(os.environ.get("RESUMEQUAL_CLUSTER_TIMEOUT", "1800"))
BACKEND = os.environ.get("RESUMEQUAL_CLUSTER_BACKEND", "pytorchjob")

GROUP, VERSION, PLURAL = "resumequal.dev", "v1alpha1", "qualificationruns"

if not (KUBECONFIG and STORE):
    pytest.skip(
        "no cluster: set RESUMEQUAL_CLUSTER_KUBECONFIG (or KUBECONFIG) and "
        "RESUMEQUAL_CLUSTER_STORE=s3://bucket/prefix (see tests/cluster/test_real_cluster.py)",
        allow_module_level=True,
    )

from kubernetes import client, config  # noqa: E402 - only with a cluster to talk to


@pytest.fixture(scope="module")
def api() -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=KUBECONFIG, client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        core = client.CoreV1Api(api_client)
        try:
            core.read_namespace(NAMESPACE)
        except client.ApiException as e:
            if e.status != 404:
                raise
            core.create_namespace({"metadata": {"name": NAMESPACE}})
        yield api_client


def _manifest(name: str, preemption: dict[str, Any]) -> dict[str, Any]:
    store: dict[str, Any] = {"uri": STORE, "addressingStyle": "path"}
    if ENDPOINT:
        store["endpointUrl"] = ENDPOINT
    if SECRET:
        store["credentialsSecret"] = SECRET
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "QualificationRun",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "stack": {"image": IMAGE, "pin": f"e2e-{name}",
                      **({"imagePullPolicy": "IfNotPresent"} if BACKEND == "pytorchjob" else {})},
            "store": store,
            "backend": BACKEND,
            "workload": {"name": "tiny-gpt"},
            "world": {"nnodes": 2, "nprocPerNode": 1, "backend": "gloo"},
            "training": {"steps": 8, "accumulationSteps": 2},
            "checkpoint": {"everySteps": 2},
            "preemption": {"step": 5, "microstep": 1, "rank": 1, **preemption},
            "timeouts": {"armSeconds": 300, "restartSeconds": 600, "legSeconds": 1500},
            "controls": {"enabled": False},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
            "retention": {"policy": "Delete"},
        },
    }


def _get(objects: client.CustomObjectsApi, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = objects.get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, name)
        return obj
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


PREEMPTIONS = {
    "hard-pod": {"mode": "hard", "target": "pod"},
    "graceful-pod": {"mode": "graceful", "target": "pod", "graceSeconds": 60},
    "hard-process": {"mode": "hard", "target": "process"},
}


@pytest.mark.parametrize("preemption", PREEMPTIONS.values(), ids=PREEMPTIONS.keys())
def test_a_qualification_run_gets_its_verdict_on_a_real_cluster(
    api: client.ApiClient, preemption: dict[str, Any],
) -> None:
    objects = client.CustomObjectsApi(api)
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    objects.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL,
                                            _manifest(name, preemption))
    phases: list[str] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while True:
            obj = _get(objects, name) or {}
            status = obj.get("status") or {}
            phase = status.get("phase")
            if phase and (not phases or phases[-1] != phase):
                phases.append(phase)
            if phase in ("Succeeded", "Failed"):
                break
            assert time.monotonic() < deadline, f"no verdict within {TIMEOUT:g}s: {phases}"
            time.sleep(5)

        conditions = {c["type"]: c for c in status.get("conditions") or []}
        assert phase == "Succeeded", f"phases {phases}; Ready: {conditions.get('Ready')}"
        verdict = status["verdict"]
        assert verdict["result"] == "PASS", verdict
        assert verdict["firstDivergenceSummary"] == "none"
        assert conditions["Qualified"]["status"] == "True"
        assert conditions["Ready"]["status"] == "True"
        assert status["pin"] == f"e2e-{name}"
        assert status["reportUrl"].endswith("/report.html")
        reported = status["preemption"]
        assert reported["rank"] == 1 and reported["mode"] == preemption["mode"]
        node1 = "-worker-1" if BACKEND == "pytorchjob" else "-node-0-1-"
        assert node1 in reported["pod"], reported
        assert status["legs"]["preempted"]["attempts"] >= 2
        assert status["legs"]["preempted"]["restartSeconds"] > 0
        # The operator writes Events from a thread of its own, after the status at times.
        eventually(lambda: any(e.reason == "PreemptionInjected" for e in client.CoreV1Api(
            api).list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}"
                                       ).items), 30, "the PreemptionInjected Event",
                   interval=1.0)
    finally:
        objects.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        gone_by = time.monotonic() + 120
        while _get(objects, name) is not None:
            assert time.monotonic() < gone_by, "the run's finalizer did not finish"
            time.sleep(2)
    group, version, plural = (("kubeflow.org", "v1", "pytorchjobs") if BACKEND == "pytorchjob"
                              else ("trainer.kubeflow.org", "v1alpha1", "trainjobs"))
    jobs = client.CustomObjectsApi(api).list_namespaced_custom_object(
        group, version, NAMESPACE, plural, label_selector=f"resumequal.dev/run={name}")
    assert [j for j in jobs["items"] if not j["metadata"].get("deletionTimestamp")] == []
