"""The launcher of a leg's workers: stock torchrun by default, forked only when asked for."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from resumequal.spec import QualificationSpec, SpecError, apply_overrides, parse_spec
from resumequal.spec.launchers import FORKED_BLIND_SPOTS, caveats, command
from resumequal.worker.launch import Launcher


def test_the_default_spec_runs_stock_torchrun_and_a_pod_launcher_too() -> None:
    assert QualificationSpec().world.launcher == "torchrun"
    assert Launcher("hard", ["--nproc-per-node=2"]).cmd == [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    assert Launcher("hard", ["x"], launcher="forked").cmd[1:3] == ["-m", "resumequal.worker.agent"]


def test_forked_is_asked_for_by_name_and_a_typo_names_the_field() -> None:
    spec = apply_overrides(QualificationSpec(), ["world.launcher=forked"])
    assert command(spec.world.launcher) == ("-m", "resumequal.worker.agent")
    with pytest.raises(SpecError, match=r"world\.launcher"):
        parse_spec({"world": {"launcher": "warm"}})
    with pytest.raises(ValueError, match="unknown launcher 'warm'"):
        command("warm")


def test_only_a_forked_verdict_carries_what_it_cannot_see() -> None:
    assert caveats("torchrun") == []
    assert caveats("forked") == [FORKED_BLIND_SPOTS]


def test_the_launcher_is_part_of_the_experiment_and_the_default_keeps_old_digests() -> None:
    default = QualificationSpec()
    forked = apply_overrides(default, ["world.launcher=forked"])
    assert parse_spec({"world": {"launcher": "torchrun"}}).digest() == default.digest()
    assert forked.digest() != default.digest()


def test_run_launcher_option_sets_world_launcher(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    from resumequal import cli
    from resumequal.local import runner

    seen: list[str] = []

    def qualify_here(spec: QualificationSpec, *args: object) -> None:
        seen.append(spec.world.launcher)
        raise KeyboardInterrupt  # nothing runs: the spec is what this test looks at

    monkeypatch.setattr(runner, "qualify_here", qualify_here)
    cli_runner = CliRunner()
    for args in ([], ["--launcher", "forked"], ["--set", "world.launcher=forked",
                                                "--launcher", "torchrun"]):
        result = cli_runner.invoke(cli.main, ["run", "--run-dir", str(tmp_path / "q"), *args])
        assert result.exit_code == 130, result.output
    assert seen == ["torchrun", "forked", "torchrun"]  # the option overrides the spec's
    result = cli_runner.invoke(cli.main, ["run", "--launcher", "warm"])
    assert result.exit_code == 2 and "'warm'" in result.output
