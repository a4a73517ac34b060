"""`resumequal run` with compile.enabled: real torchrun legs on gloo, 2 ranks, tiny-gpt
compiled by inductor's C++ backend (the whole model inside DDP, or each block under FSDP2),
cut mid-accumulation (step 6, microbatch 1) by a hard kill. Inductor's cache is shared (the
default policy): the control leg's ranks compile cold, every process of the preempted leg,
the resumed one included, finds the cache warm."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from resumequal.runstore import RunLocation
from resumequal.train.compiling import CACHE_FOLDER
from tests.integration import legs

pytestmark = pytest.mark.slow


def _inventories(run_dir: Path, leg: str, rank: int) -> list[dict[str, Any]]:
    records = RunLocation.open(str(run_dir)).trace_records(leg, rank)
    return [r for r in records if r["kind"] == "inventory"]


@pytest.mark.timeout(330)
@pytest.mark.parametrize("kind", ["ddp", pytest.param("fsdp2", marks=pytest.mark.matrix)])
def test_a_compiled_model_resumes_exactly_after_a_hard_kill_mid_accumulation(
        tmp_path: Path, kind: str) -> None:
    run_dir = tmp_path / "run"
    proc = legs.resumequal("run", "--run-dir", str(run_dir), "--set", "compile.enabled=true",
                           "--set", f"parallelism.kind={kind}",
                           "--set", "controls.enabled=false", timeout=310)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict: dict[str, Any] = json.loads((run_dir / "report.json").read_text())["verdict"]
    assert verdict["result"] == "PASS", verdict["reason"]
    assert verdict["reason"].startswith("exact: every boundary of 12 steps on 2 ranks equal")
    assert (verdict["exact_through_step"], verdict["resumed_from"]) == (12, "step-00000004")
    shared = str((run_dir / CACHE_FOLDER / "shared").resolve())
    assert (Path(shared) / "fxgraph").is_dir()  # inductor wrote its graphs where we said
    for rank in (0, 1):
        control = _inventories(run_dir, "control", rank)
        preempted = _inventories(run_dir, "preempted", rank)
        assert [r["attempt"] for r in preempted] == [0, 1]
        for record in control + preempted:
            assert record["compile"]["mode"] == "default"
            assert (record["compile"]["cache"], record["compile"]["cache_dir"]) == (
                "shared", shared)
        assert not control[0]["compile"]["warm"]
        assert all(r["compile"]["warm"] for r in preempted)
