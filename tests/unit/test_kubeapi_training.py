"""The simulated training operator and Job controller, observed through the official client."""

from __future__ import annotations

import threading
import time
from typing import Any

import kubernetes.client as k8s
import pytest
from kubernetes.client.rest import ApiException

from tests.k8s_schemas import validate_core, validate_pytorchjob
from tests.kubeapi import KubeAPI
from tests.kubeapi.training import Container, SimulatedTrainingOperator

pytestmark = pytest.mark.timeout(30)

NS = "quals"
PTJ = ("kubeflow.org", "v1", NS, "pytorchjobs")


def pytorchjob(name: str, *, workers: int = 2, elastic: bool = True, master: bool = False,
               restart: str = "OnFailure", run_policy: dict[str, Any] | None = None,
               container: str = "pytorch") -> dict[str, Any]:
    template = {"metadata": {"labels": {"resumequal.dev/leg": "preempted"}},
                "spec": {"containers": [{"name": container, "image": "worker:1",
                                         "env": [{"name": "LEG", "value": "preempted"}]}]}}
    specs: dict[str, Any] = {"Worker": {"replicas": workers, "restartPolicy": restart,
                                        "template": template}}
    if master:
        specs["Master"] = {"replicas": 1, "restartPolicy": restart, "template": template}
    spec: dict[str, Any] = {"pytorchReplicaSpecs": specs, "runPolicy": run_policy or {}}
    if elastic:
        spec["elasticPolicy"] = {"rdzvBackend": "c10d", "minReplicas": workers,
                                 "maxReplicas": workers, "maxRestarts": 3}
        spec["nprocPerNode"] = "1"
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": NS}, "spec": spec}


def conditions(api: KubeAPI, name: str, kind: str = "pytorchjobs") -> list[tuple[str, str]]:
    job = api.get(kind, NS, name) or {}
    return [(c["type"], c["status"]) for c in (job.get("status") or {}).get("conditions", [])]


def last_condition(api: KubeAPI, name: str, kind: str = "pytorchjobs") -> str | None:
    conds = [c for c in conditions(api, name, kind) if c[1] == "True"]
    return conds[-1][0] if conds else None


def running_pods(api: KubeAPI, job: str) -> list[dict[str, Any]]:
    pods = api.list("pods", NS, label_selector=f"training.kubeflow.org/job-name={job}")
    return [p for p in pods if p["status"]["phase"] == "Running"]


