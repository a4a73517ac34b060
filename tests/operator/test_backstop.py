"""The deadline backstop of a leg, for when the operator is down: as the training operator
and the kubelet really enforce deadlines.

The training operator checks a job's ``activeDeadlineSeconds`` only when an event arrives
(its delayed requeue goes nowhere: kubeflow/trainer#3358), so a leg whose pods hang is
never failed by it alone. Each leg pod carries its own deadline, which its kubelet
enforces (pkg/kubelet/active_deadline.go); the pod that dies of it is the event on which
the job's deadline fails the job, and a finished job recreates nothing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from resumequal.qualify.plan import qualification_plan
from resumequal.run.signing import new_key
from resumequal_operator import pytorchjob
from resumequal_operator.validation import parse_run_spec, qualification_spec
from testing.cluster.node.scriptnode import NodeRuntime
from testing.cluster.node.scriptrt import hold
from testing.cluster.podcluster import PodCluster
from testing.cluster.testapi import RealAPI
from testing.operator.harness import NAMESPACE, run_manifest

DEADLINE_S = 2


def _leg_job(name: str, key_secret: str) -> dict[str, object]:
    """The control leg's PyTorchJob as the operator builds it, deadlines shortened."""
    manifest = run_manifest(name, {"uri": "s3://bucket/runs"})
    spec = parse_run_spec(manifest["spec"])
    uri = f"s3://bucket/runs/{NAMESPACE}/{name}/uid-1"
    leg = qualification_plan(qualification_spec(spec, uri)).leg("control")
    job = pytorchjob.leg_job(name, NAMESPACE, "uid-1", spec, leg, uri, key_secret=key_secret)
    job["metadata"].pop("ownerReferences")
    job["spec"]["runPolicy"]["activeDeadlineSeconds"] = DEADLINE_S
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["activeDeadlineSeconds"] == pytorchjob.leg_deadline_seconds(leg)
    worker["activeDeadlineSeconds"] = DEADLINE_S
    return job


@pytest.fixture
def pods(pod_cluster: PodCluster) -> Iterator[PodCluster]:
    """The pod cluster, every container of the runs' image running until signalled."""
    pod_cluster.scripts.bind(lambda: NodeRuntime(hold))
    try:
        yield pod_cluster
    finally:
        pod_cluster.scripts.unbind()


def _pods(api: RealAPI, job: str) -> list[dict[str, Any]]:
    return api.list("pods", NAMESPACE, label_selector=f"training.kubeflow.org/job-name={job}")


def test_a_hung_leg_is_stopped_by_its_pod_deadlines_without_the_operator(
    api: RealAPI, pods: PodCluster
) -> None:
    # The containers hang (they run until a signal); no operator is running.
    # The run's checkpoint key, which the operator would have created with the legs.
    secret = pytorchjob.checkpoint_key_secret("hung", NAMESPACE, "uid-1", new_key())
    secret["metadata"].pop("ownerReferences")
    created = api.create("secrets", secret)
    job = _leg_job("hung", created["metadata"]["name"])
    name = job["metadata"]["name"]  # type: ignore[index]
    api.create("pytorchjobs", job)
    api.wait_for(lambda: len([p for p in _pods(api, name)
                              if p["status"].get("phase") == "Running"]) == 2,
                 60, "both pods running")
    started = {p["metadata"]["uid"] for p in _pods(api, name)}

    def failed() -> dict[str, object] | None:
        obj = api.get("pytorchjobs", NAMESPACE, name) or {}
        conds = [c for c in (obj.get("status") or {}).get("conditions", [])
                 if c["type"] == "Failed" and c["status"] == "True"]
        return conds[0] if conds else None

    condition = api.wait_for(failed, 60, "the job failed by its deadline")
    assert "active longer than specified deadline" in str(condition["message"])
    time.sleep(1)  # nothing may be recreated after the failure
    pods_now = _pods(api, name)
    assert {p["metadata"]["uid"] for p in pods_now} <= started
    for pod in pods_now:
        assert pod["status"]["phase"] == "Failed"
        assert pod["status"].get("reason") == "DeadlineExceeded"
