"""`resumequal run` in bf16 and fp16: real torchrun legs on gloo, 2 ranks, CPU autocast,
cut mid-accumulation (step 6, microbatch 1), hard and graceful kills. bf16's cells are in
the stack matrix (test_matrix.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.integration import legs

pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", [pytest.param("hard", marks=pytest.mark.matrix), "graceful"])
def test_fp16_resumes_exactly_and_a_resume_without_the_scaler_is_caught(
    tmp_path: Path, mode: str
) -> None:
    run_dir = tmp_path / "run"
    # tiny-gpt, the default workload: autocast reaches its attention and MLP matmuls.
    report, out = legs.qualify(run_dir, "training.precision=fp16", f"preemption.mode={mode}",
                               "controls.omissions=[scaler]", launcher=legs.FORKED)
    verdict = report["verdict"]
    legs.assert_exact(verdict, mode)
    # The scale grew every 2 steps and backed off on an overflow (a skipped update): both
    # paths ran before and after the cut.
    steps = legs.records(run_dir, "control", "step", (0,))
    scales = [r["loss_scale"]["scale"] for r in steps]
    assert scales[:5] == [65536.0, 65536.0, 131072.0, 131072.0, 262144.0]
    backoffs = [s for s, (a, b) in enumerate(itertools.pairwise(scales), 2) if b < a]
    assert backoffs and backoffs[0] > 6
    assert any(r["grad_norm"] == "Infinity" for r in steps)

    (control,) = verdict["controls"]
    assert (control["omission"], control["leg"], control["status"]) == (
        "scaler", "nc-scaler", "detected")
    first = control["first_divergence"]
    # Resumed with a fresh scaler: the first resumed step runs at the initial scale.
    resumed_step = 5 if mode == "hard" else 6
    assert (first["step"], first["boundary"]) == (resumed_step, "loss_scale")
    assert first["preempted"] == "{'scale': 65536.0, 'growth_tracker': 0}"
    assert control["mechanism"].startswith(
        f"loss scale differed from step {resumed_step} (rank 0); ")
    assert "1 of 1 applicable controls detected" in out
