"""`resumequal run` with compile.enabled and the cache policies other than ``shared`` (the
default, which the stack matrix runs in every cell it compiles): real torchrun legs on
gloo, 2 ranks, tiny-gpt under DDP, cut mid-accumulation (step 6, microbatch 1) by a hard
kill, controls off."""

from __future__ import annotations

from pathlib import Path

import pytest

from resumequal.run.location import RunLocation, default_scratch
from resumequal.train.compiling import CACHE_FOLDER
from tests.integration import legs

pytestmark = [pytest.mark.slow, pytest.mark.matrix]


def _run(run_dir: Path, *sets: str) -> None:
    report, _ = legs.qualify(run_dir, "compile.enabled=true", "controls.enabled=false", *sets,
                             timeout=560)
    verdict = report["verdict"]
    assert verdict["result"] == "PASS", verdict["reason"]
    assert verdict["reason"].startswith("exact: every boundary of 12 steps on 2 ranks equal")
    assert verdict["resumed_from"] == "step-00000004"


@pytest.mark.timeout(600)
def test_fresh_processes_under_max_autotune_compile_cold_and_still_resume_exactly(
        tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run(run_dir, "compile.cache=fresh", "compile.mode=max-autotune")
    folders = set()
    for leg in ("control", "preempted"):
        for rank in (0, 1):
            inventories = legs.records(run_dir, leg, "inventory", (rank,))
            assert not any(r["compile"]["warm"] for r in inventories)
            folders |= {r["compile"]["cache_dir"] for r in inventories}
            compiled = legs.records(run_dir, leg, "compiled", (rank,))
            assert {r["attempt"] for r in compiled} == {r["attempt"] for r in inventories}
            # Every process compiled every graph itself (same-shaped graphs of one process
            # may hit what it just wrote) ...
            for attempt in {r["attempt"] for r in compiled}:
                assert sum(r["fx_cache_misses"] for r in compiled if r["attempt"] == attempt)
            # ... and on CPU max-autotune benchmarked nothing: the training graphs' matmuls
            # are ATen calls, so a cold process had no kernel choice to make differently.
            assert all(r["autotuned"] == [] for r in compiled)
    assert len(folders) == 6  # one folder per process: 2 control, 2 + 2 preempted


@pytest.mark.timeout(400)
def test_per_rank_caches_are_warm_for_the_same_rank_of_a_later_leg(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    _run(run_dir, "compile.cache=per-rank")
    for rank in (0, 1):
        folder = str((default_scratch(RunLocation.open(str(run_dir)).uri) / CACHE_FOLDER
                      / f"rank-{rank}").resolve())
        control = legs.records(run_dir, "control", "inventory", (rank,))
        preempted = legs.records(run_dir, "preempted", "inventory", (rank,))
        assert all(r["compile"]["cache_dir"] == folder for r in control + preempted)
        assert not control[0]["compile"]["warm"]
        assert all(r["compile"]["warm"] for r in preempted)
        assert all(r["fx_cache_misses"] == 0
                   for r in legs.records(run_dir, "preempted", "compiled", (rank,)))
