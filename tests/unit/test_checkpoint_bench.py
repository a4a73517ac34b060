"""bench/checkpoint_scale.py's correctness path at a few MB, in this process (rank 0 of a
world-1 gloo group): every save and cold restore it times — resumequal's, plain DCP's and
the copy path of before issue 38 — gives back the saved state, and the report prints."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.usefixtures("single_process_group")

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("checkpoint_scale")
    finally:
        sys.path.remove(str(BENCH))


def test_every_timed_restore_gives_back_the_saved_state(bench: Any, tmp_path: Path) -> None:
    cfg = bench.Config(d_model=64, layers=2, heads=2, vocab=512, seq=16, ranks=1, rounds=2,
                       head=True)
    figures = bench.measure(cfg, tmp_path)  # check_same raises on any difference
    assert 1_000_000 < figures["bytes"] < 10_000_000
    (rounds,) = figures["ranks"]
    assert len(rounds) == 2
    for op in ("rq_save", "dcp_save", "head_save", "rq_load", "dcp_load", "head_load"):
        assert all(r[f"{op}_s"] > 0 for r in rounds), op
    report = bench.report(cfg, figures)
    assert "restore (cold)" in report and "before #38" in report


def test_a_restore_that_differs_is_caught(bench: Any) -> None:
    state = bench.build_state(bench.Config(d_model=8, layers=1, heads=1, vocab=16, seq=4))
    other = bench._map(state, lambda t: t.clone())
    other["model"]["head.bias"][0] += 1
    with pytest.raises(AssertionError, match="x: the restored state differs"):
        bench.check_same(other, state, "x")
