"""The simulated Kubeflow Trainer v2 (TrainJob → JobSet → Indexed Job → pods) with scripted
containers: each upstream rule the double reproduces (testing/kubeapi/trainer.py,
job_controller.py), observed through the emulator, on the runtime the chart installs."""

from __future__ import annotations

import time
from typing import Any

import pytest

from resumequal_operator.trainjob import leg_runtime
from testing.kubeapi import KubeAPI
from testing.kubeapi.errors import ApiError
from testing.kubeapi.job_controller import BACKOFF_S, TRACKING
from testing.kubeapi.scripted import Container
from testing.kubeapi.training import SimulatedTrainingOperator
from tests.emulator.test_training import Script, simulate, until_signal
from tests.k8s_schemas import validate_core, validate_trainer

pytestmark = pytest.mark.timeout(60)

NS = "quals"
Obj = dict[str, Any]
INDEX = "batch.kubernetes.io/job-completion-index"


def trainjob(name: str, *, nodes: int = 2, env: dict[str, str] | None = None,
             deadline: int | None = None) -> Obj:
    spec: Obj = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                       "name": "resumequal-leg"},
        "trainer": {"image": "worker:1", "command": ["resumequal", "launch"], "args": ["x"],
                    "numNodes": nodes, "numProcPerNode": 1,
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()]},
        "runtimePatches": [{"manager": "resumequal.dev/operator", "trainingRuntimeSpec": {
            "template": {"spec": {"replicatedJobs": [{"name": "node", "template": {
                "spec": {"template": {
                    "metadata": {"labels": {"resumequal.dev/leg": "preempted"}},
                    "spec": {"terminationGracePeriodSeconds": 3,
                             "containers": [{"name": "node", "volumeMounts": [
                                 {"name": "dshm", "mountPath": "/dev/shm"}]}],
                             "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]},
                }}}}]}}}}],
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def started(api: KubeAPI, behaviour: Any) -> tuple[SimulatedTrainingOperator, Script]:
    api.register_trainer_crds()
    api.create("clustertrainingruntimes", leg_runtime())
    return simulate(api, behaviour)


def condition(api: KubeAPI, kind: str, name: str, ctype: str) -> Obj | None:
    obj = api.get(kind, NS, name) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or []
                 if c["type"] == ctype and c["status"] == "True"), None)


def node_pods(api: KubeAPI, tj: str, *, running: bool = False) -> dict[int, Obj]:
    pods = [p for p in api.list("pods", NS)
            if p["metadata"]["labels"].get("jobset.sigs.k8s.io/jobset-name") == tj
            and not p["metadata"].get("deletionTimestamp")
            and (not running or p["status"].get("phase") == "Running")]
    return {int(p["metadata"]["annotations"][INDEX]): p for p in pods}


