"""The models users bring, each qualified on 2 ranks with stock torchrun: the verdict it must
get and, where the truth is a FAIL, the first divergence's tensors and the cause named.

Every model runs ``spec.yaml`` beside this file (6 steps, a checkpoint every 2 steps, rank 1
killed mid-accumulation in step 4, no negative controls), about 40-60 s each on a 2-core
machine; pytest's durations table gives each model's time.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.integration.legs import resumequal

pytestmark = pytest.mark.slow

ZOO = Path(__file__).parent
ROOT = ZOO.parent.parent
LOADER = "workload.loader={workers: 1}"
# Some cases digest with the fingerprint a GPU run picks, on the CPU: their verdicts are
# those of xxh3_128, the CPU's default, which the other cases use.
WSUM = "comparison.digest=wsum128"


@dataclass(frozen=True)
class Case:
    """One model of the zoo and what its qualification must say."""

    workload: str
    sets: tuple[str, ...] = ()
    result: str = "PASS"
    # A FAIL's first divergence: boundary, whether at the restore, the first tensor.
    boundary: str | None = None
    at_restore: bool = False
    first: str | None = None
    differing: tuple[str, ...] = ()
    cause: tuple[str, ...] = ()
    zoom: bool = False
    needs: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _one_copy(checkpoint: str) -> str:
    """How a verdict says that rank-local state was saved once for every rank."""
    return f"differed between the ranks when {checkpoint} was saved; the checkpoint keeps one copy"


CASES = {
    # The user's CNN: BatchNorm statistics differ between the ranks, the checkpoint keeps one
    # copy, and rank 0 resumes with rank 1's. The zoom names the BatchNorm's state.
    "cnn-batchnorm-ddp": Case(
        "tests.zoo.images:cnn", (LOADER, "zoom=onFail", WSUM), "FAIL", "params", True,
        "features.1.running_mean", ("features.1.running_mean", "features.1.running_var"),
        (_one_copy("step-00000002") + " (rank ", "SyncBatchNorm", "before each save", "per rank"),
        zoom=True),
    # A graceful stop saves in the middle of step 4: its buffers, moved by that step's
    # first forward, are held to what each rank recorded saving.
    "cnn-batchnorm-graceful": Case(
        "tests.zoo.images:cnn", (LOADER, "preemption.mode=graceful"), "FAIL", "params", True,
        "features.1.running_mean", ("features.1.running_mean", "features.1.running_var"),
        (_one_copy("step-00000003+1"),)),
    "cnn-batchnorm-synced": Case(
        "tests.zoo.images:cnn", (LOADER, "workload.params.sync_buffers=true")),
    "cnn-batchnorm-fsdp2": Case(
        "tests.zoo.images:cnn", (LOADER, "parallelism.kind=fsdp2", WSUM), "FAIL", "params",
        True,
        "features.1.running_mean", ("features.1.running_mean", "features.1.running_var"),
        (_one_copy("step-00000002"),)),
    "resnet18-ddp": Case(
        "tests.zoo.images:resnet18", (LOADER,), "FAIL", "params", True, "bn1.running_mean",
        cause=(_one_copy("step-00000002"),),
        needs="torchvision"),
    "sync-batchnorm-cuda": Case(
        "tests.zoo.images:cnn", (LOADER, "workload.params.sync_batchnorm=true"),
        needs="cuda"),
    "gpt2-tied-embeddings": Case(
        "hf_causal_lm:build", (LOADER, "workload.params.n_layer=1",
                               "workload.params.seq_len=16"), needs="transformers"),
    "ema-averaged-model": Case("tests.zoo.state:ema"),
    "non-persistent-buffer": Case(
        "tests.zoo.state:non_persistent", (), "FAIL", "params", True, "2.calls", ("2.calls",),
        ("not in the checkpoint (non-persistent", "persistent=True")),
    "weight-norm": Case("tests.zoo.state:weight_normed"),
}


def _missing(need: str | None) -> str | None:
    if need == "cuda" and not torch.cuda.is_available():
        return "SyncBatchNorm runs on CUDA devices only (torch refuses CPU tensors)"
    if need in ("torchvision", "transformers"):
        try:
            __import__(need)
        except ImportError:
            return f"{need} is not installed (pip install 'resumequal[test]')"
    return None


def _run(case: Case, run_dir: Path) -> subprocess.CompletedProcess[str]:
    sets = [a for s in (f"workload.name={case.workload}", *case.sets) for a in ("--set", s)]
    path = os.pathsep.join([str(ROOT), str(ROOT / "examples"),
                            os.environ.get("PYTHONPATH", "")])
    return resumequal("run", "--spec", str(ZOO / "spec.yaml"), "--run-dir", str(run_dir),
                      *sets, env={"PYTHONPATH": path}, timeout=400)


def _qualify(case: Case, run_dir: Path) -> tuple[int, dict[str, Any], str]:
    proc = _run(case, run_dir)
    report = run_dir / "report.json"
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(report.read_text()), proc.stdout


@pytest.mark.parametrize("name", list(CASES))
def test_zoo_model(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    missing = _missing(case.needs)
    if missing is not None:
        pytest.skip(missing)
    code, report, out = _qualify(case, tmp_path / name)
    v = report["verdict"]
    assert v["result"] == case.result, v["reason"]
    assert code == {"PASS": 0, "FAIL": 1}[case.result], out[-2000:]
    assert report["inventory"]["digest"] == ("wsum128" if WSUM in case.sets else "xxh3_128")
    if case.result == "PASS":
        assert v["first_divergence"] is None
        return
    d = v["first_divergence"]
    assert (d["boundary"], d["at_restore"]) == (case.boundary, case.at_restore), d
    assert d["tensors"]["first"] == case.first, d["tensors"]
    if case.differing:
        assert d["tensors"]["differing"] == list(case.differing)
    for words in case.cause:
        assert words in v["reason"], v["reason"]
    if case.zoom:
        zoom = report["zoom"]
        assert zoom is not None and zoom["step"] == d["step"] + 1, zoom
        assert zoom["origin_kind"] == "state", zoom["summary"]
        states = [m["module"] for m in zoom["modules"] if m["kind"] == "state"]
        assert "features.1" in states, zoom["modules"]


def test_another_steps_checkpoint_under_the_expected_name_is_invalid(tmp_path: Path) -> None:
    # Checkpoints after steps 1, 2 and 3; the resume must restore step 3's, and finds step
    # 2's in its place, authenticated: the experiment did not test what it claims.
    run_dir = tmp_path / "planted"
    case = Case("tests.zoo.planted:build", (
        "checkpoint.everySteps=1", "checkpoint.keepLast=3",
        f"workload.params.checkpoints={run_dir / 'preempted' / 'checkpoints'}",
        "workload.params.replace=step-00000003", "workload.params.plant=step-00000002", WSUM))
    code, report, _ = _qualify(case, run_dir)
    v = report["verdict"]
    assert (v["result"], code) == ("INVALID", 3), v["reason"]
    assert v["reason"].startswith("invalid: rank 0 restored a checkpoint named step-00000003 "
                                  "that holds the state of step 2"), v["reason"]
    assert v["first_divergence"] is None


def test_sync_batchnorm_where_the_legs_train_on_the_cpu_is_refused_before_they_start(
        tmp_path: Path) -> None:
    # torch runs SyncBatchNorm on CUDA only: the trial build refuses it (exit 2) with the
    # module and what to do instead, before any leg starts (on CUDA: sync-batchnorm-cuda).
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the legs would train on it")
    case = Case("tests.zoo.images:cnn", (LOADER, "workload.params.sync_batchnorm=true"))
    proc = _run(case, tmp_path / "run")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the model has SyncBatchNorm (features.1), which torch runs on CUDA devices only" \
        in proc.stderr
    assert "sync_buffers_after_step" in proc.stderr
    assert not (tmp_path / "run" / "control").exists()
