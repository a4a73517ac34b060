"""Legs that must stop, and stop with an error that says why."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.integration import legs
from tests.integration.conftest import ControlRuns, spec_for

pytestmark = pytest.mark.slow


def test_arm_timeout_fails_the_leg_for_every_attempt(tmp_path: Path) -> None:
    spec = legs.write_spec(tmp_path / "spec.yaml", spec_for("dropout-mlp", timeouts={
        "arm_seconds": 3, "process_group_seconds": 60}))
    lp = legs.launch(spec, "preempted", tmp_path, max_restarts=3)
    legs.wait_beacon(lp, rank=1)
    armed = time.monotonic()
    code = lp.wait(120)
    elapsed = time.monotonic() - armed
    assert code != 0
    failed = json.loads((tmp_path / "preempted" / "FAILED.json").read_text())
    assert "held at the cut (step 6, microstep 1" in failed["reason"]
    assert "timeouts.armSeconds" in failed["reason"]
    log = lp.log.read_text()
    # The restarted attempts refuse to start instead of training past the cut.
    assert "this leg has already failed" in log
    assert elapsed < 60


def test_tampered_checkpoint_is_refused_on_resume(
    control_run: ControlRuns, tmp_path: Path
) -> None:
    import shutil

    source = control_run("dropout-mlp")
    shutil.copytree(source, tmp_path / "run", ignore=shutil.ignore_patterns("*.log", "*.pt"))
    run_dir = tmp_path / "run"
    newest = run_dir / "control" / "checkpoints" / "step-00000012" / "dcp"
    shard = sorted(newest.glob("*.distcp"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))

    lp = legs.launch(run_dir / "spec.yaml", "control", run_dir, max_restarts=0)
    assert lp.wait(120) != 0
    log = lp.log.read_text()
    assert f"dcp/{shard.name} fails its BLAKE3 check" in log


def test_run_dir_of_another_run_is_refused(control_run: ControlRuns, tmp_path: Path) -> None:
    run_dir = control_run("dropout-mlp")
    other = legs.write_spec(tmp_path / "other.yaml", spec_for("dropout-mlp", training={
        "seed": 7}))
    lp = legs.launch(other, "control", run_dir, max_restarts=0)
    assert lp.wait(120) != 0
    assert "belongs to another run" in lp.log.read_text()
    assert os.path.exists(run_dir / "control" / "checkpoints" / "step-00000012")
