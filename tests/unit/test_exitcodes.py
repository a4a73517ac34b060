"""Exit statuses: one per outcome, the same in the runner, the command line and the docs."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from resumequal import cli
from resumequal.errors import (
    CheckpointError,
    MetricsError,
    ReportError,
    ResumequalError,
    TrainingError,
    UsageError,
)
from resumequal.exitcodes import MEANINGS, ExitCode, for_error, for_result
from resumequal.jobs import comparator
from resumequal.local import runner
from resumequal.results.verdict import Result
from resumequal.spec import SpecError
from resumequal.store.errors import (
    StoreAccessDenied,
    StoreIntegrityError,
    StoreNotFound,
    StoreUnavailable,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "exit-codes.md"


def test_every_outcome_has_a_status_of_its_own() -> None:
    assert {code.name: int(code) for code in ExitCode} == {
        "PASS": 0, "FAIL": 1, "SPEC_ERROR": 2, "INVALID": 3, "NONDETERMINISTIC": 4,
        "NO_FLIP": 5, "UNDECIDED": 6, "INTERNAL_ERROR": 70, "INTERRUPTED": 130}
    assert set(MEANINGS) == set(ExitCode)


@pytest.mark.parametrize(("result", "code"), [
    (Result.PASS, 0), (Result.FAIL, 1), (Result.INVALID, 3), (Result.NONDETERMINISTIC, 4)])
def test_a_verdict_exits_with_its_status_in_the_runner_and_the_command_line(
        result: Result, code: int) -> None:
    assert for_result(result) == runner.exit_code(result) == code


@pytest.mark.parametrize(("error", "code"), [
    (SpecError("workload.name: ..."), 2),
    (UsageError("run location x is taken"), 2),
    (StoreNotFound("s3://b/run/run.json does not exist"), 2),
    (StoreAccessDenied("wrong credentials or no permission for s3://b/k"), 2),
    (StoreUnavailable("cannot reach http://minio:9000 after 5 attempts"), 3),
    (StoreIntegrityError("sha256 differs"), 3),
    (TrainingError("a leg cannot go on"), 3),
    (CheckpointError("step-00000004 does not match"), 3),
    (ReportError("not a valid report"), 3),
    (MetricsError("cannot push"), 3),
])
def test_an_error_is_a_spec_error_only_when_the_input_was_wrong(
        error: ResumequalError, code: int) -> None:
    assert for_error(error) == code


def test_the_docs_page_lists_every_status_as_the_module_does() -> None:
    rows = re.findall(r"^\| (\d+) \| (.+?) \| (.+?) \|$", DOCS.read_text(), re.MULTILINE)
    assert {int(code): (says, then) for code, says, then in rows} == {
        int(code): (m.says, m.then) for code, m in MEANINGS.items()}


@pytest.mark.parametrize("command", ["run", "compare", "validate", "zoom"])
def test_help_lists_the_exit_statuses(command: str) -> None:
    result = CliRunner().invoke(cli.main, [command, "--help"])
    assert result.exit_code == 0
    help_text = result.output
    assert "Exit status:" in help_text
    assert re.search(r"^\s+2  spec or usage error", help_text, re.MULTILINE)
    assert re.search(r"^\s+130  interrupted", help_text, re.MULTILINE)
    assert re.search(r"^\s+70  internal error: a bug in resumequal", help_text, re.MULTILINE)
    if command in ("run", "compare"):
        for code, word in ((0, "PASS"), (1, "FAIL"), (3, "INVALID"), (4, "NONDETERMINISTIC")):
            assert re.search(rf"^\s+{code}  {word}: ", help_text, re.MULTILINE), (code, help_text)


@pytest.mark.parametrize("result", list(Result))
def test_compare_exits_with_the_verdicts_status(
        result: Result, monkeypatch: pytest.MonkeyPatch) -> None:
    verdict = SimpleNamespace(result=result, reason="because")
    monkeypatch.setattr(comparator, "compare_location",
                        lambda *a, **k: SimpleNamespace(verdict=verdict, files={}))
    done = CliRunner().invoke(cli.main, ["compare", "runs/q1", "--pin", "torch==x"])
    assert done.exit_code == for_result(result), done.output
    assert done.stdout == f"{result.value}: because\n"


@pytest.mark.parametrize(("error", "code"), [
    (StoreNotFound("s3://b/q1/run.json does not exist"), 2),
    (StoreUnavailable("cannot reach http://minio:9000 to read s3://b/q1 after 5 attempts"), 3),
])
def test_compare_that_cannot_judge_says_why_with_the_errors_status(
        error: ResumequalError, code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(comparator, "compare_location", fails)
    done = CliRunner().invoke(cli.main, ["compare", "s3://b/q1", "--pin", "torch==x"])
    assert done.exit_code == code
    assert done.stderr == f"error: {error}\n"


def test_an_interrupted_command_exits_130_not_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(comparator, "compare_location", interrupted)
    done = CliRunner().invoke(cli.main, ["compare", "runs/q1", "--pin", "torch==x"])
    assert done.exit_code == 130
    assert "interrupted" in done.stderr


@pytest.mark.parametrize("command", [["compare", "runs/q1", "--pin", "torch==x"],
                                     ["run", "--run-dir", "runs/q1", "--pin", "torch==x"]])
def test_an_unexpected_exception_is_a_bug_with_a_status_of_its_own_never_a_verdicts(
        command: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def crashes(*args: object, **kwargs: object) -> None:
        raise ValueError("Invalid endpoint: http://user:rq-SECRET@h")

    monkeypatch.setattr(comparator, "compare_location", crashes)
    monkeypatch.setattr(runner, "qualify_here", crashes)
    done = CliRunner().invoke(cli.main, command)
    assert done.exit_code == ExitCode.INTERNAL_ERROR == 70
    assert done.exit_code not in {int(for_result(r)) for r in Result}
    assert "Traceback" in done.stderr and "This is a bug in resumequal" in done.stderr
    assert "internal error: ValueError: Invalid endpoint" in done.stderr
    assert "rq-SECRET" not in done.stderr


@pytest.mark.parametrize("endpoint", ["http://h%0d%0a", "http://[::1", "http://h:99999",
                                      "http://h\tx", "http://[not-v6]:9000"])
def test_an_endpoint_no_s3_client_takes_is_a_spec_error_before_anything_runs(
        endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def launched(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(runner, "qualify_here", launched)
    done = CliRunner().invoke(cli.main, [
        "run", "--run-dir", str(tmp_path / "q1"), "--pin", "torch==x",
        "--set", "checkpoint.store=s3://b/p", "--set", f"checkpoint.s3.endpointUrl={endpoint}"])
    assert done.exit_code == ExitCode.SPEC_ERROR, done.output
    assert "checkpoint.s3.endpointUrl" in done.stderr
    assert not (tmp_path / "q1").exists()
