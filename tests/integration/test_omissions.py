"""Each negative-control omission, applied to a real resume, makes the traces differ."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.integration import legs
from tests.integration.conftest import ControlRuns, spec_for

pytestmark = pytest.mark.slow

# Graceful kill at step 6 microstep 1: the resume starts from the emergency checkpoint
# step-00000005+1, so pending gradients exist and every omission has something to drop.
EXPECTED = {
    # Augmentation of the next microbatch draws from fresh RNGs: its loss moves first.
    "rng": (6, "loss"),
    # The cursor restarts at the beginning of the epoch: other sample ids.
    "data_cursor": (6, "inputs"),
    # The scheduler's (7, "lr"): with compare_run on the same legs, in test_compare_run.py.
    # Cursor and RNG both fresh: the sample ids differ first.
    "model_optimizer_only": (6, "inputs"),
    # Microbatch 0's gradients are gone: the accumulated local gradients differ.
    "pending_grads": (6, "local_grads"),
}


@pytest.mark.parametrize("omission", sorted(EXPECTED))
def test_omission_is_visible_in_the_trace(
    omission: str, control_run: ControlRuns, tmp_path: Path
) -> None:
    control = control_run("dropout-mlp")
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("dropout-mlp", preemption={
        "mode": "graceful"}))
    legs.preempt(spec, tmp_path, signal.SIGTERM, omit=(omission,))
    (restore,) = legs.restores(tmp_path, "preempted", 0)
    assert restore.omitted == [omission]
    divergence = legs.first_divergence(control, tmp_path)
    assert divergence is not None, f"omitting {omission} went unnoticed"
    step, boundary, _rank = divergence
    assert (step, boundary) == EXPECTED[omission]
