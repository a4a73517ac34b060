"""Process kills through a kill order in the store, as on a cluster where nothing outside a
pod can signal its processes: the armed worker reads the order and kills itself, torchrun
restarts the group, and the leg resumes and finishes exactly like the control."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from resumequal.local.processes import alive
from resumequal.run.beacons import KillOrder
from resumequal.run.location import RunLocation
from tests.integration import legs
from tests.integration.conftest import ControlRuns, spec_for

pytestmark = pytest.mark.slow


def test_a_hard_order_for_this_pod_kills_the_process_and_one_for_another_pod_does_not(
    control_run: ControlRuns, tmp_path: Path
) -> None:
    control = control_run("tiny-gpt")
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("tiny-gpt"))
    lp = legs.launch(spec, "preempted", tmp_path, env={"POD_UID": "uid-a"})
    beacon = legs.wait_beacon(lp, rank=1)
    assert beacon["podUid"] == "uid-a"
    location = legs.location(tmp_path)

    # An order that names this process and pod, written by whoever can write the store
    # but holds no key of the run: ignored.
    planted = KillOrder(rank=1, attempt=0, pid=beacon["pid"], pod_uid="uid-a", mode="hard",
                        grace_seconds=20, issued_at=time.time())
    RunLocation.open(str(tmp_path)).write_kill_order("preempted", planted)
    time.sleep(1.5)  # several polls
    assert alive(beacon["pid"]) and lp.proc.poll() is None
    assert "not a kill order of this run" in lp.log.read_text()

    # An order replayed after the pod was replaced names the old pod's uid: ignored.
    stale = KillOrder(rank=1, attempt=0, pid=beacon["pid"], pod_uid="uid-old", mode="hard",
                      grace_seconds=20, issued_at=time.time())
    location.write_kill_order("preempted", stale)
    time.sleep(1.5)  # several polls
    assert alive(beacon["pid"]) and lp.proc.poll() is None
    assert "ignoring a kill order for pid" in lp.log.read_text()

    location.write_kill_order("preempted", stale.model_copy(
        update={"pod_uid": "uid-a", "issued_at": time.time()}))
    assert lp.wait(240) == 0, lp.tail()
    log = lp.log.read_text()
    assert "hard kill order; SIGKILL" in log
    assert "failed (exitcode: -9) local_rank: 1" in log  # a signal death, no handler ran
    assert "emergency checkpoint" not in log
    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert (restore.attempt, restore.checkpoint) == (1, "step-00000004")
    assert RunLocation.open(str(tmp_path)).ranks_done("preempted") == {0, 1}
    assert legs.first_divergence(control, tmp_path) is None


def test_a_graceful_order_saves_an_emergency_checkpoint_and_resumes_from_it(
    control_run: ControlRuns, tmp_path: Path
) -> None:
    control = control_run("tiny-gpt")
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("tiny-gpt", preemption={
        "mode": "graceful"}))
    lp = legs.launch(spec, "preempted", tmp_path)
    beacon = legs.wait_beacon(lp, rank=1)
    assert beacon["podUid"] is None
    # No pod uid on either side: the pid alone names the process.
    legs.location(tmp_path).write_kill_order("preempted", KillOrder(
        rank=1, attempt=0, pid=beacon["pid"], mode="graceful", grace_seconds=60,
        issued_at=time.time()))
    assert lp.wait(240) == 0, lp.tail()
    log = lp.log.read_text()
    assert "graceful kill order; stopping" in log
    assert "emergency checkpoint committed" in log
    # torchrun names the first rank to exit after the save: 143, not an error's 1.
    failures = re.findall(r"failed \(exitcode: (-?\d+)\)", log)
    assert failures == ["143"], lp.tail()
    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert (restore.attempt, restore.checkpoint) == (1, "step-00000005+1")
    assert legs.first_divergence(control, tmp_path) is None
