"""What ``compare`` and ``zoom`` say of a location that holds no run, or nothing to zoom."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from resumequal import cli
from resumequal.errors import UsageError
from resumequal.results.verdict import Cut, Result, Verdict
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV
from resumequal.spec import QualificationSpec
from resumequal.zoom.replays import zoom_of


@pytest.mark.parametrize("command", ["compare", "zoom"])
def test_a_path_with_no_run_says_so_and_exits_2(command: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Without a key in the environment: "no run here" comes before "cannot authenticate".
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.delenv(RUN_ID_ENV)
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(cli.main, [command, str(tmp_path / "empty")])
    assert result.exit_code == 2, result.output
    assert "is not a run location" in result.output
    assert "cannot be authenticated" not in result.output


def _verdict(result: Result) -> Verdict:
    return Verdict(result=result, reason="exact", cut=Cut(step=6, microstep=1, rank=1,
                                                          mode="hard"),
                   resumed_from="step-00000004", first_divergence=None,
                   exact_through_step=12, checks=[])


@pytest.mark.parametrize("result", [Result.PASS, None])
def test_zoom_without_a_step_on_a_run_without_divergence_is_a_usage_error(
        result: Result | None, tmp_path: Path) -> None:
    verdict = None if result is None else _verdict(result)
    with pytest.raises(UsageError, match=r"has no first divergence to zoom into.*--step"):
        zoom_of(RunLocation.open(str(tmp_path)), QualificationSpec(), verdict)


def test_zoom_of_a_step_the_run_never_trains_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--step 99: the run trains steps 1 to 12"):
        zoom_of(RunLocation.open(str(tmp_path)), QualificationSpec(), None, step=99)
