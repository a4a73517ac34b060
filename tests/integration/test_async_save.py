"""Background checkpoint saves (``checkpoint.async``) with real torchrun legs: the numerics
are those of synchronous saves, and a kill while a save is being written or waiting for its
commit resumes from the previous committed checkpoint, bit for bit."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from resumequal.checkpoint import layout
from tests.integration import legs
from tests.integration.conftest import ControlRuns, spec_for

pytestmark = pytest.mark.slow

WORKLOAD = "tiny-gpt"
ASYNC = {"async": True}


@pytest.fixture(scope="module")
def async_control(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("control-async")
    spec = legs.write_spec(run_dir / "spec.yaml", spec_for(WORKLOAD, checkpoint=ASYNC))
    legs.run_leg(spec, "control", run_dir)
    return run_dir


def _assert_exact(a_dir: Path, b_dir: Path, a_leg: str, b_leg: str) -> None:
    assert legs.first_divergence(a_dir, b_dir, a_leg=a_leg, b_leg=b_leg) is None
    a = legs.final_tensors(a_dir, a_leg, "step-00000012")
    b = legs.final_tensors(b_dir, b_leg, "step-00000012")
    assert legs.assert_same_tensors(a, b) > 10  # model and optimizer, not an empty dict


def test_async_saves_change_no_numerics(async_control: Path, control_run: ControlRuns) -> None:
    _assert_exact(control_run(WORKLOAD), async_control, "control", "control")
    root = async_control / "control" / "checkpoints"
    # keep_last=4 of the saves after steps 4, 8 and 12, all committed; nothing left staged.
    assert [p.name for p in layout.committed(root)] == [
        "step-00000004", "step-00000008", "step-00000012"]
    assert not any((root / ".staging").glob("*"))


def test_hard_kill_with_async_saves_resumes_exactly(async_control: Path, tmp_path: Path) -> None:
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for(WORKLOAD, checkpoint=ASYNC))
    beacon = legs.preempt(spec, tmp_path, signal.SIGKILL)
    assert (beacon["step"], beacon["microstep"], beacon["attempt"]) == (6, 1, 0)
    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert (restore.attempt, restore.checkpoint) == (1, "step-00000004")
    _assert_exact(async_control, tmp_path, "control", "preempted")


def test_kill_during_a_background_save_resumes_from_the_previous_one(
    async_control: Path, tmp_path: Path
) -> None:
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for(
        WORKLOAD, checkpoint=ASYNC,
        preemption={"at": "checkpoint_commit", "step": 8, "microstep": 0}))
    lp = legs.launch(spec, "preempted", tmp_path)
    beacon = legs.wait_beacon(lp, rank=1)
    assert (beacon["step"], beacon["at"]) == (8, "checkpoint_commit")
    root = tmp_path / "preempted" / "checkpoints"
    staged = root / ".staging" / "step-00000008.attempt-0"
    # Rank 1 has handed its write to the background and holds before the commit
    # collective, so step 8 cannot have been committed; step 4 was, before step 6.
    assert (staged / "rank-1.json").exists()
    assert not (root / "step-00000008").exists()
    assert (root / "step-00000004" / "manifest.json").exists()
    legs.os.kill(beacon["pid"], signal.SIGKILL)
    assert not (root / "step-00000008").exists()
    assert lp.wait(240) == 0, lp.tail()

    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        assert (restore.attempt, restore.checkpoint) == (1, "step-00000004")
    assert not staged.exists()  # garbage-collected at the restart
    _assert_exact(async_control, tmp_path, "control", "preempted")


def test_sigterm_during_a_background_save_commits_it_then_an_emergency_one(
    async_control: Path, tmp_path: Path
) -> None:
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for(
        WORKLOAD, checkpoint=ASYNC,
        preemption={"at": "checkpoint_commit", "step": 8, "microstep": 0, "mode": "graceful"}))
    legs.preempt(spec, tmp_path, signal.SIGTERM)
    for rank in range(2):
        (restore,) = legs.restores(tmp_path, "preempted", rank)
        # The pending background save is committed before the (synchronous) emergency
        # checkpoint of the same position replaces it; the restart resumes from it.
        assert (restore.attempt, restore.checkpoint) == (1, "step-00000008")
    _assert_exact(async_control, tmp_path, "control", "preempted")
