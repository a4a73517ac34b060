"""The stack matrix: `resumequal run` over parallelism x precision x compile x kill mode, real
torchrun legs on gloo, 2 ranks, the default workload (tiny-gpt), cut mid-accumulation (step
6, microbatch 1). Every cell must PASS exact; the negative controls of each new state
(scaler, loader, pending gradients, sharded optimizer) have tests of their own.

The default run keeps representative cells; the others are marked ``matrix`` (``pytest -m
matrix tests/integration/test_matrix.py`` runs them all)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from resumequal.run.location import RunLocation, default_scratch
from resumequal.train.compiling import CACHE_FOLDER
from tests.integration import legs

pytestmark = pytest.mark.slow

# (parallelism, precision, compiled, mode)
CELLS = [
    (kind, precision, compiled, mode)
    for kind, precision, compiled in [
        ("fsdp2", "fp32", False), ("fsdp2", "bf16", False),
        ("fsdp2", "fp32", True), ("fsdp2", "bf16", True),
        ("ddp", "bf16", False), ("ddp", "fp32", True),
    ]
    for mode in ("hard", "graceful")
]
# fsdp2 fp32 eager graceful runs by default as the main leg of the pending_grads control's
# test (test_fsdp2.py), which requires the same exact PASS.
# One compiled cell (DDP, whose compile runs in the reducer prime) keeps the default run
# within its time; the FSDP2 compiled cells run with -m matrix.
DEFAULT = {
    ("fsdp2", "bf16", False, "hard"),
    ("ddp", "bf16", False, "hard"),
    ("ddp", "fp32", True, "hard"),
}


def _cell(kind: str, precision: str, compiled: bool, mode: str) -> Any:
    marks = [] if (kind, precision, compiled, mode) in DEFAULT else [pytest.mark.matrix]
    name = f"{kind}-{precision}-{'compile' if compiled else 'eager'}-{mode}"
    return pytest.param(kind, precision, compiled, mode, marks=marks, id=name)


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("kind", "precision", "compiled", "mode"),
                         [_cell(*c) for c in CELLS])
def test_the_cell_resumes_exactly_mid_accumulation(
        tmp_path: Path, kind: str, precision: str, compiled: bool, mode: str) -> None:
    run_dir = tmp_path / "run"
    sets = [f"parallelism.kind={kind}", f"training.precision={precision}",
            f"compile.enabled={str(compiled).lower()}", f"preemption.mode={mode}",
            "controls.enabled=false"]
    # A compiled cell runs stock torchrun: inductor reads its caches and settings from the
    # environment a worker starts with.
    launcher = () if compiled else legs.FORKED
    report, _ = legs.qualify(run_dir, *sets, launcher=launcher, timeout=400)
    verdict = report["verdict"]
    legs.assert_exact(verdict, mode)
    assert verdict["cut"]["mode"] == mode

    leg_spec = json.loads((run_dir / "legs" / "preempted.spec.json").read_text())["spec"]
    assert leg_spec["parallelism"]["kind"] == kind
    assert leg_spec["training"]["precision"] == precision
    for rank in (0, 1):
        steps = legs.records(run_dir, "control", "step", (rank,))
        # No scaler outside fp16: the loss_scale boundary is absent from every step.
        assert all(r["loss_scale"] is None for r in steps)
        if kind == "fsdp2":  # no buckets: fixed reduce-scatter groups
            assert all(r["bucket_layout"] is None and r["buckets"] == [] for r in steps)
    if kind == "fsdp2":  # each rank holds its own shard: their parameter digests differ
        assert legs.records(run_dir, "control", "step", (0,))[-1]["params"] != \
            legs.records(run_dir, "control", "step", (1,))[-1]["params"]

    if compiled:
        # In the run's private scratch, never the run folder; it goes with the run.
        shared = str((default_scratch(RunLocation.open(str(run_dir)).uri) / CACHE_FOLDER
                      / "shared").resolve())
        assert not (run_dir / CACHE_FOLDER).exists() and not Path(shared).exists()
        for rank in (0, 1):
            control = legs.records(run_dir, "control", "inventory", (rank,))
            preempted = legs.records(run_dir, "preempted", "inventory", (rank,))
            assert [r["attempt"] for r in preempted] == [0, 1]
            assert all(r["compile"]["cache_dir"] == shared for r in control + preempted)
            # The control leg compiles cold; every preempted process finds the cache warm.
            assert not control[0]["compile"]["warm"]
            assert all(r["compile"]["warm"] for r in preempted)
            # ... and loads every graph from it: nothing compiled afresh, nothing autotuned.
            loaded = legs.records(run_dir, "preempted", "compiled", (rank,))
            assert sorted({r["attempt"] for r in loaded}) == [0, 1]
            assert all(r["fx_cache_hits"] > 0 and r["fx_cache_misses"] == 0
                       and r["autotuned"] == [] for r in loaded)
        cold = legs.records(run_dir, "control", "compiled")
        assert sum(r["fx_cache_misses"] for r in cold) > 0
        report = json.loads((run_dir / "report.json").read_text())
        by_leg = {leg["name"]: leg["compiled"] for leg in report["legs"]}
        assert [c["attempt"] for c in by_leg["preempted"]] == [0, 1]
        assert by_leg["control"][0]["seconds"] > by_leg["preempted"][1]["seconds"] > 0
    else:
        assert all(r["compile"] is None
                   for r in legs.records(run_dir, "control", "inventory", (0,)))
