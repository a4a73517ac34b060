"""Scripted containers on a node process (:class:`testing.kubeapi.node.NodeRuntime`): the
kubelet's starts, SIGTERMs and SIGKILLs reach them there, their exits come back, and the
elastic rendezvous of a job's agents plays out on the node as on threads."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from testing.kubeapi import KubeAPI
from testing.kubeapi.node import ContainerFailed, NodeRuntime
from testing.kubeapi.scripted import Container
from testing.kubeapi.training import SimulatedTrainingOperator
from tests.emulator.test_training import NS, last, pytorchjob, running

pytestmark = pytest.mark.timeout(60)


def _note(c: Container, what: str, **fields: object) -> None:
    """Append a line about this container to ``$OUT/<pod>.jsonl`` (the test reads it)."""
    with open(Path(c.env["OUT"]) / f"{c.pod_name}.jsonl", "a") as f:
        f.write(json.dumps({"what": what, "pid": os.getpid(), "uid":
                            c.pod["metadata"]["uid"], **fields}) + "\n")


def _notes(out: Path, pod: str) -> list[dict[str, object]]:
    path = out / f"{pod}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# The scripts are module functions: they are sent to the node process by reference.

def until_sigterm(c: Container) -> int:
    _note(c, "started")
    c.killed.wait()
    _note(c, "sigterm")
    return 143


def ignores_sigterm(c: Container) -> int:
    """The container the test marked (``$OUT/ignore-<pod uid>``) ignores SIGTERM: only
    SIGKILL ends it."""
    _note(c, "started")
    c.killed.wait()
    if (Path(c.env["OUT"]) / f"ignore-{c.pod['metadata']['uid']}").exists():
        time.sleep(6)
        _note(c, "returned")
    return 143


def raises(c: Container) -> int:
    raise ValueError(f"{c.pod_name}: a script's own bug")


def agent(c: Container) -> int:
    while (group := c.rendezvous(10)) is not None:
        _note(c, "round", number=group.number, rank=group.rank, restarts=group.restart_count)
        while not (group.changed.is_set() or c.killed.is_set()):
            time.sleep(0.01)
        if c.killed.is_set():
            return 143
    return 143 if c.killed.is_set() else 1


def _job(name: str, out: Path) -> dict[str, object]:
    return pytorchjob(name, env={"OUT": str(out), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})


def test_containers_run_in_the_node_process_and_signals_reach_them(
        kubeapi: KubeAPI, tmp_path: Path) -> None:
    node = NodeRuntime(until_sigterm)
    with SimulatedTrainingOperator(kubeapi, runtime=node):
        kubeapi.create("pytorchjobs", _job("leg", tmp_path))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1")
                         and len(_notes(tmp_path, "leg-worker-1")) == 1, 10)
        started = _notes(tmp_path, "leg-worker-1")[0]
        assert started["pid"] == node.pid and started["pid"] != os.getpid()
        kubeapi.delete("pods", NS, "leg-worker-1", grace_period_seconds=3)
        # SIGTERM reached the script; its 143 came back and the job replaced the pod.
        kubeapi.wait_for(lambda: [n["what"] for n in _notes(tmp_path, "leg-worker-1")]
                         == ["started", "sigterm", "started"], 10)
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Running", 10)
    assert _notes(tmp_path, "leg-worker-1")[2]["uid"] != started["uid"]
    exited = next(e.old for e in kubeapi.history("pods") if e.type == "DELETED"
                  and e.object["metadata"]["uid"] == started["uid"])
    assert exited is not None
    assert exited["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    assert not node._process.is_alive()  # stopping the cluster stopped the node


def test_sigkill_is_final_at_once_whatever_the_script_still_does(
        kubeapi: KubeAPI, tmp_path: Path) -> None:
    node = NodeRuntime(ignores_sigterm)
    with SimulatedTrainingOperator(kubeapi, runtime=node) as sim:
        kubeapi.create("pytorchjobs", _job("leg", tmp_path))
        kubeapi.wait_for(lambda: running(kubeapi, "leg-worker-0", "leg-worker-1"), 10)
        uid = kubeapi.get("pods", NS, "leg-worker-1")["metadata"]["uid"]  # type: ignore[index]
        (tmp_path / f"ignore-{uid}").touch()
        kubeapi.wait_for(lambda: any(n["uid"] == uid for n in _notes(tmp_path, "leg-worker-1")),
                         10)
        t0 = time.monotonic()
        kubeapi.delete("pods", NS, "leg-worker-1", grace_period_seconds=0)
        # SIGKILL after the 2 s minimum grace ends it for the kubelet at once, though the
        # script sleeps on.
        kubeapi.wait_for(lambda: uid not in sim.kubelet._pods, 15)
        notes = _notes(tmp_path, "leg-worker-1")
        assert time.monotonic() - t0 >= 1.9, notes
        assert "returned" not in [n["what"] for n in notes if n["uid"] == uid], notes


def test_a_script_that_raises_is_reported_by_the_runtime_and_exits_1(
        kubeapi: KubeAPI, tmp_path: Path) -> None:
    node = NodeRuntime(raises)
    sim = SimulatedTrainingOperator(kubeapi, runtime=node)
    sim.start()
    try:
        kubeapi.create("pytorchjobs", _job("leg", tmp_path))
        kubeapi.wait_for(lambda: last(kubeapi, "leg").get("type") == "Failed", 10)
    finally:
        with pytest.raises(RuntimeError, match="simulated cluster failed") as failed:
            sim.stop()
    cause = failed.value.__cause__
    assert isinstance(cause, ContainerFailed)
    assert "ValueError: leg-worker-" in str(cause) and "a script's own bug" in str(cause)


def test_the_agents_rendezvous_on_the_node_and_restart_when_a_pod_is_replaced(
        kubeapi: KubeAPI, tmp_path: Path) -> None:
    def rounds() -> list[tuple[str, int, int, int]]:
        return sorted((pod, int(n["number"]), int(n["rank"]), int(n["restarts"]))  # type: ignore[call-overload]
                      for pod in ("leg-worker-0", "leg-worker-1")
                      for n in _notes(tmp_path, pod) if n["what"] == "round")

    with SimulatedTrainingOperator(kubeapi, runtime=NodeRuntime(agent)):
        kubeapi.create("pytorchjobs", _job("leg", tmp_path))
        kubeapi.wait_for(lambda: len(rounds()) == 2, 10)
        assert rounds() == [("leg-worker-0", 0, 0, 0), ("leg-worker-1", 0, 1, 0)]
        kubeapi.delete("pods", NS, "leg-worker-1", grace_period_seconds=0)
        kubeapi.wait_for(lambda: len(rounds()) == 4, 10)
    # worker-0's agent restarted its workers (counted); the new pod's agent starts at 0.
    assert rounds()[1::2] == [("leg-worker-0", 1, 0, 1), ("leg-worker-1", 1, 1, 0)]
