"""A sample of the specs the verdict property draws (tests/unit/test_spec_verdicts.py), run
for real: `resumequal run` with real legs and kills ends each in the verdict the synthetic
traces did — a boundary subset, a subset of the controls with a graceful cut
mid-accumulation, and tolerance mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration import legs
from tests.integration.legs import FORKED
from tests.integration.test_run import _resumequal

pytestmark = pytest.mark.slow

# Small: 6 steps of dropout-mlp on 2 ranks, cut in step 3, resumed from step 2.
BASE: dict[str, Any] = {
    "workload": {"name": "dropout-mlp"},
    "training": {"steps": 6, "accumulationSteps": 2},
    "checkpoint": {"everySteps": 2},
    "preemption": {"step": 3, "microstep": 1, "rank": 1, "mode": "hard"},
    "timeouts": {"armSeconds": 60, "processGroupSeconds": 90},
}
SAMPLES: dict[str, dict[str, Any]] = {
    # Only what the optimizer takes is compared; fresh RNGs change the dropout, and so it.
    "clipped-only": {"comparison": {"boundaries": ["clipped_grads"]},
                     "controls": {"omissions": ["rng"]}},
    # A graceful stop mid-accumulation: its emergency checkpoint holds pending gradients.
    "graceful-controls": {"preemption": {"mode": "graceful"},
                          "controls": {"omissions": ["pending_grads", "data_cursor"]}},
    "tolerance": {"comparison": {"mode": "tolerance",
                                 "tolerances": {"loss": 1e-6, "params": 1e-6}},
                  "controls": {"omissions": ["scheduler"]}},
}


def _spec(sample: dict[str, Any]) -> dict[str, Any]:
    spec = {section: dict(fields) for section, fields in BASE.items()}
    for section, fields in sample.items():
        spec.setdefault(section, {}).update(fields)
    return spec


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(SAMPLES))
def test_a_drawn_spec_ends_in_its_verdict_for_real(name: str, tmp_path: Path) -> None:
    spec_file = legs.write_spec(tmp_path / "spec.yaml", _spec(SAMPLES[name]))
    run_dir = tmp_path / "run"
    proc = _resumequal("run", "--spec", str(spec_file), "--run-dir", str(run_dir), *FORKED)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # PASS
    verdict = json.loads((run_dir / "report.json").read_text())["verdict"]
    assert verdict["result"] == "PASS", verdict["reason"]
    assert verdict["first_divergence"] is None
    statuses = {c["omission"]: c["status"] for c in verdict["controls"]}
    assert statuses == dict.fromkeys(SAMPLES[name]["controls"]["omissions"], "detected")
    if name == "clipped-only":
        assert verdict["reason"].startswith(
            "equal on the compared boundaries (clipped_grads) of 6 steps on 2 ranks")
