"""`resumequal run` with an elastic resize (``preemption.resize``): 2 nodes x 1 rank, the
armed rank's node killed hard mid-step 6 and not replaced, the survivor resuming alone from
the checkpoint of step 4 (resharded 2 -> 1), a new node joining after the checkpoint of
step 8 and both resuming from it (resharded 1 -> 2). Real torchrun agents on loopback, a
real c10d rendezvous at min 1 / max 2 nodes, real membership changes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from resumequal.qualify.plan import leg_module_args, local_torchrun_args
from resumequal.spec.launchers import TORCHRUN
from testing.ports import free_port
from tests.integration import legs
from tests.waiting import eventually

pytestmark = pytest.mark.slow

RESIZE = ["world.nnodes=2", "world.nprocPerNode=1", "preemption.target=pod",
          "preemption.rank=1", "preemption.step=6", "preemption.microstep=1",
          "preemption.resize={toNodes: 1, growAfterStep: 8}",
          "comparison.mode=tolerance",
          "comparison.tolerances={loss: 1.0e-4, grad_norm: 1.0e-4, params: 1.0e-4}"]


def _run(run_dir: Path, *sets: str) -> dict[str, Any]:
    args = [a for s in (*RESIZE, *sets) for a in ("--set", s)]
    proc = legs.resumequal("run", "--run-dir", str(run_dir), *args, timeout=400)
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text())
    assert proc.returncode == 0, (report["verdict"]["reason"], proc.stdout[-3000:])
    return report


def _authoritative(run_dir: Path, leg: str) -> dict[int, list[dict[str, Any]]]:
    """Each step's records from the latest attempt that ran it (a restart redoes steps)."""
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in legs.records(run_dir, leg, "step"):
        by_step[record["step"]].append(record)
    return {step: [r for r in records if r["attempt"] == max(x["attempt"] for x in records)]
            for step, records in by_step.items()}


def _world_sizes(run_dir: Path, leg: str) -> list[int]:
    steps = _authoritative(run_dir, leg)
    for step, records in steps.items():
        assert sorted(r["rank"] for r in records) == list(range(records[0]["world_size"])), step
    return [steps[s][0]["world_size"] for s in sorted(steps)]


def _check_mechanics(run_dir: Path, leg: str = "preempted") -> None:
    """2 -> 1 -> 2 ranks, each resume resharded from the expected checkpoint, and every
    global step fed the reference leg's microbatches."""
    assert _world_sizes(run_dir, "control") == [2] * 12
    assert _world_sizes(run_dir, leg) == [2] * 4 + [1] * 4 + [2] * 4
    restores = sorted((r["attempt"], r["rank"], r["checkpoint"], r["saved_world_size"],
                       r["world_size"]) for r in legs.records(run_dir, leg, "restore"))
    assert restores == [(1, 0, "step-00000004", 2, 1), (2, 0, "step-00000008", 1, 2),
                        (2, 1, "step-00000008", 1, 2)]
    grow = json.loads((run_dir / leg / "beacons" / "attempt-1-rank-0.json").read_text())
    assert (grow["at"], grow["step"]) == ("grow", 9)


def _check_pass(report: dict[str, Any]) -> dict[str, Any]:
    verdict: dict[str, Any] = report["verdict"]
    assert verdict["result"] == "PASS", verdict["reason"]
    assert verdict["reason"].startswith("resize: 2→1→2 ranks; exact through step 4 before "
                                        "the resize; handoff exact (2 restores); ledger exact "
                                        "(12 steps, "), verdict["reason"]
    resize = verdict["resize"]
    assert [(p["name"], p["ok"]) for p in resize["parts"]] == [
        ("before_resize", True), ("handoff", True), ("data_ledger", True), ("drift", True)]
    assert [(h["checkpoint"], h["saved_world_size"], h["world_size"], h["equal_to_saved"],
             h["equal_to_control"]) for h in resize["handoffs"]] == [
        ("step-00000004", 2, 1, True, True), ("step-00000008", 1, 2, True, None)]
    # The drift figures per step, from the resize on, within the declared tolerances.
    rows = {r["step"]: r for r in resize["steps"]}
    assert [rows[s]["world_size"] for s in range(1, 13)] == [2] * 4 + [1] * 4 + [2] * 4
    after = [rows[s] for s in range(5, 13)]
    assert all(r["ledger_ok"] and r["within_tolerance"] for r in after)
    assert max(r["loss_max_abs_diff"] for r in after) < 1e-4
    return verdict


