"""Real pods in the simulated cluster: each container a real process tree (the kubelet's
process runtime), real torchrun reading only the PET_* variables the training operator
injects, real gloo, real signals: what a pod deletion does to an elastic PyTorchJob."""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from testing.kubeapi import KubeAPI
from testing.kubeapi.processes import ProcessRuntime, container_pids
from testing.kubeapi.training import SimulatedTrainingOperator

NS = "quals"
Obj = dict[str, Any]

# Joins a gloo group through the store torchrun names (the agent's shared store, or its own
# on rank 0 when TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives each round a fresh one), marks
# that the group formed, then all-reduces until it is stopped.
WORKER = textwrap.dedent("""
    import os, time
    from datetime import timedelta
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    timeout = timedelta(seconds=30)
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                         world_size=None if agent_store else world,
                         is_master=not agent_store and rank == 0, timeout=timeout,
                         wait_for_workers=False)
    group = (base.add("test/joins", 1) - 1) // world  # the same for every rank of a round
    dist.init_process_group("gloo", store=dist.PrefixStore(f"test/{group}", base),
                            rank=rank, world_size=world, timeout=timeout)
    total = torch.ones(1)
    dist.all_reduce(total)
    name = f"{os.environ['POD_NAME']}.{os.getpid()}.world{int(total.item())}"
    open(os.path.join(os.environ["MARKS"], name), "w").close()
    for _ in range(3000):
        dist.all_reduce(torch.ones(1))
        time.sleep(0.1)
""")
# What a launcher around torchrun must do: pass SIGTERM on, then exit 128+signal.
LAUNCHER = textwrap.dedent("""
    import signal, subprocess, sys
    child = subprocess.Popen(sys.argv[1:])
    received = []
    def forward(signum, frame):
        received.append(signum)
        child.send_signal(signum)
    signal.signal(signal.SIGTERM, forward)
    code = child.wait()
    sys.exit(128 + received[0] if received else code if code >= 0 else 128 - code)
""")


