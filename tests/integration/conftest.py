"""Integration fixtures: real torchrun legs, cleaned up whatever happens."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import legs

BASE: dict[str, Any] = {
    "training": {"steps": 12, "accumulation_steps": 3},
    "checkpoint": {"every_steps": 4, "keep_last": 4},
    "preemption": {"step": 6, "microstep": 1, "rank": 1, "mode": "hard"},
    "timeouts": {"arm_seconds": 60, "process_group_seconds": 90},
}


def spec_for(workload: str, **overrides: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {k: dict(v) for k, v in BASE.items()}
    spec["workload"] = {"name": workload}
    for section, values in overrides.items():
        spec.setdefault(section, {}).update(values)
    return spec


@pytest.fixture(autouse=True)
def _no_orphans() -> Iterator[None]:
    yield
    while legs.RUNNING:
        legs.RUNNING.pop().kill()


class ControlRuns:
    """Runs one uninterrupted control leg per reference workload, on first use."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.runs: dict[str, Path] = {}

    def __call__(self, workload: str) -> Path:
        if workload not in self.runs:
            run_dir = self.factory.mktemp(f"control-{workload}")
            spec = legs.write_spec(run_dir / "spec.yaml", spec_for(workload))
            legs.run_leg(spec, "control", run_dir)
            self.runs[workload] = run_dir
        return self.runs[workload]


@pytest.fixture(scope="session")
def control_run(tmp_path_factory: pytest.TempPathFactory) -> ControlRuns:
    return ControlRuns(tmp_path_factory)
