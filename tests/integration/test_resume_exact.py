"""A preempted leg, killed and restarted by torchrun, must match the control bit for bit."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.integration import legs
from tests.integration.conftest import ControlRuns, spec_for

pytestmark = pytest.mark.slow


def _assert_exact(control: Path, preempted: Path) -> None:
    assert legs.first_divergence(control, preempted) is None
    a = legs.final_tensors(control, "control", "step-00000012")
    b = legs.final_tensors(preempted, "preempted", "step-00000012")
    compared = legs.assert_same_tensors(a, b)
    assert compared > 10  # model and optimizer tensors, not an empty dict


@pytest.mark.parametrize("workload", ["tiny-gpt", "dropout-mlp"])
def test_hard_kill_mid_accumulation_resumes_exactly(
    workload: str, control_run: ControlRuns, tmp_path: Path
) -> None:
    control = control_run(workload)
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for(workload))
    beacon = legs.preempt(spec, tmp_path, signal.SIGKILL)
    assert (beacon["step"], beacon["microstep"], beacon["attempt"]) == (6, 1, 0)

    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert (restore.attempt, restore.checkpoint) == (1, "step-00000004")
        attempts = {s: r.attempt for s, r in legs.steps(tmp_path, "preempted", rank).items()}
        assert attempts == {s: 0 if s <= 4 else 1 for s in range(1, 13)}
    _assert_exact(control, tmp_path)


def test_hard_mode_sigterm_resumes_from_the_periodic_checkpoint(
    control_run: ControlRuns, tmp_path: Path
) -> None:
    """A pod deletion sends SIGTERM first: in hard mode it must end the worker like SIGKILL,
    with no emergency checkpoint, or a hard qualification would test the graceful path."""
    control = control_run("tiny-gpt")
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("tiny-gpt"))
    legs.preempt(spec, tmp_path, signal.SIGTERM)
    log = (tmp_path / "preempted.log").read_text()
    assert "failed (exitcode: -15) local_rank: 1" in log  # torchrun saw a death by SIGTERM
    assert "emergency checkpoint" not in log
    root = tmp_path / "preempted" / "checkpoints"
    assert not [p.name for p in root.iterdir() if "+" in p.name]
    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert (restore.attempt, restore.checkpoint) == (1, "step-00000004")
        done = json.loads((tmp_path / "preempted" / "done" / f"rank-{rank}.json").read_text())
        assert (done["rank"], done["attempt"], done["steps"]) == (rank, 1, 12)
    _assert_exact(control, tmp_path)


def test_graceful_kill_resumes_from_emergency_checkpoint(
    control_run: ControlRuns, tmp_path: Path
) -> None:
    control = control_run("tiny-gpt")
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("tiny-gpt", preemption={
        "mode": "graceful"}))
    legs.preempt(spec, tmp_path, signal.SIGTERM)
    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        # Five steps done and one microbatch of step 6 with its pending gradients.
        assert restore.checkpoint == "step-00000005+1"
        assert (restore.step, restore.microstep, restore.global_microstep) == (5, 1, 16)
    _assert_exact(control, tmp_path)


def test_kill_before_commit_leaves_checkpoint_uncommitted(
    control_run: ControlRuns, tmp_path: Path
) -> None:
    control = control_run("tiny-gpt")
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("tiny-gpt", preemption={
        "at": "checkpoint_commit", "step": 8, "microstep": 0}))
    lp = legs.launch(spec, "preempted", tmp_path)
    beacon = legs.wait_beacon(lp, rank=1)
    root = tmp_path / "preempted" / "checkpoints"
    staged = root / ".staging" / "step-00000008.attempt-0"
    # Shards of both ranks are written; the commit has not happened.
    assert (staged / "rank-1.json").exists()
    assert not (root / "step-00000008").exists()
    legs.os.kill(beacon["pid"], signal.SIGKILL)
    assert lp.wait(240) == 0, lp.tail()

    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert restore.checkpoint == "step-00000004"
    assert not staged.exists()  # garbage-collected at the restart
    _assert_exact(control, tmp_path)
