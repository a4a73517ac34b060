"""Data through torchdata's StatefulDataLoader with worker processes: a stream's resume
with and without the workers' RNGs, and (slow) `resumequal run` of a built-in workload and
of the Hugging Face example, each killed mid-accumulation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from resumequal.workloads.dropout_mlp import DropoutMLPParams, GaussianClasses
from resumequal.workloads.loader import LoaderStream, SampleDataset
from tests.integration import legs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _verdict(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report.json").read_text())["verdict"]  # type: ignore[no-any-return]


def _controls(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["omission"]: c for c in verdict["controls"]}


class _Plain(Dataset[tuple[Any, ...]]):
    """The same samples without the dataset's state: workers' RNGs are not snapshotted."""

    def __init__(self, inner: SampleDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        return self.inner[index]


def _augmenting_stream(stateful: bool) -> LoaderStream:
    samples = SampleDataset(400, GaussianClasses(DropoutMLPParams(), seed=3))
    dataset: Dataset[tuple[Any, ...]] = samples if stateful else _Plain(samples)
    sampler: DistributedSampler[int] = DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=True, seed=1, drop_last=True)
    return LoaderStream(StatefulDataLoader(dataset, batch_size=4, sampler=sampler,
                                           num_workers=2, persistent_workers=True))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stateful", [True, False], ids=["stateful", "plain"])
def test_worker_augmentation_resumes_only_with_the_workers_rng_in_the_state(
        stateful: bool) -> None:
    torch.manual_seed(0)
    stream = _augmenting_stream(stateful)
    for _ in range(5):
        stream.next_microbatch()
    cursor = json.loads(json.dumps(stream.state_dict()))
    loader = json.loads(json.dumps(stream.loader_state_dict()))
    expected = [stream.next_microbatch() for _ in range(3)]

    torch.manual_seed(0)
    resumed = _augmenting_stream(stateful)
    resumed.load_state_dict(cursor)
    resumed.load_loader_state_dict(loader)
    got = [resumed.next_microbatch() for _ in range(3)]
    # The loader's state always brings the same samples back...
    assert [m.sample_ids for m in got] == [m.sample_ids for m in expected]
    # ...but a worker's augmentation draws from RNGs seeded afresh unless the dataset's
    # state carries them.
    same = [torch.equal(a.data[0], b.data[0]) for a, b in zip(got, expected, strict=True)]
    assert same == [stateful] * 3


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_builtin_through_two_loader_workers_resumes_exactly(tmp_path: Path) -> None:
    # dropout-mlp augments each sample from the global RNGs: in a worker those are the
    # worker's own, which resume exactly only because the dataset's state carries them.
    run_dir = tmp_path / "run"
    proc = legs.resumequal(
        "run", "--run-dir", str(run_dir),
        "--set", "workload.name=dropout-mlp", "--set", "workload.loader.workers=2",
        "--set", "preemption.mode=hard", "--set", "preemption.microstep=1",
        "--set", "controls.omissions=[loader_state]", timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = _verdict(run_dir)
    assert verdict["result"] == "PASS"
    assert verdict["exact_through_step"] == 12
    control = _controls(verdict)["loader_state"]
    assert control["status"] == "detected", control
    # Resumed from step 4, the loader starts its epoch over: step 5 reads other samples.
    first = control["first_divergence"]
    assert (first["step"], first["boundary"]) == (5, "inputs"), control


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_hugging_face_example_passes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    path = os.pathsep.join(p for p in (str(EXAMPLES), os.environ.get("PYTHONPATH")) if p)
    proc = legs.resumequal(
        "run", "--spec", str(EXAMPLES / "hf_causal_lm.yaml"), "--run-dir", str(run_dir),
        "--set", "controls.omissions=[loader_state]",
        env={"PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        timeout=560)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = _verdict(run_dir)
    assert verdict["result"] == "PASS"
    assert verdict["exact_through_step"] == 12
    assert _controls(verdict)["loader_state"]["status"] == "detected"
    spec = json.loads((run_dir / "spec.json").read_text())
    assert spec["workload"]["loader"]["workers"] == 2
