"""Result assembly: the failed verdict, the timeline, leg summaries, the report and publishing.

The comparator's report is checked on a synthetic run location (see ``test_compare``), read
the way the cluster's comparator Job reads one: phases, kill time and restart time come
from the legs' records in the store.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from resumequal.built import BuiltOptimizer
from resumequal.jobs.comparator import compare_location
from resumequal.qualify.machine import (
    LegRun,
    Phase,
    QualificationStatus,
    Reason,
    failed_verdict,
    kill_order,
)
from resumequal.qualify.timeline import Timeline, read_timeline, restart_seconds
from resumequal.report.files import read_report
from resumequal.report.html import render_html
from resumequal.report.terminal import print_summary
from resumequal.results.assembly import build_report, leg_summary
from resumequal.results.publish import publish
from resumequal.results.verdict import PhaseEvent, Result
from resumequal.run.beacons import Beacon
from resumequal.run.location import RunLocation
from resumequal.run.name import run_names, run_uri
from resumequal.spec import PreemptionSpec, QualificationSpec
from resumequal.trace.records import InventoryRecord, StartupRecord
from tests.unit.test_compare import STEPS, WORLD, SyntheticRun, at, make_spec

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

KILLED, RESUMED_STEP_END = 10.25, 23.5


def _cluster_like_run(root: Path) -> SyntheticRun:
    """A finished run as legs leave one in the store: startup records, an arm record, a kill
    order, and a resumed attempt whose steps finish after the kill."""
    run = SyntheticRun(root, spec=make_spec(controls={"enabled": False}))
    for leg in ("control", "preempted"):
        for rank in range(WORLD):
            records = run.control if leg == "control" else run.preempted
            records[rank].insert(0, StartupRecord(rank=rank, attempt=0, pid=1000 + rank,
                                                  process_started_at=0.5 + rank,
                                                  group_joined_at=0.75, built_at=0.9))
    for rank in range(WORLD):
        for step in range(3, STEPS + 1):
            # The last rank's first resumed step (3) ends at RESUMED_STEP_END.
            end = RESUMED_STEP_END - (1 - rank) + (step - 3)
            run.change_step("preempted", rank, step, attempt=1, started_at=end - 0.5,
                            finished_at=end)
    return run


def _write_kill_order(root: Path, spec: QualificationSpec) -> None:
    beacon = Beacon(pid=1001, host="node-0", rank=1, attempt=0, step=4, microstep=1,
                    armed_at=10.0)
    order = kill_order(beacon, spec.preemption).model_copy(update={"issued_at": KILLED})
    at(root).write_kill_order("preempted", order)


def test_the_comparators_report_has_phases_kill_time_and_restart_time(tmp_path: Path) -> None:
    run = _cluster_like_run(tmp_path / "q9")
    root = run.write()
    _write_kill_order(root, run.spec)
    judged = compare_location(str(root), write=True, pin="torch==x")
    assert judged.verdict.result == Result.PASS, judged.verdict.reason
    report = read_report(root / "report.json")
    assert [p.phase for p in report.phases] == [
        "LegsRunning", "Armed", "Preempted", "Resumed", "Comparing", "Succeeded"]
    at = {p.phase: p.at for p in report.phases}
    assert (at["LegsRunning"], at["Armed"], at["Preempted"], at["Resumed"]) == (
        0.5, 10.0, KILLED, RESUMED_STEP_END)
    assert at["Comparing"] <= at["Succeeded"]
    succeeded = report.phases[-1]
    assert succeeded.reason == "Completed" and succeeded.message is not None
    assert succeeded.message.startswith("PASS: exact")
    assert report.kill_at == KILLED
    assert report.restart_seconds == RESUMED_STEP_END - KILLED
    assert [leg.name for leg in report.legs] == ["control", "preempted"]
    assert [leg.attempts for leg in report.legs] == [1, 2]
    assert report.inventory["python"] == "3.11.7" and "pid" not in report.inventory
    restart = [s for family in text_string_to_metric_families((root / "metrics.prom")
                                                             .read_text())
               for s in family.samples if s.name == "resumequal_restart_seconds"]
    assert [(s.labels["run"], s.value) for s in restart] == [("q9", RESUMED_STEP_END - KILLED)]


def test_a_run_without_a_kill_order_has_no_kill_time(tmp_path: Path) -> None:
    run = _cluster_like_run(tmp_path / "q")
    root = run.write()
    timeline = read_timeline(at(root), run.spec, compared_at=30.0)
    assert [p.phase for p in timeline.phases] == ["LegsRunning", "Armed", "Resumed",
                                                  "Comparing"]
    assert (timeline.kill_at, timeline.resumed_at) == (None, RESUMED_STEP_END)
    assert timeline.restart_seconds is None


def test_the_machines_timeline_and_failed_verdict() -> None:
    spec = QualificationSpec()
    status = QualificationStatus(
        phase=Phase.FAILED, reason=Reason.TIMEOUT, message="the preempted leg did not resume",
        history=[PhaseEvent(phase="Pending", at=1.0), PhaseEvent(phase="Failed", at=9.0)],
        legs={"preempted": LegRun(killed_at=4.0, resumed_at=6.5)})
    timeline = Timeline.of(status)
    assert (timeline.kill_at, timeline.restart_seconds) == (4.0, 2.5)
    assert [p.phase for p in timeline.phases] == ["Pending", "Failed"]
    verdict = failed_verdict(spec, status)
    assert verdict.result == Result.INVALID
    assert verdict.reason == "Timeout: the preempted leg did not resume"
    assert verdict.cut.step == spec.preemption.step
    assert [(c.name, c.ok) for c in verdict.checks] == [("qualification completed", False)]
    report = build_report(spec, verdict, timeline, run="r", pin="p")
    assert (report.kill_at, report.restart_seconds, report.legs) == (4.0, 2.5, [])
    assert restart_seconds(None, 3.0) is None and restart_seconds(1.0, None) is None


def test_leg_summary_reads_non_finite_losses(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path / "r")
    last = run.steps("preempted", 0, attempt=1)[-1]
    run.change_step("preempted", 0, last.step, microsteps=[
        m.model_copy(update={"loss": math.nan}) for m in last.microsteps])
    root = run.write()
    summary = leg_summary(at(root), "preempted", run.spec)
    assert summary.attempts == 2 and len(summary.losses) == STEPS
    assert math.isnan(summary.losses[-1]) and math.isfinite(summary.losses[0])


def test_publish_writes_every_result_file_and_keeps_a_metrics_file_where_asked(
    tmp_path: Path,
) -> None:
    spec = QualificationSpec()
    status = QualificationStatus(phase=Phase.FAILED, reason=Reason.LEG_FAILED, message="x")
    report = build_report(spec, failed_verdict(spec, status), Timeline.of(status), run="r",
                          pin="p")
    root = tmp_path / "run"
    location = at(root)
    published = publish(report, location, root, namespace="ns")
    assert list(published) == ["verdict.json", "report.json", "report.html", "metrics.prom"]
    assert json.loads((root / "verdict.json").read_text())["result"] == "INVALID"
    elsewhere = tmp_path / "m.prom"
    again = publish(report, location, root, namespace="ns", metrics_file=elsewhere)
    assert again["metrics.prom"] == str(elsewhere) and elsewhere.is_file()


def test_run_uri_and_back() -> None:
    uri = run_uri("s3://b/rq/", "ns", "nightly", "u1")
    assert uri == "s3://b/rq/ns/nightly/u1"
    assert run_names(uri) == ("ns", "nightly")
    assert run_names("/tmp/runs/q3") == ("local", "q3")
    with pytest.raises(ValueError, match="cannot be a path segment"):
        run_uri("s3://b", "a/b", "n", "u")


def test_kill_order_names_the_beacons_worker() -> None:
    beacon = Beacon(pid=7, host="h", pod_uid="u", rank=1, attempt=0, step=4, microstep=1,
                    armed_at=1.0)
    order = kill_order(beacon, PreemptionSpec(mode="graceful", grace_seconds=3))
    assert (order.pid, order.pod_uid, order.rank, order.mode, order.grace_seconds) == (
        7, "u", 1, "graceful", 3)


# -- what the workload built -----------------------------------------------------------

SGD_LAMBDA = BuiltOptimizer(
    optimizer="SGD", groups=1, scheduler="LambdaLR",
    hyperparameters={"dampening": 0, "initial_lr": 0.05, "lr": 0.05, "momentum": 0.9,
                     "nesterov": False, "weight_decay": 0},
    optimizer_from_spec=False, schedule_from_spec=False)


def _built_run(root: Path, built: BuiltOptimizer) -> Path:
    """A synthetic run whose workers recorded ``built`` in every inventory."""
    run = SyntheticRun(root, spec=make_spec(controls={"enabled": False}))
    for records in (*run.control.values(), *run.preempted.values()):
        for i, record in enumerate(records):
            if isinstance(record, InventoryRecord):
                records[i] = record.model_copy(update={"built": built})
    return run.write()


def test_a_factorys_own_optimizer_is_reported_and_the_specs_unused_fields_are_not(
        tmp_path: Path) -> None:
    root = _built_run(tmp_path / "q", SGD_LAMBDA)
    compare_location(str(root), write=True, pin="torch==x")
    raw = (root / "report.json").read_text()
    report = read_report(root / "report.json")
    assert report.built == SGD_LAMBDA
    # The spec's defaults (adamw, lr 0.003, warmup-cosine) are not claimed anywhere.
    assert "optimizer" not in report.spec["training"]
    assert "schedule" not in report.spec["training"]
    assert "built" not in report.inventory and report.inventory["torch"] == "2.13.0+cpu"
    words = "SGD (lr 0.05, momentum 0.9, weight_decay 0), schedule LambdaLR"
    html = (root / "report.html").read_text()
    console = Console(record=True, width=140, file=io.StringIO())
    print_summary(report, console)
    terminal = console.export_text()
    assert words in html and words in terminal
    assert "training.optimizer and training.schedule left out" in html
    for shown in (raw, html, terminal):
        assert "adamw" not in shown.lower() and "warmup-cosine" not in shown
        assert "0.003" not in shown


def test_the_specs_optimizer_stays_in_the_report_where_the_workload_built_it(
        tmp_path: Path) -> None:
    made = SGD_LAMBDA.model_copy(update={"optimizer": "AdamW", "optimizer_from_spec": True,
                                         "hyperparameters": {"initial_lr": 0.003, "lr": 0.001},
                                         "schedule_from_spec": True})
    report = build_report(make_spec(), failed_verdict(make_spec(), QualificationStatus()),
                          Timeline(), run="q", pin="p",
                          location=RunLocation.open(str(_built_run(tmp_path / "q", made))))
    assert report.built == made
    assert report.spec["training"]["optimizer"]["name"] == "adamw"
    assert report.spec["training"]["schedule"]["kind"] == "warmup-cosine"
    assert "left out" not in render_html(report)


def test_a_trace_without_a_record_of_the_optimizer_reports_the_spec(tmp_path: Path) -> None:
    run = SyntheticRun(tmp_path / "q", spec=make_spec(controls={"enabled": False}))
    report = build_report(run.spec, failed_verdict(run.spec, QualificationStatus()),
                          Timeline(), run="q", pin="p", location=RunLocation.open(str(run.write())))
    assert report.built is None and report.spec["training"]["optimizer"]["name"] == "adamw"