def elastic_job(name: str, command: list[str], marks: Path, *, conf: Obj | None = None,
                env: Obj | None = None) -> Obj:
    container = {"name": "pytorch", "image": "worker:1", "command": command,
                 "env": [{"name": "MARKS", "value": str(marks)},
                         {"name": "OMP_NUM_THREADS", "value": "1"},
                         *({"name": k, "value": v} for k, v in (env or {}).items()),
                         {"name": "POD_NAME",
                          "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                 "ports": [{"name": "pytorchjob-port", "containerPort": 29400}]}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": name, "namespace": NS}, "spec": {
                "elasticPolicy": {"rdzvBackend": "c10d", "rdzvId": name, "minReplicas": 2,
                                  "maxReplicas": 2, "maxRestarts": 3, "rdzvConf": [
                                      {"key": k, "value": v} for k, v in (conf or {}).items()]},
                "nprocPerNode": "1",
                "runPolicy": {"cleanPodPolicy": "Running"},
                "pytorchReplicaSpecs": {"Worker": {
                    "replicas": 2, "restartPolicy": "ExitCode",
                    "template": {"spec": {"containers": [container],
                                          "terminationGracePeriodSeconds": 10}}}}}}


def last(api: KubeAPI, name: str) -> Obj:
    conds = [c for c in ((api.get("pytorchjobs", NS, name) or {}).get("status") or {}).get(
        "conditions", []) if c["status"] == "True"]
    return conds[-1] if conds else {}


def joined(marks: Path) -> dict[str, set[str]]:
    """The worker processes (pids) of each pod that joined a complete group."""
    out: dict[str, set[str]] = {}
    for p in marks.iterdir():
        pod, pid, world = p.name.split(".")
        if world == "world2":
            out.setdefault(pod, set()).add(pid)
    return out


def exit_codes(api: KubeAPI, pod_uid: str) -> set[int]:
    """The exit codes a pod's status recorded (none for a pod removed at once)."""
    return {cs["state"]["terminated"]["exitCode"] for e in api.history("pods")
            if e.object["metadata"]["uid"] == pod_uid
            for cs in e.object["status"].get("containerStatuses", [])
            if "terminated" in cs["state"]}


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def uid(api: KubeAPI, pod: str) -> str | None:
    obj = api.get("pods", NS, pod)
    return None if obj is None else str(obj["metadata"]["uid"])


def test_a_container_process_gets_its_env_signals_and_exit_codes(
        kubeapi: KubeAPI, real_pods: SimulatedTrainingOperator, pod_runtime: ProcessRuntime,
        tmp_path: Path) -> None:
    kubeapi.create("secrets", {"metadata": {"name": "creds"}, "stringData": {"id": "AKIA"}}, NS)
    child_pid = tmp_path / "child.pid"
    stubborn = textwrap.dedent(f"""
        import signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                 start_new_session=True)
        open({str(child_pid)!r}, "w").write(str(child.pid))
        print("ignoring SIGTERM", flush=True)
        time.sleep(60)
    """)
    jobs = {"exits": (["python", "-c", "import os, sys; print(os.environ['POD_NAME'], "
                       "os.environ['KEY'], os.environ['HOSTNAME']); sys.exit(3)"], {}),
            "stubborn": (["python", "-c", stubborn], {"activeDeadlineSeconds": 2}),
            "missing": (["no-such-command"], {})}
    for name, (command, pod) in jobs.items():
        kubeapi.create("jobs", {"metadata": {"name": name}, "spec": {"backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                                  **pod, "containers": [{
                                      "name": "main", "image": "x", "command": command,
                                      "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {
                                          "fieldPath": "metadata.name"}}},
                                          {"name": "KEY", "valueFrom": {"secretKeyRef": {
                                              "name": "creds", "key": "id"}}}]}]}}}}, NS)
    t0 = time.monotonic()

    def ended() -> dict[str, Obj] | None:
        pods = {p["metadata"]["labels"]["job-name"]: p for p in kubeapi.list("pods", NS)}
        done = all(pods.get(n, {}).get("status", {}).get("phase") == "Failed" for n in jobs)
        return pods if done else None

    pods = kubeapi.wait_for(ended, 30, "every pod Failed")
    codes = {n: p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
             for n, p in pods.items()}
    assert codes == {"exits": 3, "stubborn": 137, "missing": 128}, pod_runtime.logs()
    # The deadline's SIGTERM was ignored: SIGKILL after the 2 s minimum, to the whole tree
    # (startTime has whole seconds: the 2 s deadline may come up to 1 s early).
    assert time.monotonic() - t0 >= 3
    assert pods["stubborn"]["status"]["reason"] == "DeadlineExceeded"
    assert not alive(int(child_pid.read_text()))
    assert container_pids(pods["stubborn"]["metadata"]["uid"]) == []
    name = pods["exits"]["metadata"]["name"]
    [log] = pod_runtime.log_paths(NS, name)
    assert log.read_text() == f"{name} AKIA {name}\n"
    assert "executable file not found" in pod_runtime.log_paths(
        NS, pods["missing"]["metadata"]["name"])[0].read_text()


