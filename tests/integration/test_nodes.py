"""`resumequal run` with legs of several nodes: one torchrun agent per node on loopback
against a rendezvous store of its own, and node kills (``preemption.target: pod``), where
the armed rank's whole node dies and a new agent takes its place, as a training operator
recreates a deleted pod. 2 nodes x 1 rank, tiny-gpt, cut mid-accumulation (step 6,
microbatch 1), controls off. (The control leg of each runs the two nodes unharmed.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration import legs

pytestmark = pytest.mark.slow

NODES = ["world.nnodes=2", "world.nprocPerNode=1", "controls.enabled=false"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["hard", "graceful"])
def test_a_killed_node_is_replaced_and_the_leg_resumes_exactly(
        tmp_path: Path, mode: str) -> None:
    run_dir = tmp_path / "run"
    report, _ = legs.qualify(run_dir, *NODES, "preemption.target=pod", f"preemption.mode={mode}",
                             "preemption.graceSeconds=30")
    verdict = report["verdict"]
    assert verdict["result"] == "PASS", verdict["reason"]
    assert verdict["reason"].startswith("exact: every boundary of 12 steps on 2 ranks equal")
    checkpoints = sorted(p.name for p in (run_dir / "preempted" / "checkpoints").iterdir())
    if mode == "hard":
        # The whole node died by SIGKILL: nothing was saved; the periodic checkpoint served.
        assert verdict["resumed_from"] == "step-00000004"
        assert not any("+" in name for name in checkpoints)
    else:
        # SIGTERM to the node's agent, passed on to its worker: every rank saved.
        assert verdict["resumed_from"] == "step-00000005+1"
    for leg in ("control", "preempted"):  # an agent per node, and a log per node
        assert (run_dir / f"{leg}.node-0.log").is_file()
        assert (run_dir / f"{leg}.node-1.log").is_file()
    # One process per node: the two ranks of every attempt ran in different agents.
    starts = legs.records(run_dir, "preempted", "inventory")
    assert len({(r["attempt"], r["pid"]) for r in starts}) == 4
    restores = legs.records(run_dir, "preempted", "restore")
    assert sorted((r["rank"], r["attempt"]) for r in restores) == [(0, 1), (1, 1)]
    assert [r["rank"] for r in legs.records(run_dir, "preempted", "arm")] == [1]
    # The armed rank's node was replaced: a fresh agent (restart count 0) joined attempt 1
    # beside the survivor (restart count 1).
    logs = "".join((run_dir / f"preempted.node-{i}.log").read_text() for i in (0, 1))
    assert logs.count("attempt 1 from the run location (this agent's restart count is 0)") \
        == 1, logs[-3000:]
