"""Unit tests for the ``resumequal`` command line, through click's CliRunner."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from resumequal import cli
from resumequal.spec import OMISSIONS, QualificationSpec
from resumequal.train import worker

Calls = list[tuple[QualificationSpec, str, Path, frozenset[str]]]


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def run_leg_calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    """Replace the training entry so no process group is ever created; record its calls."""
    calls: Calls = []

    def fake_run_leg(
        spec: QualificationSpec, leg: str, run_dir: str, omit: frozenset[str]
    ) -> int:
        calls.append((spec, leg, run_dir, omit))
        return 143 if leg == "preempted" else 0

    monkeypatch.setattr(worker, "run_leg", fake_run_leg)
    return calls


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


# --- validate --------------------------------------------------------------------------------


def test_validate_prints_the_spec_with_defaults_filled(
    runner: CliRunner, tmp_path: Path, trial_builds: list[str]
) -> None:
    path = _write(tmp_path / "spec.yaml", {"training": {"steps": 8}, "preemption": {"step": 7}})
    result = runner.invoke(cli.main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert trial_builds == ["tiny-gpt"]  # its workload was built once, before it was printed
    printed = json.loads(result.stdout)
    assert printed["training"]["steps"] == 8
    assert printed["preemption"]["step"] == 7
    # Everything not written in the file comes back with its default.
    defaults = QualificationSpec().model_dump(mode="json")
    assert printed["world"] == defaults["world"]
    assert printed["training"]["optimizer"] == defaults["training"]["optimizer"]
    assert set(printed) == set(defaults)
    assert QualificationSpec.model_validate(printed).training.steps == 8


def test_validate_bad_file_exits_2_naming_the_field(runner: CliRunner, tmp_path: Path) -> None:
    path = _write(tmp_path / "spec.yaml", {"world": {"backend": "mpi"}})
    result = runner.invoke(cli.main, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"error: {path}: world.backend: ")
    assert "'gloo'" in result.stderr


def test_validate_missing_file_exits_2(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(cli.main, ["validate", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2
    assert "spec file not found" in result.stderr
    assert "missing.yaml" in result.stderr


def test_validate_binary_file_exits_2_not_1(runner: CliRunner, tmp_path: Path) -> None:
    # Exit 1 means FAIL for this CLI; an unreadable spec must be an error (2), not a crash.
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"\xff\xfe\x80")
    result = runner.invoke(cli.main, ["validate", str(path)])
    assert result.exit_code == 2
    assert "not valid YAML/JSON" in result.stderr


# --- leg -------------------------------------------------------------------------------------


def test_leg_missing_spec_fails_before_training(
    runner: CliRunner, tmp_path: Path, run_leg_calls: Calls
) -> None:
    result = runner.invoke(cli.main, [
        "leg", "--spec", str(tmp_path / "nope.yaml"), "--leg", "control",
        "--run-dir", str(tmp_path / "run"),
    ])
    assert result.exit_code == 2
    assert f"error: spec file not found: {tmp_path / 'nope.yaml'}" in result.stderr
    assert run_leg_calls == []
    assert not (tmp_path / "run").exists()


def test_leg_invalid_spec_fails_before_training(
    runner: CliRunner, tmp_path: Path, run_leg_calls: Calls
) -> None:
    path = _write(tmp_path / "spec.yaml", {"preemption": {"rank": 5}})
    result = runner.invoke(cli.main, [
        "leg", "--spec", str(path), "--leg", "preempted", "--run-dir", str(tmp_path / "run"),
    ])
    assert result.exit_code == 2
    assert "preemption.rank=5 does not exist in a world of 2" in result.stderr
    assert run_leg_calls == []


def test_leg_passes_spec_leg_dir_and_omissions_and_returns_the_code(
    runner: CliRunner, tmp_path: Path, run_leg_calls: Calls
) -> None:
    path = _write(tmp_path / "spec.yaml", {"training": {"seed": 7}})
    result = runner.invoke(cli.main, [
        "leg", "--spec", str(path), "--leg", "preempted", "--run-dir", str(tmp_path / "run"),
        "--omit", "rng", "--omit", "scheduler",
    ])
    assert result.exit_code == 143
    ((spec, leg, run_dir, omit),) = run_leg_calls
    assert spec.training.seed == 7
    assert (leg, run_dir, omit) == ("preempted", str(tmp_path / "run"),
                                    frozenset({"rng", "scheduler"}))


def test_leg_without_spec_uses_the_defaults(
    runner: CliRunner, tmp_path: Path, run_leg_calls: Calls
) -> None:
    result = runner.invoke(cli.main, ["leg", "--leg", "control", "--run-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    ((spec, leg, _, omit),) = run_leg_calls
    assert (spec, leg, omit) == (QualificationSpec(), "control", frozenset())


def test_leg_training_error_exits_2(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resumequal.errors import TrainingError

    def failing(*args: Any) -> int:
        raise TrainingError("run directory x belongs to another run")

    monkeypatch.setattr(worker, "run_leg", failing)
    result = runner.invoke(cli.main, ["leg", "--leg", "control", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "error: run directory x belongs to another run" in result.stderr


def test_omit_rejects_unknown_omission_listing_allowed(
    runner: CliRunner, tmp_path: Path, run_leg_calls: Calls
) -> None:
    result = runner.invoke(cli.main, [
        "leg", "--leg", "control", "--run-dir", str(tmp_path), "--omit", "optimiser",
    ])
    assert result.exit_code == 2
    assert "--omit" in result.stderr and "'optimiser'" in result.stderr
    for name in OMISSIONS:
        assert name in result.stderr
    assert run_leg_calls == []


def test_leg_rejects_unknown_leg(runner: CliRunner, tmp_path: Path, run_leg_calls: Calls) -> None:
    result = runner.invoke(cli.main, ["leg", "--leg", "Canary Leg", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "--leg" in result.stderr and "'Canary Leg'" in result.stderr
    assert "lowercase letters, digits" in result.stderr
    assert run_leg_calls == []


# --- run -------------------------------------------------------------------------------------


def test_run_refuses_a_run_dir_another_run_holds(
    runner: CliRunner, tmp_path: Path, trial_builds: list[str]
) -> None:
    """Its traces are there: a second run's legs would append to them."""
    run_dir = tmp_path / "q1"
    run_dir.mkdir()
    theirs = b'{"spec_digest": "0123456789abcdef", "created_at": 1}'
    (run_dir / "run.json").write_bytes(theirs)
    result = runner.invoke(cli.main, ["run", "--run-dir", str(run_dir)])
    assert result.exit_code == 2
    assert f"error: run location {run_dir} is taken: it holds another run" in result.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]
    assert (run_dir / "run.json").read_bytes() == theirs