@pytest.mark.slow
@pytest.mark.waits
@pytest.mark.timeout(240)
@pytest.mark.parametrize("grace", [0, 5])
def test_deleting_a_plain_torchrun_pod_fails_the_job(
        kubeapi: KubeAPI, real_pods: SimulatedTrainingOperator, pod_runtime: ProcessRuntime,
        tmp_path: Path, grace: int) -> None:
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    marks = tmp_path / "marks"
    marks.mkdir()
    kubeapi.create("pytorchjobs", elastic_job("plain", ["torchrun", str(worker)], marks,
                                              conf={"read_timeout": "10"}))
    kubeapi.wait_for(lambda: len(joined(marks)) == 2, 90, "the first group")
    env = [e for e in (kubeapi.get("pods", NS, "plain-worker-1") or {})["spec"][
        "containers"][0]["env"] if e["name"].startswith("PET_")]
    assert {e["name"] for e in env} == {"PET_NPROC_PER_NODE", "PET_RDZV_ENDPOINT",
                                        "PET_RDZV_BACKEND", "PET_NNODES", "PET_MAX_RESTARTS",
                                        "PET_RDZV_ID", "PET_RDZV_CONF"}
    old = uid(kubeapi, "plain-worker-1")
    assert old is not None
    kubeapi.delete("pods", NS, "plain-worker-1", grace_period_seconds=grace)
    kubeapi.wait_for(lambda: last(kubeapi, "plain").get("type") == "Failed", 120,
                     "the job to fail")
    assert last(kubeapi, "plain")["message"] == \
        'job "plain" is failing because "Worker" replica(s) failed.', pod_runtime.logs()
    assert "SignalException" in pod_runtime.log_paths(NS, "plain-worker-1")[0].read_text()
    if grace:
        # torchrun re-raised the SIGTERM and exited 1: recorded, and not retryable.
        assert exit_codes(kubeapi, old) == {1}
    else:
        # Gone at once, the pod was recreated under its name (its torchrun's exit 1 recorded
        # nowhere); then the new agent and worker-0's agent deadlocked in the next round:
        # torch 2.13 (elastic/rendezvous/dynamic_rendezvous.py next_rendezvous) lets the
        # surviving rank-0 agent reuse its shared store, so the newcomer waits for a
        # MASTER_ADDR nobody writes, until read_timeout; both agents exit 1.
        assert exit_codes(kubeapi, old) == set()
        assert len([p for p in kubeapi.created("pods") if p["metadata"]["name"]
                    == "plain-worker-1"]) == 2
        assert "MASTER_ADDR" in pod_runtime.logs(), pod_runtime.logs()
    kubeapi.wait_for(lambda: all(p["status"]["phase"] != "Running"
                                 for p in kubeapi.list("pods", NS)), 30, "cleanPodPolicy")


@pytest.mark.slow
@pytest.mark.waits
@pytest.mark.timeout(240)
def test_a_launcher_exiting_143_gets_its_pod_recreated_and_the_group_restarted(
        kubeapi: KubeAPI, real_pods: SimulatedTrainingOperator, pod_runtime: ProcessRuntime,
        tmp_path: Path) -> None:
    worker, launcher = tmp_path / "worker.py", tmp_path / "launcher.py"
    worker.write_text(WORKER)
    launcher.write_text(LAUNCHER)
    marks = tmp_path / "marks"
    marks.mkdir()
    # Without a shared rendezvous store a new agent can join a surviving rank 0 (see above).
    kubeapi.create("pytorchjobs", elastic_job(
        "wrapped", [sys.executable, str(launcher), "torchrun", str(worker)], marks,
        env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}))
    kubeapi.wait_for(lambda: len(joined(marks)) == 2, 90, "the first group")
    old = uid(kubeapi, "wrapped-worker-1")
    assert old is not None
    # The grace leaves a loaded machine time for torchrun's own teardown (SIGTERM to its
    # workers, then their exit): past it the kubelet's SIGKILL makes 137, not the 143 here.
    kubeapi.delete("pods", NS, "wrapped-worker-1", grace_period_seconds=20)
    kubeapi.wait_for(lambda: all(len(pids) == 2 for pids in joined(marks).values()), 120,
                     "the restarted group")
    assert exit_codes(kubeapi, old) == {143}  # retryable: the pod was recreated
    assert uid(kubeapi, "wrapped-worker-1") not in (None, old)
    assert last(kubeapi, "wrapped")["type"] == "Running"
    history = [(c["type"], c["reason"]) for e in kubeapi.history("pytorchjobs")
               for c in (e.object.get("status") or {}).get("conditions", [])]
    assert ("Restarting", "PyTorchJobRestarting") in history
