"""The workload's trial build: a factory that cannot be imported, raises or hangs is a spec
error (exit 2) before anything launches or is published. Real subprocesses, no training."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from resumequal.local.trial import trial_build
from resumequal.spec import QualificationSpec, SpecError, parse_spec
from tests.integration import legs

pytestmark = pytest.mark.timeout(180)

FACTORIES = '''
import os
import time


def raises(ctx):
    raise ValueError("hidden must be even,\\nnot 7")


def hangs(ctx):
    with open(os.environ["TRIAL_PID_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)
'''

RESULT_FILES = ("run.json", "spec.json", "verdict.json", "report.json", "report.html",
                "metrics.prom")


@pytest.fixture
def factories(tmp_path: Path) -> dict[str, str]:
    """A factory module on the path of every process the CLI starts."""
    (tmp_path / "trial_factories.py").write_text(FACTORIES)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


def _assert_nothing_ran(run_dir: Path) -> None:
    left = [name for name in RESULT_FILES if (run_dir / name).exists()]
    assert left == [] and not run_dir.exists(), sorted(p.name for p in run_dir.iterdir())


def test_a_misspelled_factory_module_is_a_spec_error_before_any_leg(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    name = "tests.set_order_workloadd:build"
    proc = legs.resumequal("run", "--run-dir", str(run_dir), "--set", f"workload.name={name}",
                           "--metrics-file", str(tmp_path / "metrics.prom"), timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith("error: workload.name: "), proc.stderr
    assert repr(name) in proc.stderr
    assert "No module named 'tests.set_order_workloadd'" in proc.stderr
    _assert_nothing_ran(run_dir)
    assert not (tmp_path / "metrics.prom").exists()


@pytest.mark.slow  # two commands, each a Python start with torch and a trial build
def test_a_factory_that_raises_is_a_spec_error_naming_its_last_line(
    tmp_path: Path, factories: dict[str, str]
) -> None:
    run_dir = tmp_path / "run"
    proc = legs.resumequal("run", "--run-dir", str(run_dir),
                           "--set", "workload.name=trial_factories:raises", env=factories,
                           timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == ("error: workload.name 'trial_factories:raises': building the "
                           "workload raised ValueError: not 7\n")
    _assert_nothing_ran(run_dir)
    # validate says the same, and prints no spec.
    spec = legs.write_spec(tmp_path / "spec.yaml", {"workload": {
        "name": "trial_factories:raises"}})
    proc = legs.resumequal("validate", str(spec), env=factories, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert "raised ValueError: not 7" in proc.stderr


@pytest.mark.slow
@pytest.mark.waits
def test_validate_stops_a_factory_that_hangs_and_everything_it_started(
    tmp_path: Path, factories: dict[str, str]
) -> None:
    pid_file = tmp_path / "pid"
    # The limit leaves the trial process time to import torch and reach the factory on a
    # loaded machine: the factory's own process is what must be stopped.
    spec = legs.write_spec(tmp_path / "spec.yaml", {
        "workload": {"name": "trial_factories:hangs"}, "timeouts": {"buildSeconds": 20}})
    started = time.monotonic()
    proc = legs.resumequal("validate", str(spec), timeout=120,
                           env={**factories, "TRIAL_PID_FILE": str(pid_file)})
    took = time.monotonic() - started
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == ("error: workload.name 'trial_factories:hangs': the trial build did "
                           "not finish within 20 s (timeouts.buildSeconds)\n")
    assert took < 20 + 30  # the limit, and the command's own start
    assert not Path(f"/proc/{pid_file.read_text()}").exists()


@pytest.mark.parametrize("workload", ["dropout-mlp", "tiny-gpt"])
def test_the_built_in_workloads_build(workload: str) -> None:
    seconds = trial_build(parse_spec({"workload": {"name": workload}}))
    assert 0 < seconds < 60


def test_bad_parameters_of_a_built_in_workload_are_found_by_the_trial_build() -> None:
    spec = QualificationSpec.model_validate({"workload": {"params": {"hiden": 3}}})
    with pytest.raises(SpecError, match=r"workload\.params\.hiden: unknown parameter"):
        trial_build(spec)