# --- launch ----------------------------------------------------------------------------------


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, list[str]]]:
    """Replace the launcher so no torchrun starts; record its calls (the launcher's name
    appended to the mode where it is not stock torchrun's)."""
    from resumequal.worker import launch

    calls: list[tuple[str, list[str]]] = []

    def fake_launch(mode: str, args: list[str], launcher: str) -> int:
        calls.append((mode if launcher == "torchrun" else f"{mode}/{launcher}", args))
        return 143

    monkeypatch.setattr(launch, "launch", fake_launch)
    return calls


def test_launch_passes_everything_after_the_dashes_to_torchrun(
    runner: CliRunner, launches: list[tuple[str, list[str]]]
) -> None:
    args = ["-m", "resumequal", "leg", "--leg", "preempted", "--run-dir", "s3://b/p",
            "--mode", "x"]
    result = runner.invoke(cli.main, ["launch", "--mode", "graceful", "--", *args])
    assert result.exit_code == 143  # the launcher's status is the command's
    assert launches == [("graceful", args)]


def test_launch_is_hard_by_default_and_refuses_another_mode(
    runner: CliRunner, launches: list[tuple[str, list[str]]]
) -> None:
    assert runner.invoke(cli.main, ["launch", "--", "--no-python", "true"]).exit_code == 143
    assert launches == [("hard", ["--no-python", "true"])]
    result = runner.invoke(cli.main, ["launch", "--mode", "soft", "--", "x"])
    assert result.exit_code == 2
    assert "'soft'" in result.stderr and "'graceful'" in result.stderr
    assert len(launches) == 1


def test_launch_runs_stock_torchrun_unless_forked_is_asked_for(
    runner: CliRunner, launches: list[tuple[str, list[str]]]
) -> None:
    assert runner.invoke(cli.main, ["launch", "--launcher", "forked", "--", "x"]).exit_code \
        == 143
    assert launches == [("hard/forked", ["x"])]
    result = runner.invoke(cli.main, ["launch", "--launcher", "warm", "--", "x"])
    assert result.exit_code == 2 and "'warm'" in result.stderr
    assert len(launches) == 1


def test_a_leg_that_fails_to_start_leaves_the_collector_running(
    runner: CliRunner, tmp_path: Path, run_leg_calls: Calls
) -> None:
    # The leg pauses the collector for its start-up (resumequal.train.startup).
    assert gc.isenabled()
    result = runner.invoke(cli.main, [
        "leg", "--spec", str(tmp_path / "nope.yaml"), "--leg", "control",
        "--run-dir", str(tmp_path / "run"),
    ])
    assert result.exit_code == 2
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
