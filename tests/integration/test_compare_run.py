"""compare_run on real legs: an exact resume passes, a planted omission fails where expected."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest

from resumequal.compare import compare_run
from resumequal.results.verdict import Result
from resumequal.run.location import RunLocation
from tests.integration import legs
from tests.integration.conftest import ControlRuns, spec_for

pytestmark = pytest.mark.slow


def _with_control(control: Path, run_dir: Path) -> RunLocation:
    """Copy the shared control leg next to this run's preempted leg; the run's location. A
    copy: a folder store follows no link below its root."""
    if not (run_dir / "control").exists():
        shutil.copytree(control / "control", run_dir / "control", symlinks=True)
    return RunLocation.open(str(run_dir))


def test_exact_resume_passes(control_run: ControlRuns, tmp_path: Path) -> None:
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("dropout-mlp"))
    legs.preempt(spec, tmp_path, signal.SIGKILL)
    v = compare_run(_with_control(control_run("dropout-mlp"), tmp_path))
    assert v.result == Result.PASS, v.reason
    assert v.exact_through_step == 12
    assert v.resumed_from == "step-00000004"
    assert (v.steps_compared, v.ranks_compared) == (12, 2)
    assert [d.group for d in v.drift] == ["model", "optimizer"]
    for d in v.drift:
        assert d.tensors > 0 and d.numel > 0
        assert (d.max_abs_diff, d.rel_l2, d.mismatch_fraction) == (0.0, 0.0, 0.0)
        assert d.worst == [] and d.values_differ == [] and d.unmatched == []
    assert all(delta.abs_diff == 0.0 for delta in v.loss_deltas)


def test_resume_without_scheduler_fails_at_the_next_lr(
    control_run: ControlRuns, tmp_path: Path
) -> None:
    spec = legs.write_spec(tmp_path / "spec.yaml",
                           spec_for("dropout-mlp", preemption={"mode": "graceful"}))
    legs.preempt(spec, tmp_path, signal.SIGTERM, omit=("scheduler",))
    (restore,) = legs.restores(tmp_path, "preempted", 0)
    assert restore.omitted == ["scheduler"]
    # Resumed from the emergency checkpoint in step 6: the optimizer keeps the lr it saved,
    # so step 6 is still right; the fresh scheduler then sets the lr of its own step 1 for
    # step 7. The traces alone say so (the other omissions: test_omissions.py).
    divergence = legs.first_divergence(control_run("dropout-mlp"), tmp_path)
    assert divergence is not None and divergence[:2] == (7, "lr")
    v = compare_run(_with_control(control_run("dropout-mlp"), tmp_path))
    assert v.result == Result.FAIL, v.reason
    d = v.first_divergence
    assert d is not None
    assert (d.step, d.boundary, d.before_cut) == (7, "lr", False)
    assert v.resumed_from == "step-00000005+1"
    assert v.exact_through_step == 6
    assert v.reason.startswith("first divergence at step 7, boundary lr, rank 0, after the "
                               "resume from step-00000005+1")
    model = v.drift[0]
    assert model.group == "model" and model.max_abs_diff > 0