def test_a_trainjob_becomes_one_jobset_one_indexed_job_and_a_pod_per_node(
        kubeapi: KubeAPI) -> None:
    sim, script = started(kubeapi, until_signal(143))
    with sim:
        kubeapi.create("trainjobs", trainjob("leg", env={"PET_RDZV_BACKEND": "c10d"}))
        pods = kubeapi.wait_for(lambda: (p := node_pods(kubeapi, "leg", running=True))
                                and len(p) == 2 and p, 10, "two running node pods")
        js = kubeapi.get("jobsets", NS, "leg") or {}
        job = kubeapi.get("jobs", NS, "leg-node-0") or {}
    # The JobSet: the TrainJob's name, owned by it, labels from the runtime and patches only.
    assert js["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    assert js["metadata"]["ownerReferences"][0]["controller"] is True
    validate_trainer(js)
    # One Indexed Job, a completion per node, the runtime's policies kept.
    assert job["metadata"]["ownerReferences"][0]["kind"] == "JobSet"
    spec = job["spec"]
    assert (spec["completionMode"], spec["parallelism"], spec["completions"]) == ("Indexed", 2, 2)
    assert spec["backoffLimit"] == 10 and spec["podFailurePolicy"]["rules"][0]["action"] == \
        "FailJob"
    validate_core(job)
    for index, pod in pods.items():
        meta = pod["metadata"]
        assert meta["name"].startswith(f"leg-node-0-{index}-")
        assert meta["labels"][INDEX] == meta["annotations"][INDEX] == str(index)
        assert meta["labels"]["resumequal.dev/leg"] == "preempted"  # from the runtime patch
        assert pod["spec"]["hostname"] == f"leg-node-0-{index}"
        assert pod["spec"]["subdomain"] == "leg"
        assert TRACKING in meta["finalizers"]
        validate_core(pod)
    env = {c.index: c.env for c in script.started}
    assert env[1]["PET_NODE_RANK"] == env[1]["JOB_COMPLETION_INDEX"] == "1"
    assert env[0]["PET_NODE_RANK"] == "0"
    assert env[1]["PET_MASTER_ADDR"] == "leg-node-0-0.leg" and env[1]["PET_MASTER_PORT"] == "29500"
    assert env[1]["PET_NNODES"] == "2" and env[1]["PET_NPROC_PER_NODE"] == "1"
    assert env[1]["PET_RDZV_BACKEND"] == "c10d"  # a trainer env var passes through
    assert script.started[0].command == ["resumequal", "launch", "x"]


def test_a_deleted_pod_is_counted_and_replaced_under_a_new_name_after_the_backoff(
        kubeapi: KubeAPI) -> None:
    sim, script = started(kubeapi, until_signal(137))
    with sim:
        kubeapi.create("trainjobs", trainjob("leg"))
        pods = kubeapi.wait_for(lambda: (p := node_pods(kubeapi, "leg", running=True))
                                and len(p) == 2 and p, 10, "two running node pods")
        victim = pods[1]["metadata"]
        t0 = time.monotonic()
        kubeapi.delete("pods", NS, victim["name"], grace_period_seconds=0)
        # Held by the Job's tracking finalizer until its exit is counted, unlike a
        # PyTorchJob pod deleted with grace 0.
        held = kubeapi.get("pods", NS, victim["name"]) or {}
        assert held["metadata"]["deletionTimestamp"]
        kubeapi.wait_for(lambda: kubeapi.get("pods", NS, victim["name"]) is None, 10,
                         "the victim to be counted and released")
        job = kubeapi.get("jobs", NS, "leg-node-0") or {}
        assert job["status"]["failed"] == 1
        new = kubeapi.wait_for(lambda: node_pods(kubeapi, "leg", running=True).get(1), 30,
                               "a replacement for index 1")
        waited = time.monotonic() - t0
        assert new["metadata"]["name"] != victim["name"]
        assert new["metadata"]["name"].startswith("leg-node-0-1-")
        assert new["spec"]["hostname"] == "leg-node-0-1"
        # podReplacementPolicy Failed (a podFailurePolicy forces it): not before the old
        # pod failed, and the pod failure backoff on top.
        assert waited >= BACKOFF_S - 0.5
        # One deletion stays under the backoffLimit: nothing above the Job notices.
        assert condition(kubeapi, "trainjobs", "leg", "Failed") is None
        assert condition(kubeapi, "jobsets", "leg", "Failed") is None
        assert [c.killed.is_set() for c in script.of(pods[0]["metadata"]["name"])] == [False]


def test_an_exit_1_fails_the_job_by_its_policy_and_the_trainjob_with_it(
        kubeapi: KubeAPI) -> None:
    def script(c: Container) -> int | None:
        if c.index == 1:
            time.sleep(0.3)
            return 1  # the leg's own failure (a checkpoint that does not verify)
        c.killed.wait()
        return 137

    sim, scripted = started(kubeapi, script)
    with sim:
        kubeapi.create("trainjobs", trainjob("leg"))
        failed = kubeapi.wait_for(lambda: condition(kubeapi, "trainjobs", "leg", "Failed"), 20,
                                  "the TrainJob to fail")
        job = kubeapi.get("jobs", NS, "leg-node-0") or {}
        kubeapi.wait_for(lambda: not node_pods(kubeapi, "leg", running=True), 10,
                         "the other pod stopped")
    types = [(c["type"], c["reason"]) for c in job["status"]["conditions"]]
    assert types == [("FailureTarget", "PodFailurePolicy"), ("Failed", "PodFailurePolicy")]
    assert "failed with exit code 1 matching FailJob rule at index 0" in \
        job["status"]["conditions"][0]["message"]
    js_failed = condition(kubeapi, "jobsets", "leg", "Failed") or {}
    assert js_failed["reason"] == "FailedJobs"
    assert js_failed["message"] == ("jobset failed due to one or more job failures (first "
                                    "failed job: leg-node-0)")
    # The TrainJob copies the JobSet's condition as it is.
    assert (failed["reason"], failed["message"]) == (js_failed["reason"], js_failed["message"])
    node0 = [c for c in scripted.started if c.index == 0]
    assert node0 and node0[0].killed.is_set()


def test_every_node_succeeding_completes_the_job_the_jobset_and_the_trainjob(
        kubeapi: KubeAPI) -> None:
    sim, _ = started(kubeapi, lambda c: 0)
    with sim:
        kubeapi.create("trainjobs", trainjob("leg", nodes=3))
        done = kubeapi.wait_for(lambda: condition(kubeapi, "trainjobs", "leg", "Complete"), 20,
                                "the TrainJob to complete")
    job = (kubeapi.get("jobs", NS, "leg-node-0") or {})["status"]
    assert [c["type"] for c in job["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert job["completedIndexes"] == "0-2" and job["succeeded"] == 3
    assert (done["reason"], done["message"]) == ("AllJobsCompleted",
                                                 "jobset completed successfully")
    tj = (kubeapi.get("trainjobs", NS, "leg") or {})["status"]
    assert tj["jobsStatus"] == [{"name": "node", "ready": 1, "succeeded": 1, "failed": 0,
                                 "active": 0, "suspended": 0}]
    # Counted pods let go of their finalizer.
    assert not any(TRACKING in (p["metadata"].get("finalizers") or [])
                   for p in kubeapi.list("pods", NS))


def test_the_trainjob_deadline_is_a_timer_that_fails_it_and_deletes_its_jobset(
        kubeapi: KubeAPI) -> None:
    sim, _ = started(kubeapi, until_signal(137))
    with sim:
        kubeapi.create("trainjobs", trainjob("leg", deadline=2))
        kubeapi.wait_for(lambda: len(node_pods(kubeapi, "leg", running=True)) == 2, 10)
        failed = kubeapi.wait_for(lambda: condition(kubeapi, "trainjobs", "leg", "Failed"), 10,
                                  "the deadline")
        kubeapi.wait_for(lambda: kubeapi.get("jobsets", NS, "leg") is None, 10,
                         "the JobSet deleted")
        kubeapi.wait_for(lambda: not kubeapi.list("pods", NS), 15, "its pods gone")
    assert (failed["reason"], failed["message"]) == ("DeadlineExceeded",
                                                     "TrainJob exceeded its active deadline")


def test_the_webhooks_refuse_what_upstream_refuses(kubeapi: KubeAPI) -> None:
    sim, _ = started(kubeapi, lambda c: 0)
    with sim:
        reserved = trainjob("reserved", env={"PET_NNODES": "4"})
        with pytest.raises(ApiError, match="must not have reserved envs"):
            kubeapi.create("trainjobs", reserved)
        unknown = trainjob("unknown")
        unknown["spec"]["trainer"]["elasticPolicy"] = {"minNodes": 1}
        with pytest.raises(ApiError, match=r"unknown field\(s\) spec.trainer.elasticPolicy"):
            kubeapi.create("trainjobs", unknown)
        runtime = leg_runtime("two")
        runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 2
        with pytest.raises(ApiError, match="always must be 1"):
            kubeapi.create("clustertrainingruntimes", runtime)
        runtime = leg_runtime("nameless")
        job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
        job["spec"]["template"]["spec"]["containers"][0]["name"] = "trainer"
        with pytest.raises(ApiError, match="must have container with name - node"):
            kubeapi.create("clustertrainingruntimes", runtime)
    validate_trainer(leg_runtime())
