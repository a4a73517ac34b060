"""A local run's end: its verdict is written into the run folder whatever the store does.

The store here is an S3 endpoint on a loopback port nothing listens on (every request
refused, as in an outage that outlasts the run): the report is made without what it would
read there, says so, and the result files stay in the run folder.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from rich.console import Console

from resumequal.errors import StoreError
from resumequal.local.runner import RunOptions, conclude
from resumequal.qualify.machine import Phase, QualificationStatus, Reason
from resumequal.report.files import read_verdict
from resumequal.results.verdict import Report, Result
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal, new_key, new_run_id
from resumequal.spec import QualificationSpec, parse_spec
from testing.operator.workers import verdict

NO_CONTROLS = {"controls": {"enabled": False}}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec(**sections: object) -> QualificationSpec:
    return parse_spec({**NO_CONTROLS, "timeouts": {"backendErrorSeconds": 1}, **sections})


def _opts(tmp_path: Path) -> RunOptions:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return RunOptions(run_dir=run_dir, pin="test")


@pytest.fixture
def unreachable(monkeypatch: pytest.MonkeyPatch) -> RunLocation:
    """A run location in a bucket whose endpoint refuses every connection."""
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return RunLocation.open("s3://bucket/q/local/run/uid",
                            seal=RunSeal(new_key().encode(), new_run_id()))


def _ended(result: Result | None) -> QualificationStatus:
    """The status of a run that ended: judged (``result``), or failed on the store."""
    if result is None:
        return QualificationStatus(
            phase=Phase.FAILED, reason=Reason.ERROR,
            message="s3://bucket/q/local/run/uid/control/trace: the store failed for 4s "
                    "(timeouts.backendErrorSeconds=4)")
    return QualificationStatus(phase=Phase.SUCCEEDED, reason=Reason.COMPLETED,
                               verdict=verdict(result))


def _no_zoom(*_: object) -> Report:
    raise AssertionError("zoomed without a FAIL to zoom")


@pytest.mark.parametrize("result", [None, Result.PASS, Result.FAIL])
def test_a_store_down_past_the_budget_leaves_the_verdict_in_the_run_folder(
    unreachable: RunLocation, tmp_path: Path, result: Result | None
) -> None:
    opts, console = _opts(tmp_path), Console(record=True, width=200)
    report, files = conclude(_spec(), _ended(result), opts, console, _no_zoom, unreachable)

    expected = result or Result.INVALID
    assert report.verdict.result is expected
    written = read_verdict(opts.run_dir / "verdict.json")
    assert written.result is expected
    if result is None:  # the run's own reason, naming the store and the budget
        assert "backendErrorSeconds=4" in written.reason
    on_disk = json.loads((opts.run_dir / "report.json").read_text())
    assert on_disk["incomplete"].startswith("the legs' traces could not be read")
    assert "127.0.0.1" in on_disk["incomplete"]  # the endpoint that failed
    assert on_disk["legs"] == []
    assert "incomplete" in (opts.run_dir / "report.html").read_text()
    assert (opts.run_dir / "metrics.prom").read_text().count("resumequal_") > 0
    # Where each result file is: the run folder, since none went into the bucket.
    assert files == {name: str(opts.run_dir / name) for name in
                     ("verdict.json", "report.json", "report.html", "metrics.prom")}
    said = console.export_text()
    assert f"the result files are in {opts.run_dir} only" in said
    assert "s3://bucket/q/local/run/uid" in said


def test_a_zoom_the_store_fails_leaves_the_fail_and_says_the_divergence_is_not_zoomed(
    tmp_path: Path,
) -> None:
    location = RunLocation.open(str(tmp_path / "store"),
                                seal=RunSeal(new_key().encode(), new_run_id()))
    asked: list[str] = []

    def zoom(report: Report, *_: object) -> Report:
        asked.append(report.verdict.result.value)
        raise StoreError(f"{location.uri}/zoom/control/trace: the store failed for 1s")

    opts, console = _opts(tmp_path), Console(record=True, width=200)
    report, files = conclude(_spec(zoom="onFail"), _ended(Result.FAIL), opts, console, zoom,
                             location)
    assert asked == ["FAIL"]
    assert report.verdict.result is Result.FAIL
    assert report.zoom is None
    assert (report.incomplete or "").startswith("the first divergence could not be zoomed")
    assert read_verdict(opts.run_dir / "verdict.json").result is Result.FAIL
    # The store took the files: each is where the location says.
    assert files["verdict.json"] == location.url("verdict.json")
    assert location.store.exists("verdict.json")


def test_a_store_that_serves_gives_a_whole_report_in_the_location(tmp_path: Path) -> None:
    location = RunLocation.open(str(tmp_path / "store"),
                                seal=RunSeal(new_key().encode(), new_run_id()))
    opts, console = _opts(tmp_path), Console(record=True, width=200)
    report, files = conclude(_spec(), _ended(Result.PASS), opts, console, _no_zoom, location)
    assert report.incomplete is None
    assert json.loads((opts.run_dir / "report.json").read_text())["incomplete"] is None
    assert files["report.json"] == location.url("report.json")
    assert "only" not in console.export_text()
