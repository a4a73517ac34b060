"""`resumequal run` with data through torchdata's StatefulDataLoader and worker processes:
a built-in workload and the Hugging Face example, each killed mid-accumulation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.integration import legs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _verdict(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report.json").read_text())["verdict"]  # type: ignore[no-any-return]


def _controls(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["omission"]: c for c in verdict["controls"]}


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