class Attempts:
    """Records ``on_pods_running`` calls and lets a test wait for attempt N."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.changed = threading.Condition()

    def __call__(self, job: dict[str, Any], attempt: int) -> None:
        with self.changed:
            self.seen.append((job["metadata"]["name"], attempt))
            self.changed.notify_all()

    def wait(self, count: int, timeout: float = 5.0) -> list[tuple[str, int]]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.seen) >= count, timeout), self.seen
            return list(self.seen)


@pytest.fixture
def attempts(training_operator: SimulatedTrainingOperator) -> Attempts:
    recorder = Attempts()
    training_operator.on_pods_running = recorder
    return recorder


@pytest.fixture
def custom(kube_client: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(kube_client)


def test_pytorchjob_gets_labelled_owned_pods_with_elastic_env(
        kubeapi: KubeAPI, custom: k8s.CustomObjectsApi, attempts: Attempts,
        kube_client: k8s.ApiClient) -> None:
    job = custom.create_namespaced_custom_object(*PTJ, pytorchjob("leg"))
    assert attempts.wait(1) == [("leg", 0)]
    assert last_condition(kubeapi, "leg") == "Running"
    assert conditions(kubeapi, "leg") == [("Created", "True"), ("Running", "True")]
    status = custom.get_namespaced_custom_object_status(*PTJ, "leg")["status"]
    assert status["replicaStatuses"]["Worker"]["active"] == 2 and status["startTime"]
    pods = k8s.CoreV1Api(kube_client).list_namespaced_pod(
        NS, label_selector="training.kubeflow.org/replica-type=worker").items
    assert sorted(p.metadata.name for p in pods) == ["leg-worker-0", "leg-worker-1"]
    for p in pods:
        index = p.metadata.labels["training.kubeflow.org/replica-index"]
        assert p.metadata.name == f"leg-worker-{index}"
        assert p.metadata.labels["resumequal.dev/leg"] == "preempted"
        assert p.metadata.owner_references[0].uid == job["metadata"]["uid"]
        assert p.metadata.owner_references[0].controller is True
        env = {e.name: e.value for e in p.spec.containers[0].env}
        assert p.spec.containers[0].env[0].name == "LEG"  # the template's own env comes first
        assert env["PET_RDZV_ENDPOINT"] == "leg-worker-0:23456"
        assert env["PET_RDZV_BACKEND"] == "c10d"
        assert env["PET_NNODES"] == "2:2"
        assert env["PET_MAX_RESTARTS"] == "3"
        assert env["PET_NPROC_PER_NODE"] == "1"
        assert "MASTER_ADDR" not in env
        assert p.status.phase == "Running" and p.status.pod_ip
    assert kubeapi.get("services", NS, "leg-worker-0") is not None


def test_master_jobs_get_master_addr_world_size_and_rank(kubeapi: KubeAPI,
                                                        attempts: Attempts) -> None:
    kubeapi.create("pytorchjobs", pytorchjob("m", workers=2, elastic=False, master=True))
    attempts.wait(1)
    env = {p["metadata"]["name"]: {e["name"]: e["value"] for e in p["spec"]["containers"][0]["env"]}
           for p in kubeapi.list("pods", NS)}
    assert {n: e["RANK"] for n, e in env.items()} == {
        "m-master-0": "0", "m-worker-0": "1", "m-worker-1": "2"}
    assert {e["WORLD_SIZE"] for e in env.values()} == {"3"}
    assert {e["MASTER_ADDR"] for e in env.values()} == {"m-master-0"}
    master = kubeapi.get("pods", NS, "m-master-0")
    assert master is not None
    assert master["metadata"]["labels"]["training.kubeflow.org/job-role"] == "master"


def test_deleted_pod_restarts_the_group_then_the_job_succeeds(
        kubeapi: KubeAPI, custom: k8s.CustomObjectsApi, kube_client: k8s.ApiClient,
        training_operator: SimulatedTrainingOperator, attempts: Attempts) -> None:
    custom.create_namespaced_custom_object(*PTJ, pytorchjob("leg"))
    attempts.wait(1)
    core = k8s.CoreV1Api(kube_client)
    victim = core.read_namespaced_pod("leg-worker-1", NS)
    core.delete_namespaced_pod("leg-worker-1", NS, grace_period_seconds=0)
    kubeapi.wait_for(lambda: training_operator.attempt(NS, "leg") == 1, timeout=5)
    assert attempts.wait(2) == [("leg", 0), ("leg", 1)]
    reborn = core.read_namespaced_pod("leg-worker-1", NS)
    assert reborn.metadata.uid != victim.metadata.uid and reborn.status.phase == "Running"
    types = [c[0] for c in conditions(kubeapi, "leg")]
    assert types == ["Created", "Running"]  # Restarting was replaced by Running again
    history = [e.object for e in kubeapi.history("pytorchjobs")]
    assert any(c["type"] == "Restarting" for h in history
               for c in (h.get("status") or {}).get("conditions", []))
    deletion = kubeapi.deletions_of("pods")[0]
    assert (deletion.name, deletion.grace_period_seconds, deletion.cause) == (
        "leg-worker-1", 0, "api")
    training_operator.succeed(NS, "leg")
    assert conditions(kubeapi, "leg") == [("Created", "True"), ("Running", "False"),
                                          ("Succeeded", "True")]
    assert {p["status"]["phase"] for p in kubeapi.list("pods", NS)} == {"Succeeded"}
    status = (kubeapi.get("pytorchjobs", NS, "leg") or {})["status"]
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 2 and status["completionTime"]


@pytest.mark.parametrize(("run_policy", "restarts", "reason"), [
    ({"backoffLimit": 1}, 1, "BackoffLimitExceeded"),
    ({}, 3, "PyTorchJobFailed"),  # elasticPolicy.maxRestarts is 3
])
def test_restarts_beyond_the_limits_fail_the_job(
        kubeapi: KubeAPI, attempts: Attempts, run_policy: dict[str, Any], restarts: int,
        reason: str) -> None:
    kubeapi.create("pytorchjobs", pytorchjob("leg", run_policy=run_policy))
    for attempt in range(restarts + 1):
        attempts.wait(attempt + 1)
        kubeapi.delete("pods", NS, "leg-worker-0", grace_period_seconds=0)
    kubeapi.wait_for(lambda: last_condition(kubeapi, "leg") == "Failed", timeout=5)
    job = kubeapi.get("pytorchjobs", NS, "leg") or {}
    assert job["status"]["conditions"][-1]["reason"] == reason
    assert [n for _, n in attempts.seen] == list(range(restarts + 1))


@pytest.mark.parametrize(("restart", "exit_code", "outcome"), [
    ("Never", 1, "Failed"), ("ExitCode", 1, "Failed"), ("ExitCode", 137, "Running"),
    ("OnFailure", 1, "Running"),
])
def test_worker_failures_follow_the_restart_policy(
        kubeapi: KubeAPI, training_operator: SimulatedTrainingOperator, attempts: Attempts,
        restart: str, exit_code: int, outcome: str) -> None:
    kubeapi.create("pytorchjobs", pytorchjob("leg", restart=restart))
    attempts.wait(1)
    pod = kubeapi.get("pods", NS, "leg-worker-0") or {}
    assert pod["spec"]["restartPolicy"] == ("Never" if restart == "ExitCode" else restart)
    training_operator.fail(NS, "leg", "boom", exit_code=exit_code)
    if outcome == "Failed":
        kubeapi.wait_for(lambda: last_condition(kubeapi, "leg") == "Failed", timeout=5)
        job = kubeapi.get("pytorchjobs", NS, "leg") or {}
        assert job["status"]["conditions"][-1]["reason"] == "PyTorchJobFailed"
    else:
        assert attempts.wait(2)[-1] == ("leg", 1)
        assert last_condition(kubeapi, "leg") == "Running"


def test_active_deadline_fails_the_job_and_cleans_pods(
        kubeapi: KubeAPI, training_operator: SimulatedTrainingOperator) -> None:
    # startTime has whole seconds, so the deadline falls between 0 and 1 s after creation.
    kubeapi.create("pytorchjobs", pytorchjob(
        "slow", run_policy={"activeDeadlineSeconds": 1, "cleanPodPolicy": "All"}))
    kubeapi.wait_for(lambda: kubeapi.list("pods", NS), timeout=5)
    kubeapi.wait_for(lambda: last_condition(kubeapi, "slow") == "Failed", timeout=5)
    job = kubeapi.get("pytorchjobs", NS, "slow") or {}
    assert job["status"]["conditions"][-1]["reason"] == "DeadlineExceeded"
    assert kubeapi.list("pods", NS) == []
    assert {d.cause for d in kubeapi.deletions_of("pods")} == {"training-operator"}


def test_deleting_the_job_collects_its_pods_and_services(
        kubeapi: KubeAPI, custom: k8s.CustomObjectsApi, attempts: Attempts) -> None:
    custom.create_namespaced_custom_object(*PTJ, pytorchjob("leg"))
    attempts.wait(1)
    custom.delete_namespaced_custom_object(*PTJ, "leg", propagation_policy="Foreground")
    # Foreground: the job stays (deletionTimestamp) while its pods terminate, then goes.
    kubeapi.wait_for(lambda: kubeapi.get("pytorchjobs", NS, "leg") is None, timeout=5)
    assert kubeapi.list("pods", NS) == [] and kubeapi.list("services", NS) == []
    held = [e.object for e in kubeapi.history("pytorchjobs") if e.type == "MODIFIED"
            and e.object["metadata"].get("deletionTimestamp")]
    assert held and "foregroundDeletion" in held[0]["metadata"]["finalizers"]


def test_the_webhook_rejects_jobs_without_a_pytorch_container(
        custom: k8s.CustomObjectsApi, training_operator: SimulatedTrainingOperator) -> None:
    with pytest.raises(ApiException) as denied:
        custom.create_namespaced_custom_object(*PTJ, pytorchjob("leg", container="trainer"))
    assert denied.value.status == 422 and "container named pytorch" in denied.value.body


def test_containers_hold_until_killed_then_the_restarted_group_finishes(
        kubeapi: KubeAPI, kube_client: k8s.ApiClient) -> None:
    runs: list[Container] = []
    lock = threading.Lock()

    def container(c: Container) -> int | None:
        with lock:
            runs.append(c)
        if c.attempt == 0:
            c.killed.wait(10)  # held at the cut until the pod (or a peer) dies
            return 1
        return 0

    with SimulatedTrainingOperator(kubeapi, run_container=container):
        kubeapi.create("pytorchjobs", pytorchjob("leg", workers=3))
        kubeapi.wait_for(lambda: len(runs) == 3, timeout=5)
        assert sorted((c.replica_type, c.index, c.attempt) for c in runs) == [
            ("Worker", 0, 0), ("Worker", 1, 0), ("Worker", 2, 0)]
        assert runs[0].env["PET_NNODES"] == "3:3" and runs[0].env["LEG"] == "preempted"
        k8s.CoreV1Api(kube_client).delete_namespaced_pod("leg-worker-2", NS,
                                                         grace_period_seconds=0)
        kubeapi.wait_for(lambda: last_condition(kubeapi, "leg") == "Succeeded", timeout=5)
        assert all(c.killed.is_set() for c in runs[:3])  # the whole group was stopped
        assert sorted((c.index, c.attempt) for c in runs[3:]) == [(0, 1), (1, 1), (2, 1)]
        assert {p["status"]["phase"] for p in kubeapi.list("pods", NS)} == {"Succeeded"}
        job = kubeapi.get("pytorchjobs", NS, "leg") or {}
        assert job["status"]["replicaStatuses"]["Worker"]["succeeded"] == 3


def test_graceful_deletion_lets_the_container_stop_before_the_pod_goes(
        kubeapi: KubeAPI, kube_client: k8s.ApiClient) -> None:
    stopped: list[tuple[int, float]] = []

    def container(c: Container) -> int | None:
        if c.attempt == 1:
            return 0
        c.killed.wait(10)
        if c.index == 1:  # the SIGTERM handler takes a while, the other rank ignores it
            time.sleep(0.3)
        stopped.append((c.index, time.monotonic()))
        return 143

    core = k8s.CoreV1Api(kube_client)
    with SimulatedTrainingOperator(kubeapi, run_container=container):
        kubeapi.create("pytorchjobs", pytorchjob("leg"))
        kubeapi.wait_for(lambda: len(running_pods(kubeapi, "leg")) == 2, timeout=5)
        t0 = time.monotonic()
        terminating = core.delete_namespaced_pod("leg-worker-1", NS, grace_period_seconds=5)
        assert terminating.metadata.deletion_timestamp is not None
        assert terminating.metadata.deletion_grace_period_seconds == 5
        kubeapi.wait_for(lambda: last_condition(kubeapi, "leg") == "Succeeded", timeout=5)
    assert sorted(i for i, _ in stopped) == [0, 1]
    assert min(t for _, t in stopped) - t0 >= 0.3  # nobody was stopped before worker-1 exited
    pod_events = [(e.type, bool(e.object["metadata"].get("deletionTimestamp")))
                  for e in kubeapi.history("pods")
                  if e.object["metadata"]["name"] == "leg-worker-1"]
    assert ("MODIFIED", True) in pod_events
    assert pod_events.index(("MODIFIED", True)) < pod_events.index(("DELETED", True))


def test_a_pod_that_ignores_sigterm_goes_when_its_grace_period_ends(kubeapi: KubeAPI) -> None:
    release = threading.Event()

    def stubborn(c: Container) -> int | None:
        c.killed.wait(10)
        release.wait(10)  # ignores SIGTERM
        return None

    with SimulatedTrainingOperator(kubeapi, run_container=stubborn):
        kubeapi.create("pytorchjobs", pytorchjob("leg", workers=1))
        kubeapi.wait_for(lambda: len(running_pods(kubeapi, "leg")) == 1, timeout=5)
        t0 = time.monotonic()
        kubeapi.delete("pods", NS, "leg-worker-0", grace_period_seconds=2)
        assert (kubeapi.get("pods", NS, "leg-worker-0") or {})["metadata"]["deletionTimestamp"]
        kubeapi.wait_for(lambda: [e for e in kubeapi.history("pods") if e.type == "DELETED"],
                         timeout=5)
        assert 0.9 <= time.monotonic() - t0 < 4
        release.set()
    kubeapi.create("pods", {"metadata": {"name": "q", "namespace": NS}, "spec": {
        "containers": [{"name": "c", "image": "x"}]}})
    kubeapi.delete("pods", NS, "q", grace_period_seconds=30)
    assert kubeapi.get("pods", NS, "q") is None  # without a kubelet deletion is immediate


def test_a_container_exit_code_decides_a_batch_job(kubeapi: KubeAPI) -> None:
    def container(c: Container) -> int:
        return 0 if c.job["metadata"]["name"] == "good" else 3

    with SimulatedTrainingOperator(kubeapi, run_container=container):
        kubeapi.create("jobs", comparator("good", 0), namespace=NS)
        kubeapi.create("jobs", comparator("bad", 0), namespace=NS)
        kubeapi.wait_for(lambda: last_condition(kubeapi, "good", "jobs") == "Complete"
                         and last_condition(kubeapi, "bad", "jobs") == "Failed", timeout=5)
    bad = kubeapi.get("jobs", NS, "bad") or {}
    assert bad["status"]["failed"] == 1
    assert "lastProbeTime" in bad["status"]["conditions"][0]
    pods = {p["metadata"]["labels"]["job-name"]: p for p in kubeapi.list("pods", NS)}
    exit_code = pods["bad"]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
    assert exit_code == 3 and pods["good"]["status"]["phase"] == "Succeeded"


def test_pods_stay_pending_for_the_start_delay(kubeapi: KubeAPI) -> None:
    seen: list[int] = []
    operator = SimulatedTrainingOperator(kubeapi, start_delay=0.5,
                                         on_pods_running=lambda job, n: seen.append(n))
    with operator:
        kubeapi.create("pytorchjobs", pytorchjob("leg"))
        kubeapi.wait_for(lambda: last_condition(kubeapi, "leg") == "Created", timeout=5)
        pods = kubeapi.list("pods", NS)
        assert len(pods) == 2 and {p["status"]["phase"] for p in pods} == {"Pending"}
        kubeapi.wait_for(lambda: len(running_pods(kubeapi, "leg")) == 2, timeout=5)
        kubeapi.wait_for(lambda: seen == [0], timeout=5)


def test_callback_errors_surface_when_the_operator_stops(kubeapi: KubeAPI) -> None:
    def broken(job: dict[str, Any], attempt: int) -> None:
        raise ValueError("worker script bug")

    operator = SimulatedTrainingOperator(kubeapi, on_pods_running=broken).start()
    kubeapi.create("pytorchjobs", pytorchjob("leg"))
    kubeapi.wait_for(lambda: operator.errors, timeout=5)
    with pytest.raises(RuntimeError) as failed:
        operator.stop()
    assert isinstance(failed.value.__cause__, ValueError)


# ---------------------------------------------------------------------- batch/v1 Job


def comparator(name: str, backoff: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"backoffLimit": backoff, "template": {
        "metadata": {"labels": {"resumequal.dev/role": "comparator"}},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "compare", "image": "worker:1"}]}}}}


def test_batch_job_runs_a_pod_and_completes(kubeapi: KubeAPI, kube_client: k8s.ApiClient,
                                            training_operator: SimulatedTrainingOperator) -> None:
    running: list[str] = []
    training_operator.on_job_running = lambda job: running.append(job["metadata"]["name"])
    batch = k8s.BatchV1Api(kube_client)
    batch.create_namespaced_job(NS, comparator("cmp", 0))
    kubeapi.wait_for(lambda: running == ["cmp"], timeout=5)
    job = batch.read_namespaced_job_status("cmp", NS)
    assert job.status.active == 1 and job.status.start_time is not None
    pod = training_operator.pods(NS, "cmp")[0]
    assert pod["metadata"]["name"].startswith("cmp-")
    assert pod["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "cmp"
    assert pod["metadata"]["labels"]["resumequal.dev/role"] == "comparator"
    training_operator.succeed(NS, "cmp")
    job = batch.read_namespaced_job_status("cmp", NS)
    assert job.status.succeeded == 1 and job.status.active == 0
    assert [c.type for c in job.status.conditions] == ["SuccessCriteriaMet", "Complete"]
    assert job.status.completion_time is not None


def test_batch_job_retries_failed_pods_up_to_its_backoff_limit(
        kubeapi: KubeAPI, training_operator: SimulatedTrainingOperator) -> None:
    kubeapi.create("jobs", comparator("cmp", 1), namespace=NS)
    kubeapi.wait_for(lambda: running_count(kubeapi, "cmp") == 1, timeout=5)
    training_operator.fail(NS, "cmp", "exit 1")
    kubeapi.wait_for(lambda: running_count(kubeapi, "cmp") == 1
                     and len(kubeapi.list("pods", NS)) == 2, timeout=5)
    training_operator.fail(NS, "cmp", "exit 1 again")
    kubeapi.wait_for(lambda: last_condition(kubeapi, "cmp", "jobs") == "Failed", timeout=5)
    job = kubeapi.get("jobs", NS, "cmp") or {}
    assert job["status"]["failed"] == 2
    assert job["status"]["conditions"][-1]["reason"] == "BackoffLimitExceeded"


def running_count(api: KubeAPI, job: str) -> int:
    return sum(p["status"]["phase"] == "Running" for p in api.list(
        "pods", NS, label_selector=f"batch.kubernetes.io/job-name={job}"))


def test_everything_the_simulation_writes_passes_the_real_schemas(kubeapi: KubeAPI) -> None:
    validated: list[str] = []

    def schemas(obj: dict[str, Any]) -> None:
        if obj["kind"] == "PyTorchJob":
            validate_pytorchjob(obj)
        elif obj["kind"] in ("Pod", "Service", "Job"):
            validate_core(obj)
        validated.append(obj["kind"])

    def container(c: Container) -> int | None:
        if c.replica_type == "Job" or c.attempt == 1:
            return 0
        c.killed.wait(10)
        return None

    kubeapi.add_validator(schemas)
    with SimulatedTrainingOperator(kubeapi, run_container=container):
        kubeapi.create("pytorchjobs", pytorchjob("leg"))
        kubeapi.wait_for(lambda: len(running_pods(kubeapi, "leg")) == 2, timeout=5)
        kubeapi.delete("pods", NS, "leg-worker-1", grace_period_seconds=0)
        kubeapi.create("jobs", comparator("cmp", 0), namespace=NS)
        kubeapi.wait_for(lambda: last_condition(kubeapi, "leg") == "Succeeded"
                         and last_condition(kubeapi, "cmp", "jobs") == "Complete", timeout=10)
    assert {"PyTorchJob", "Pod", "Service", "Job"} <= set(validated)
