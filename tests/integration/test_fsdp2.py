"""`resumequal run` with parallelism.kind fsdp2 and its negative controls: real torchrun legs
on gloo, 2 ranks, the default workload (tiny-gpt, each transformer block and the root
fully_shard-ed), cut mid-accumulation (step 6, microbatch 1). The plain cells (fp32, bf16,
compiled, hard and graceful) are in the stack matrix (test_matrix.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration import legs

pytestmark = pytest.mark.slow


def _run(run_dir: Path, *sets: str) -> dict[str, Any]:
    report, _ = legs.qualify(run_dir, "parallelism.kind=fsdp2", *sets, launcher=legs.FORKED)
    verdict: dict[str, Any] = report["verdict"]
    return verdict


@pytest.mark.timeout(300)
def test_fsdp2_graceful_mid_accumulation_resumes_exactly_and_its_controls_are_caught(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    # One run, two controls: the pending gradients the emergency checkpoint carries, and
    # the sharded optimizer state; digested as a GPU run would be (wsum128, local shards).
    verdict = _run(run_dir, "preemption.mode=graceful",
                   "controls.omissions=[pending_grads, optimizer]", "comparison.digest=wsum128")
    legs.assert_exact(verdict, "graceful")
    controls = {c["omission"]: c for c in verdict["controls"]}
    assert {(name, c["leg"], c["status"]) for name, c in controls.items()} == {
        ("pending_grads", "nc-pending-grads", "detected"),
        ("optimizer", "nc-optimizer", "detected")}
    # Seen first at the rank-local gradients fed into the reduce-scatter of the cut step.
    pending = controls["pending_grads"]["first_divergence"]
    assert (pending["step"], pending["boundary"]) == (6, "local_grads")
    # The model's shards were restored (the restore check passed); a fresh optimizer's param
    # groups hold the initial learning rate, where the scheduler had moved the saved one:
    # the update that ends the resumed step 6 uses another lr, then has no Adam moments.
    optimizer = controls["optimizer"]
    assert (optimizer["first_divergence"]["step"],
            optimizer["first_divergence"]["boundary"]) == (6, "lr")
    assert "parameters from step 6" in optimizer["mechanism"]
    assert {r["digest"] for r in legs.records(run_dir, "preempted", "inventory")} == {"wsum128"}
    restores = legs.records(run_dir, "nc-optimizer", "restore")
    assert [(r["omitted"], r["checkpoint"]) for r in restores] == [
        (["optimizer"], "step-00000005+1")] * 2


@pytest.mark.matrix
@pytest.mark.timeout(300)
def test_fsdp2_fp16_resumes_exactly_and_a_resume_without_the_scaler_is_caught(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    verdict = _run(run_dir, "training.precision=fp16", "controls.omissions=[scaler]")
    legs.assert_exact(verdict, "hard")
    (control,) = verdict["controls"]
    assert (control["omission"], control["status"]) == ("scaler", "detected")
    # The ranks agree on every scale, backoffs (skipped updates) included: the inf check
    # over sharded gradients is agreed across ranks.
    scales = [[r["loss_scale"]["scale"] for r in legs.records(run_dir, "control", "step", (rank,))]
              for rank in (0, 1)]
    assert scales[0] == scales[1]
    assert any(b < a for a, b in zip(scales[0], scales[0][1:], strict=False))