@pytest.mark.timeout(420)
def test_a_resized_ddp_run_passes_and_its_rank_keyed_controls_are_caught(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    report = _run(run_dir, "workload.name=dropout-mlp",
                  "controls.omissions=[rank_cursor, rank_rng]")
    _check_pass(report)
    _check_mechanics(run_dir)
    for leg in ("nc-rank-cursor", "nc-rank-rng"):
        _check_mechanics(run_dir, leg)  # the same resize, only the microbatches go wrong
    controls = {c["omission"]: c for c in report["verdict"]["controls"]}
    assert controls["rank_cursor"]["status"] == "detected"
    assert controls["rank_cursor"]["mechanism"].startswith("data ledger: step 5: 24 sample "
                                                           "ids missing")
    assert controls["rank_rng"]["status"] == "detected"
    # The samples were right; their random streams (augmentation, dropout) were not.
    assert controls["rank_rng"]["mechanism"].startswith("drift: step 5 (1 rank): loss")
    html = (run_dir / "report.html").read_text()
    assert "Resize</h2>" in html and "resized to 1 rank(s) from step 4" in html


@pytest.mark.timeout(300)
def test_fsdp2_reshards_its_sharded_state_across_a_resize(tmp_path: Path) -> None:
    """The optimizer state is sharded over the ranks: DCP reshards it 2 -> 1 -> 2, and the
    gathered state each world restored is the one the saving world had."""
    run_dir = tmp_path / "run"
    report = _run(run_dir, "workload.name=tiny-gpt", "parallelism.kind=fsdp2",
                  "controls.enabled=false")
    _check_pass(report)
    _check_mechanics(run_dir)


@pytest.mark.timeout(200)
def test_a_world_formed_before_every_node_joined_waits_for_the_full_one(
        tmp_path: Path) -> None:
    """torchrun at --nnodes=1:2 forms a world of the first node alone when the second
    comes later than the last call; a resize leg's workers then write nothing and wait
    until torchrun restarts them with the late node, so the leg trains at full size."""
    spec = legs.write_spec(tmp_path / "spec.yaml", {
        "workload": {"name": "dropout-mlp"},
        "world": {"nnodes": 2, "nprocPerNode": 1},
        "training": {"steps": 4},
        "checkpoint": {"everySteps": 2},
        "preemption": {"step": 3, "rank": 1, "target": "pod", "resize": {"toNodes": 1}},
        "comparison": {"mode": "tolerance", "tolerances": {"loss": 1e-4, "grad_norm": 1e-4,
                                                           "params": 1e-4}},
    })
    run_dir = tmp_path / "run"
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str], log: str) -> subprocess.Popen[bytes]:
        with (tmp_path / log).open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        procs.append(proc)
        return proc

    rdzv = {"is_host": "false", "last_call_timeout": "1", "join_timeout": "60",
            "read_timeout": "60"}
    agent = [sys.executable, *TORCHRUN, "--nnodes=1:2",
             *local_torchrun_args(endpoint=f"127.0.0.1:{port}", nproc=1, max_restarts=1,
                                  rdzv=rdzv),
             *leg_module_args("control", str(run_dir), spec_file=str(spec))]
    try:
        start([sys.executable, "-m", "resumequal.local.rdzv_store", f"--port={port}"],
              "store.log")
        first = start(agent, "node-0.log")
        eventually(lambda: "before every node joined" in (tmp_path / "node-0.log").read_text(),
                   120, "the lone node's worker waiting for the full world",
                   abort=lambda: None if first.poll() is None else "node 0 exited")
        second = start(agent, "node-1.log")
        assert first.wait(timeout=150) == 0, (tmp_path / "node-0.log").read_text()[-3000:]
        assert second.wait(timeout=60) == 0, (tmp_path / "node-1.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    # The lone world wrote nothing: the whole leg is attempt 0 at 2 ranks.
    steps = legs.records(run_dir, "control", "step")
    assert sorted((r["step"], r["rank"]) for r in steps) == [(s, r) for s in range(1, 5)
                                                             for r in (0, 1)]
    assert {(r["attempt"], r["world_size"]) for r in steps} == {(0, 2)}
    assert sorted(p.name for p in (run_dir / "control" / "done").iterdir()) == \
        ["rank-0.json", "rank-1.json"]
