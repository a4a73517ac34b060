"""Negative controls, positive scenarios across seeds, and the DDP reducer prime."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from resumequal.run.signing import KEY_ENV, new_key
from tests.integration.legs import FORKED, records
from tests.integration.test_run import _resumequal

pytestmark = pytest.mark.slow

MLP = ["--set", "workload.name=dropout-mlp"]


def _report(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "report.json").read_text())  # type: ignore[no-any-return]


def _controls(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["omission"]: c for c in report["verdict"]["controls"]}


def test_a_blind_comparator_makes_the_qualification_invalid(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Looking only at the sample ids, a resume with fresh RNGs looks perfect.
    proc = _resumequal("run", "--run-dir", str(run_dir), *FORKED, *MLP,
                       "--set", "comparison.boundaries=[inputs]",
                       "--set", "controls.omissions=[rng]")
    assert proc.returncode == 3, proc.stdout + proc.stderr  # INVALID
    verdict = _report(run_dir)["verdict"]
    assert verdict["result"] == "INVALID"
    assert "comparator blind to rng" in verdict["reason"]
    (rng,) = verdict["controls"]
    assert rng["status"] == "blind"


def test_a_workload_without_randomness_reports_the_rng_control_not_applicable(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--run-dir", str(run_dir), *FORKED, *MLP,
                       "--set", "workload.params={dropout: 0.0, augment: false}",
                       "--set", "controls.omissions=[rng, scheduler]")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    controls = _controls(_report(run_dir))
    assert controls["rng"]["status"] == "not_applicable"
    assert "RNG states never advanced" in controls["rng"]["evidence"]
    assert controls["scheduler"]["status"] == "detected"


def _ddp_spec(prime: bool) -> list[str]:
    # Three ranks and small buckets: gloo sums one bucket and several buckets in different
    # orders, so a layout change shows up in the reduced gradients' bits.
    return [*MLP, "--set", "world.nproc_per_node=3",
            "--set", "workload.params={hidden: 256, in_features: 64}",
            "--set", "ddp.bucket_cap_mb=0.05", "--set", f"ddp.reducer_prime={str(prime).lower()}",
            "--set", "controls.enabled=false"]


@pytest.mark.timeout(600)
def test_without_the_reducer_prime_three_ranks_fail_at_the_bucket_layout(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--run-dir", str(run_dir), *FORKED, *_ddp_spec(prime=False),
                       "--set", "zoom=onFail", timeout=540, env={KEY_ENV: new_key()})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    verdict = _report(run_dir)["verdict"]
    first = verdict["first_divergence"]
    assert first["boundary"] == "bucket_layout"
    # The first resumed step: a fresh reducer still has its initial buckets.
    assert first["step"] == 5
    row = next(r for r in verdict["boundary_table"] if r["step"] == 5)["status"]
    assert row["local_grads"] == "equal"
    assert row["reduced_grads"] == "differs"
    # Every tensor boundary of that step and rank, by tensor: the local gradients all equal,
    # a count of reduced gradients that differ, exactly what the per-tensor digests say.
    rank = first["rank"]
    control, resumed = (
        next(r for r in _steps(run_dir / leg, rank) if r["step"] == 5
             and r["attempt"] == (0 if leg == "control" else 1))["tensors"]
        for leg in ("control", "preempted"))
    expected = sum(control["reduced_grads"][n] != resumed["reduced_grads"][n]
                   for n in control["reduced_grads"])
    tensors = first["step_tensors"]
    assert tensors["local_grads"]["differ"] == 0
    assert tensors["reduced_grads"]["differ"] == expected > 0
    assert tensors["reduced_grads"]["total"] == len(control["reduced_grads"])
    # Both layouts: the mature reducer's buckets and the fresh one's.
    layouts = first["buckets"]
    assert len(layouts["control"]) > 1 and layouts["control"] != layouts["preempted"]
    assert sorted(p for b in layouts["preempted"] for p in b["params"]) == sorted(
        p for b in layouts["control"] for p in b["params"])
    # Replayed with every module hooked: the modules and the rank-local gradients are
    # equal on every rank, and the difference starts in the reduction.
    zoom = _report(run_dir)["zoom"]
    assert all(r["reproduced"] for r in zoom["replays"]), zoom["replays"]
    assert zoom["modules"] == [] and zoom["origin_kind"] == "reduction"
    stages = {s["name"]: s for s in zoom["stages"]}
    assert stages["local_grads"]["differ"] == 0 and stages["reduced_grads"]["differ"] > 0
    on_rank = [t for t in stages["reduced_grads"]["tensors"] if t["rank"] == rank]
    assert len(on_rank) == expected
    assert zoom["buckets"] is not None
    assert len(zoom["buckets"]["control"]) == len(layouts["control"])
    assert len(zoom["buckets"]["preempted"]) == len(layouts["preempted"])


@pytest.mark.timeout(600)
def test_with_the_reducer_prime_three_ranks_resume_exactly(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--run-dir", str(run_dir), *FORKED, *_ddp_spec(prime=True),
                       timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdict = _report(run_dir)["verdict"]
    assert verdict["result"] == "PASS"
    layouts = {len(r["buckets"]) for r in _steps(run_dir / "control", 0)}
    assert min(layouts) > 1  # several buckets, really


def _steps(leg_dir: Path, rank: int) -> list[dict[str, Any]]:
    return records(leg_dir.parent, leg_dir.name, "step", (rank,))


@pytest.mark.timeout(1200)
def test_seed_matrix_over_two_seeds_for_the_default_workload(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Two seeds and two of the four scenarios keep CI short; each is a real kill and
    # restart per seed.
    seeds, scenarios = (11, 83), ["boundary-graceful", "mid-hard"]
    proc = _resumequal("run", "--run-dir", str(run_dir), *FORKED, "--set", "controls.enabled=false",
                       "--set", f"matrix.seeds=[{', '.join(map(str, seeds))}]",
                       "--set", f"matrix.scenarios=[{', '.join(scenarios)}]", timeout=1100)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    matrix = _report(run_dir)["matrix"]
    assert matrix["seeds"] == list(seeds)
    assert len(matrix["cells"]) == len(seeds) * len(scenarios)
    assert {r["scenario"]: (r["exact"], r["total"]) for r in matrix["summary"]} == {
        s: (len(seeds), len(seeds)) for s in scenarios}
    html = (run_dir / "report.html").read_text()
    assert "Seed matrix" in html
    for seed in seeds:
        # Each seed trained its own control: the last step's losses differ between seeds.
        assert (run_dir / f"seed-{seed}" / "boundary-graceful" / "trace").is_dir()
    last_losses = {
        _steps(run_dir / f"seed-{seed}" / "control", 0)[-1]["microsteps"][0]["loss"]
        for seed in seeds
    }
    assert len(last_losses) == len(seeds)
