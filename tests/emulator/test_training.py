"""The simulated training operator, Job controller and kubelet, with scripted containers:
each upstream rule they reproduce, observed through the emulator."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from typing import Any

import kubernetes.client as k8s
import pytest

from testing.kubeapi import KubeAPI
from testing.kubeapi.job_controller import BACKOFF_S
from testing.kubeapi.objects import parse_rfc3339
from testing.kubeapi.scripted import Container
from testing.kubeapi.training import SimulatedTrainingOperator
from tests.k8s_schemas import validate_core, validate_pytorchjob
from tests.waiting import eventually

pytestmark = pytest.mark.timeout(30)

NS = "quals"
Obj = dict[str, Any]


def pytorchjob(name: str, *, workers: int = 2, restart: str = "ExitCode",
               run_policy: Obj | None = None, elastic: Obj | None = None,
               template_restart: str | None = None, container: str = "pytorch",
               env: Obj | None = None) -> Obj:
    pod: Obj = {"containers": [{"name": container, "image": "worker:1",
                                "env": [{"name": "LEG", "value": "preempted"}, *(
                                    {"name": k, "value": v} for k, v in (env or {}).items())],
                                "ports": [{"name": "pytorchjob-port", "containerPort": 29400}]}],
                "terminationGracePeriodSeconds": 5}
    if template_restart:
        pod["restartPolicy"] = template_restart
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": NS}, "spec": {
                "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": workers,
                                  "maxReplicas": workers, "maxRestarts": 3, **(elastic or {})},
                "nprocPerNode": "1",
                "runPolicy": {"cleanPodPolicy": "Running", **(run_policy or {})},
                "pytorchReplicaSpecs": {"Worker": {
                    "replicas": workers, "restartPolicy": restart,
                    "template": {"metadata": {"labels": {"resumequal.dev/leg": "preempted"}},
                                 "spec": pod}}}}}


def conditions(api: KubeAPI, name: str, kind: str = "pytorchjobs") -> list[tuple[str, str]]:
    job = api.get(kind, NS, name) or {}
    return [(c["type"], c["status"]) for c in (job.get("status") or {}).get("conditions", [])]


def last(api: KubeAPI, name: str, kind: str = "pytorchjobs") -> Obj:
    conds = [c for c in ((api.get(kind, NS, name) or {}).get("status") or {}).get(
        "conditions", []) if c["status"] == "True"]
    return conds[-1] if conds else {}


def ever(api: KubeAPI, ctype: str, kind: str = "pytorchjobs") -> bool:
    return any(c["type"] == ctype and c["status"] == "True" for e in api.history(kind)
               for c in (e.object.get("status") or {}).get("conditions", []))


def phase(api: KubeAPI, pod: str) -> str | None:
    obj = api.get("pods", NS, pod)
    return None if obj is None else str(obj["status"]["phase"])


def running(api: KubeAPI, *pods: str) -> bool:
    return all(phase(api, p) == "Running" for p in pods)


class Script:
    """Scripted containers: each calls ``behaviour(container)``; records every start."""

    def __init__(self, behaviour: Callable[[Container], int | None]) -> None:
        self.behaviour = behaviour
        self.started: list[Container] = []
        self.lock = threading.Lock()

    def __call__(self, c: Container) -> int | None:
        with self.lock:
            self.started.append(c)
        return self.behaviour(c)

    def of(self, pod: str) -> list[Container]:
        with self.lock:
            return [c for c in self.started if c.pod_name == pod]


def until_signal(code: int) -> Callable[[Container], int | None]:
    """A process that runs until SIGTERM, then exits ``code`` (143: a launcher; 1: torchrun)."""
    def run(c: Container) -> int:
        c.killed.wait()
        return code
    return run


def elastic_group(c: Container) -> int | None:
    """torchrun with workers that run until the group changes, then rendezvous again."""
    while (group := c.rendezvous(10)) is not None:
        while not (group.changed.is_set() or c.killed.is_set()):
            time.sleep(0.01)
        if c.killed.is_set():
            return 143
    return 143 if c.killed.is_set() else 1


def simulate(api: KubeAPI, behaviour: Callable[[Container], int | None]
             ) -> tuple[SimulatedTrainingOperator, Script]:
    script = Script(behaviour)
    return SimulatedTrainingOperator(api, run_container=script), script


# ---------------------------------------------------------------------- pods the operator makes


def test_pods_env_labels_and_the_template_restart_policy_warning(
        kubeapi: KubeAPI, kube_client: k8s.ApiClient) -> None:
    sim, _ = simulate(kubeapi, until_signal(143))
    body = pytorchjob("leg", template_restart="OnFailure", elastic={
        "rdzvId": "leg-id", "nProcPerNode": 2, "standalone": True,
        "rdzvConf": [{"key": "join_timeout", "value": "60"}, {"key": "read_timeout",
                                                              "value": "30"}]})
    with sim:
        job = k8s.CustomObjectsApi(kube_client).create_namespaced_custom_object(
            "kubeflow.org", "v1", NS, "pytorchjobs", body)
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"))
    # The deprecated field is still served, with a warning (pytorchjob_webhook.go).
    assert sim.warnings == ["spec.elasticPolicy.nProcPerNode is deprecated, use "
                            "spec.nprocPerNode instead"]
    pods = {p["metadata"]["name"]: p for p in kubeapi.list("pods", NS)}
    for index in (0, 1):
        pod = pods[f"leg-worker-{index}"]
        labels = pod["metadata"]["labels"]
        assert labels["training.kubeflow.org/replica-index"] == str(index)
        assert labels["resumequal.dev/leg"] == "preempted"
        assert (labels.get("training.kubeflow.org/job-role") == "master") == (index == 0)
        assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
        assert pod["spec"]["restartPolicy"] == "Never"  # ExitCode replicas: Never pods
        env = [(e["name"], e.get("value")) for e in pod["spec"]["containers"][0]["env"]]
        assert env == [("LEG", "preempted"), ("PYTHONUNBUFFERED", "1"),
                       ("PET_NPROC_PER_NODE", "1"), ("PET_RDZV_ENDPOINT", "leg-worker-0:29400"),
                       ("PET_RDZV_BACKEND", "c10d"), ("PET_NNODES", "2:2"),
                       ("PET_MAX_RESTARTS", "3"), ("PET_NPROC_PER_NODE", "2"),
                       ("PET_RDZV_ID", "leg-id"),
                       ("PET_RDZV_CONF", "join_timeout=60,read_timeout=30"),
                       ("PET_STANDALONE", "")]
    warnings = [(e["type"], e["reason"], e["message"]) for e in kubeapi.list("events", NS)]
    assert ("Warning", "SettedPodTemplateRestartPolicy", "Restart policy in pod template will "
            "be overwritten by restart policy in replica spec") in warnings


def test_the_webhook_and_what_is_not_simulated(kubeapi: KubeAPI) -> None:
    sim, _ = simulate(kubeapi, until_signal(143))
    sim.start()
    with pytest.raises(Exception, match="no container named pytorch"):
        kubeapi.create("pytorchjobs", pytorchjob("bad", container="trainer"))
    job = pytorchjob("m")
    job["spec"]["pytorchReplicaSpecs"]["Master"] = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = 1
    kubeapi.create("pytorchjobs", job)
    kubeapi.wait_for(lambda: sim.errors, 5)
    with pytest.raises(RuntimeError) as failed:
        sim.stop()
    assert isinstance(failed.value.__cause__, NotImplementedError)


def test_everything_the_simulation_writes_passes_the_real_schemas(kubeapi: KubeAPI) -> None:
    kinds: list[str] = []

    def schemas(obj: Obj) -> None:
        if obj["kind"] == "PyTorchJob":
            validate_pytorchjob(obj)
        elif obj["kind"] in ("Pod", "Job", "Event"):
            validate_core(obj)
        kinds.append(obj["kind"])

    kubeapi.add_validator(schemas)
    sim, _ = simulate(kubeapi, lambda c: 0 if c.index == 0 or "Job" in c.pod_name else None)
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg"))
        kubeapi.create("jobs", comparator("cmp"), namespace=NS)
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Succeeded", 10)
    assert {"PyTorchJob", "Pod", "Event", "Job"} <= set(kinds)


# ---------------------------------------------------------------------- kubelet: deletion


def test_grace_0_removes_the_pod_at_once_and_sigkill_comes_after_2_s(kubeapi: KubeAPI) -> None:
    signalled: list[float] = []

    def stubborn(c: Container) -> int | None:
        if c.pod_name != "leg-worker-1" or len(script.of("leg-worker-1")) > 1:
            return None
        c.killed.wait()
        signalled.append(time.monotonic())
        time.sleep(3.5)  # ignores SIGTERM: only SIGKILL ends it (exit 137)
        return 0

    sim, script = simulate(kubeapi, stubborn)
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg"))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"))
        old = (kubeapi.get("pods", NS, "leg-worker-1") or {})["metadata"]["uid"]
        t0 = time.monotonic()
        kubeapi.delete("pods", NS, "leg-worker-1", grace_period_seconds=0)
        assert kubeapi.get("pods", NS, "leg-worker-1") is None  # gone from the API at once
        # The same name again, at once, while the old container is still being stopped.
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-1"), 5)
        assert (kubeapi.get("pods", NS, "leg-worker-1") or {})["metadata"]["uid"] != old
        old_handle = script.of("leg-worker-1")[0]
        kubeapi.wait_for(lambda: old_handle.killed.is_set(), 5)
        eventually(lambda: sim.kubelet._pods.get(old) is None, 30, "the old pod to be gone",
                   interval=0.05)
        killed_at = time.monotonic()
        # SIGTERM first, even with grace 0; SIGKILL only after the 2 s minimum. (Bounds
        # from below and by order only: a loaded machine makes everything later.)
        assert signalled and signalled[0] < killed_at
        assert killed_at - t0 >= 1.9
        # The exit code was never recorded (no object left), so the job does not notice.
        assert not ever(kubeapi, "Restarting") and not ever(kubeapi, "Failed")


def test_graceful_deletion_counts_as_failed_then_records_the_exit_before_removal(
        kubeapi: KubeAPI, kube_client: k8s.ApiClient) -> None:
    release = threading.Event()

    def slow_stop(c: Container) -> int:
        c.killed.wait()
        if c.index == 1 and len(script.of("leg-worker-1")) == 1:
            release.wait(5)  # a SIGTERM handler writing its emergency checkpoint
        return 143

    sim, script = simulate(kubeapi, slow_stop)
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg"))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"))
        victim = k8s.CoreV1Api(kube_client).delete_namespaced_pod(
            "leg-worker-1", NS, grace_period_seconds=5)
        assert victim.metadata.deletion_timestamp and victim.status.phase == "Running"
        # A Running pod with a deletionTimestamp counts as failed: Restarting at once.
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Restarting", 5)
        status = (kubeapi.get("pytorchjobs", NS, "leg") or {})["status"]
        assert status["replicaStatuses"]["Worker"]["failed"] == 1
        assert last(kubeapi, "leg")["message"] == \
            "PyTorchJob leg is restarting because 1 Worker replica(s) failed."
        assert [c.killed.is_set() for c in script.of("leg-worker-0")] == [False]
        release.set()
        kubeapi.wait_for(lambda: len(script.of("leg-worker-1")) == 2
                         and running(kubeapi, "leg-worker-1"), 5)
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Running", 5)
    events = [(e.type, e.object["metadata"]["uid"] == victim.metadata.uid,
               e.object["status"].get("phase"))
              for e in kubeapi.history("pods") if e.object["metadata"]["name"] == "leg-worker-1"]
    gone = events.index(("DELETED", True, "Failed"))
    assert events[gone - 1] == ("MODIFIED", True, "Failed")  # phase and code, then removal
    assert events[gone + 1] == ("ADDED", False, "Pending")  # the same name, once it is gone
    ended = next(e.old for e in kubeapi.history("pods") if e.type == "DELETED")
    assert ended is not None
    assert ended["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    assert [d.cause for d in kubeapi.deletions_of("pods")] == ["api", "training-operator"]


@pytest.mark.parametrize(("exit_code", "outcome"), [(1, "Failed"), (143, "Running"),
                                                     (137, "Running")])
def test_exit_codes_under_the_exit_code_policy(kubeapi: KubeAPI, exit_code: int,
                                               outcome: str) -> None:
    sim, script = simulate(kubeapi, until_signal(exit_code))
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg"))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"))
        kubeapi.delete("pods", NS, "leg-worker-1", grace_period_seconds=3)
        if outcome == "Failed":
            kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Failed", 5)
            cond = last(kubeapi, "leg")
            assert cond["reason"] == "PyTorchJobFailed"
            assert cond["message"] == 'job "leg" is failing because "Worker" replica(s) failed.'
            # cleanPodPolicy Running: the surviving worker-0 is stopped too.
            kubeapi.wait_for(lambda: phase(kubeapi, "leg-worker-0") is None, 5)
            assert script.of("leg-worker-0")[0].killed.is_set()
            assert len(script.started) == 2  # nothing recreated
        else:
            kubeapi.wait_for(lambda: len(script.of("leg-worker-1")) == 2
                             and running(kubeapi, "leg-worker-1"), 5)
            kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Running", 5)
            assert not script.of("leg-worker-0")[0].killed.is_set()  # survivors untouched
            assert ever(kubeapi, "Restarting")
    reasons = {e["reason"]: e["message"] for e in kubeapi.list("events", NS)}
    assert reasons["ExitedWithCode"] == f"Pod: {NS}.leg-worker-1 exited with code {exit_code}"


def test_clean_pod_policy_none_leaves_the_survivors(kubeapi: KubeAPI) -> None:
    sim, _ = simulate(kubeapi, until_signal(1))
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg", run_policy={"cleanPodPolicy": "None"}))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"))
        kubeapi.delete("pods", NS, "leg-worker-1", grace_period_seconds=3)
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Failed", 5)
        time.sleep(0.3)
        assert running(kubeapi, "leg-worker-0")
    assert [d.name for d in kubeapi.deletions_of("pods")] == ["leg-worker-1"]


# ---------------------------------------------------------------------- replicas changed


def test_lowered_replicas_delete_the_highest_index_and_raised_ones_recreate_it(
        kubeapi: KubeAPI) -> None:
    # An elastic resize: ReconcilePods (common/pod.go) deletes the out-of-range pods and
    # creates the missing indices under their names; PET_NNODES is min:max (elastic.go).
    sim, script = simulate(kubeapi, until_signal(143))
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg", elastic={"minReplicas": 1}))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"))
        first = (kubeapi.get("pods", NS, "leg-worker-1") or {})["metadata"]["uid"]
        resize = {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}}
        kubeapi.patch("pytorchjobs", NS, "leg", resize)
        kubeapi.wait_for(lambda: phase(kubeapi, "leg-worker-1") is None, 8)
        assert script.of("leg-worker-1")[0].killed.is_set()
        time.sleep(0.3)  # not recreated while out of range; the survivor untouched
        assert phase(kubeapi, "leg-worker-1") is None and running(kubeapi, "leg-worker-0")
        assert not script.of("leg-worker-0")[0].killed.is_set()
        resize["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 2
        kubeapi.patch("pytorchjobs", NS, "leg", resize)
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-1"))
        grown = kubeapi.get("pods", NS, "leg-worker-1") or {}
        assert grown["metadata"]["uid"] != first and len(script.of("leg-worker-1")) == 2
        assert not ever(kubeapi, "Failed")
    scaled = next(d for d in kubeapi.deletions_of("pods") if d.name == "leg-worker-1")
    assert (scaled.cause, scaled.grace_period_seconds) == ("training-operator", None)
    env = {e["name"]: e.get("value") for e in grown["spec"]["containers"][0]["env"]}
    assert env["PET_NNODES"] == "1:2"


# ---------------------------------------------------------------------- elastic success


def test_an_elastic_job_succeeds_with_its_first_worker_and_cleans_the_rest(
        kubeapi: KubeAPI) -> None:
    done = threading.Event()

    def workers(c: Container) -> int:
        if c.index == 0:
            done.wait(5)
            return 0
        c.killed.wait()  # still flushing its last checkpoint
        return 143

    sim, script = simulate(kubeapi, workers)
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg"))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"))
        done.set()
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Succeeded", 5)
        assert last(kubeapi, "leg")["message"] == f"PyTorchJob {NS}/leg successfully completed."
        kubeapi.wait_for(lambda: phase(kubeapi, "leg-worker-1") is None, 8)
        assert script.of("leg-worker-1")[0].killed.is_set()
        time.sleep(0.2)
    cleanup = [d for d in kubeapi.deletions_of("pods") if d.name == "leg-worker-1"]
    assert cleanup and cleanup[0].cause == "training-operator"
    assert cleanup[0].grace_period_seconds is None  # the pod's own grace (5 s here)
    counts = [(e.object.get("status") or {}).get("replicaStatuses", {}).get("Worker", {})
              for e in kubeapi.history("pytorchjobs")]
    assert {"active": 1, "succeeded": 1} in [
        {k: v for k, v in c.items() if k != "selector"} for c in counts]
    # Once finished, the still active ones are counted as succeeded (common/job.go).
    assert counts[-1]["succeeded"] == 2 and "active" not in counts[-1]
    assert phase(kubeapi, "leg-worker-0") == "Succeeded"


# ---------------------------------------------------------------------- run policy


def test_the_active_deadline_is_checked_only_when_an_event_arrives(kubeapi: KubeAPI) -> None:
    sim, _ = simulate(kubeapi, until_signal(143))
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg", run_policy={"activeDeadlineSeconds": 1}))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"))
        time.sleep(2.2)
        assert last(kubeapi, "leg")["type"] == "Running"  # nothing happened: no check
        kubeapi.patch("pytorchjobs", NS, "leg", {"metadata": {"labels": {"poke": "1"}}})
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Failed", 5)
        assert last(kubeapi, "leg")["message"] == \
            "Job leg has failed because it was active longer than specified deadline"
        kubeapi.wait_for(lambda: not kubeapi.list("pods", NS), 10)


@pytest.mark.parametrize(("limit", "fails"), [(0, True), (1, False)])
def test_backoff_limit_with_exit_code_fails_only_at_0(kubeapi: KubeAPI, limit: int,
                                                       fails: bool) -> None:
    crash = threading.Event()

    def oom_killed(c: Container) -> int | None:
        while not (c.killed.is_set() or (crash.is_set() and c.index == 1)):
            time.sleep(0.01)
        crash.clear()
        return 137

    sim, script = simulate(kubeapi, oom_killed)
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg", run_policy={"backoffLimit": limit}))
        for attempt in range(1 if fails else 3):
            kubeapi.wait_for(lambda n=attempt: len(script.of("leg-worker-1")) == n + 1
                             and running(kubeapi, "leg-worker-0", "leg-worker-1"), 5)
            crash.set()
        if fails:  # FakeWorkQueue.NumRequeues is 0: 0 + 1 > backoffLimit only for 0
            kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Failed", 5)
            assert last(kubeapi, "leg")["message"] == \
                "Job leg has failed because it has reached the specified backoff limit"
        else:
            kubeapi.wait_for(lambda: len(script.of("leg-worker-1")) == 4
                             and last(kubeapi, "leg").get("type") == "Running", 5)
            assert not ever(kubeapi, "Failed")


# ---------------------------------------------------------------------- scripted torchrun


@pytest.mark.parametrize("shared_store", [False, True])
def test_the_scripted_agents_restart_the_group_when_a_pod_is_replaced(
        kubeapi: KubeAPI, shared_store: bool) -> None:
    rounds: list[tuple[str, int, int, int]] = []

    def agent(c: Container) -> int | None:
        while (group := c.rendezvous(10)) is not None:
            rounds.append((c.pod_name, group.number, group.rank, group.restart_count))
            while not (group.changed.is_set() or c.killed.is_set()):
                time.sleep(0.01)
            if c.killed.is_set():
                return 143
        return 143 if c.killed.is_set() else 1

    env = {} if shared_store else {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    sim, _ = simulate(kubeapi, agent)
    with sim:
        kubeapi.create("pytorchjobs", pytorchjob("leg", env=env, elastic={
            "rdzvConf": [{"key": "read_timeout", "value": "1"}]}))
        kubeapi.wait_for(lambda: len(rounds) == 2)
        assert sorted(rounds) == [("leg-worker-0", 0, 0, 0), ("leg-worker-1", 0, 1, 0)]
        kubeapi.delete("pods", NS, "leg-worker-1", grace_period_seconds=0)
        if shared_store:
            # torch 2.13: the new agent waits for a MASTER_ADDR the surviving rank 0 never
            # writes; both give up after read_timeout and exit 1, which fails the job.
            kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Failed", 5)
            assert len(rounds) == 2
            return
        kubeapi.wait_for(lambda: len(rounds) == 4, 5)
        # worker-0's agent restarted its workers (a failure: counted); the new pod's agent
        # starts from 0.
        assert sorted(rounds[2:]) == [("leg-worker-0", 1, 0, 1), ("leg-worker-1", 1, 1, 0)]
        kubeapi.delete("pods", NS, "leg-worker-0", grace_period_seconds=0)
        # The store lived in worker-0's agent: worker-1's agent gives up and exits 1, which
        # fails the job; the new worker-0 is never joined.
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Failed", 5)


# ---------------------------------------------------------------------- kubelet: pods


def test_the_pod_deadline_stops_the_container_and_fails_the_pod(kubeapi: KubeAPI) -> None:
    sim, script = simulate(kubeapi, until_signal(143))
    with sim:
        job = comparator("cmp")
        job["spec"]["template"]["spec"]["activeDeadlineSeconds"] = 1
        kubeapi.create("jobs", job, namespace=NS)
        kubeapi.wait_for(lambda: last(kubeapi, "cmp", "jobs").get("type") == "Failed", 8)
    pod = kubeapi.list("pods", NS)[0]
    assert (pod["status"]["phase"], pod["status"]["reason"]) == ("Failed", "DeadlineExceeded")
    assert pod["status"]["message"] == \
        "Pod was active on the node longer than the specified deadline"
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    assert script.started[0].killed.is_set()
    assert last(kubeapi, "cmp", "jobs")["reason"] == "BackoffLimitExceeded"


def test_env_from_fields_and_secrets(kubeapi: KubeAPI) -> None:
    sim, script = simulate(kubeapi, lambda c: 0)
    job = comparator("cmp")
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "id"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token",
                                                         "optional": True}}},
        {"name": "KEY", "value": "later wins"}, {"name": "KEY", "valueFrom": {
            "secretKeyRef": {"name": "creds", "key": "id"}}}]
    with sim:
        kubeapi.create("jobs", job, namespace=NS)
        kubeapi.wait_for(lambda: any(
            (cs.get("state") or {}).get("waiting", {}).get("reason")
            == "CreateContainerConfigError" for p in kubeapi.list("pods", NS)
            for cs in p["status"].get("containerStatuses", [])), 5)
        kubeapi.create("secrets", {"metadata": {"name": "creds"}, "stringData": {"id": "AKIA"}},
                       NS)
        kubeapi.wait_for(lambda: last(kubeapi, "cmp", "jobs").get("type") == "Complete", 5)
    pod = kubeapi.list("pods", NS)[0]
    assert script.started[0].env == {"POD_NAME": pod["metadata"]["name"],
                                     "POD_UID": pod["metadata"]["uid"], "KEY": "AKIA"}
    secret = kubeapi.get("secrets", NS, "creds") or {}
    assert secret["data"] == {"id": base64.b64encode(b"AKIA").decode()}


# ---------------------------------------------------------------------- batch/v1 Job


def comparator(name: str, backoff: int = 0) -> Obj:
    return {"metadata": {"name": name}, "spec": {"backoffLimit": backoff, "template": {
        "metadata": {"labels": {"resumequal.dev/role": "comparator"}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "compare", "image": "worker:1",
                                 "command": ["resumequal"], "args": ["compare", "x"]}]}}}}


def test_a_batch_job_runs_a_pod_and_completes_or_fails(kubeapi: KubeAPI) -> None:
    sim, script = simulate(kubeapi, lambda c: 0 if c.pod_name.startswith("good-") else 3)
    with sim:
        kubeapi.create("jobs", comparator("good"), namespace=NS)
        kubeapi.create("jobs", comparator("bad", backoff=1), namespace=NS)
        # The retry waits out the pod failure backoff (10 s after the first failure).
        kubeapi.wait_for(lambda: last(kubeapi, "good", "jobs").get("type") == "Complete"
                         and last(kubeapi, "bad", "jobs").get("type") == "Failed", 25)
    good = (kubeapi.get("jobs", NS, "good") or {})["status"]
    assert [c["type"] for c in good["conditions"]] == ["SuccessCriteriaMet", "Complete"]
    assert good["succeeded"] == 1 and good["completionTime"]
    bad = (kubeapi.get("jobs", NS, "bad") or {})["status"]
    assert [(c["type"], c["reason"]) for c in bad["conditions"]] == [
        ("FailureTarget", "BackoffLimitExceeded"), ("Failed", "BackoffLimitExceeded")]
    assert bad["failed"] == 2 and len(sim.pods(NS, "bad")) == 2  # one retry, then no more
    first, retry = sorted(sim.pods(NS, "bad"), key=lambda p: p["metadata"]["creationTimestamp"])
    ended = first["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
    assert parse_rfc3339(retry["metadata"]["creationTimestamp"]) - parse_rfc3339(ended) \
        >= BACKOFF_S - 1  # whole seconds both
    assert script.started[0].command == ["resumequal", "compare", "x"]
    assert all(p["metadata"]["name"].startswith(("good-", "bad-"))
               and p["metadata"]["labels"]["resumequal.dev/role"] == "comparator"
               for p in kubeapi.list("pods", NS))


def test_a_batch_job_deadline_and_ttl(kubeapi: KubeAPI) -> None:
    sim, script = simulate(kubeapi, until_signal(143))
    with sim:
        job = comparator("slow")
        job["spec"].update(activeDeadlineSeconds=1, ttlSecondsAfterFinished=1)
        kubeapi.create("jobs", job, namespace=NS)
        kubeapi.wait_for(lambda: last(kubeapi, "slow", "jobs").get("type") == "Failed", 5)
        assert last(kubeapi, "slow", "jobs")["reason"] == "DeadlineExceeded"
        kubeapi.wait_for(lambda: kubeapi.get("jobs", NS, "slow") is None, 5)
    assert script.started[0].killed.is_set()
    assert {d.cause for d in kubeapi.deletions} == {"job-controller"}
