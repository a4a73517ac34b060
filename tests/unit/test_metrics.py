"""The Prometheus families, set from hand-built Reports into a fresh registry per test."""

from __future__ import annotations

import math
from itertools import pairwise
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from resumequal.errors import MetricsError
from resumequal.results.metrics import PHASE_BUCKETS, QualificationMetrics, push, write_textfile
from resumequal.results.verdict import Report, Result
from resumequal.spec import SCENARIOS
from tests.unit.report_samples import (
    FAILING_CELL,
    FAILING_STEP,
    KILL_STEP,
    PHASES,
    T0,
    make_controls_report,
    make_matrix_report,
    make_report,
)

NS = "ml-platform"


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def _labels(result: Result, scenario: str = "resume") -> dict[str, str]:
    report = make_report(result)
    return {"namespace": NS, "run": report.run, "pin": report.pin, "scenario": scenario}


def test_record_pass_sets_every_family(registry: CollectorRegistry) -> None:
    metrics = QualificationMetrics(registry)
    report = make_controls_report(blind=False)  # a PASS whose controls were all detected
    metrics.record(report, namespace=NS)
    labels = _labels(Result.PASS)

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("resumequal_qualification_passed") == 1.0
    assert value("resumequal_qualification_valid") == 1.0
    assert value("resumequal_first_divergent_step") == -1.0
    assert value("resumequal_param_max_abs_diff") == 0.0
    assert value("resumequal_param_rel_l2_diff") == 0.0
    assert value("resumequal_param_mismatch_fraction") == 0.0
    assert value("resumequal_loss_max_abs_diff") == 0.0
    assert value("resumequal_restart_seconds") == 8.25
    # Five controls ran; pending_grads was not applicable, so 4 had to be detected.
    assert value("resumequal_negative_controls_detected") == 4.0
    assert value("resumequal_negative_controls_total") == 4.0
    assert value("resumequal_last_completion_timestamp_seconds") == T0 + PHASES[-1][1]
    assert registry.get_sample_value("resumequal_runs_total", {"result": "PASS"}) == 1.0
    assert registry.get_sample_value("resumequal_runs_total", {"result": "FAIL"}) == 0.0


def test_record_fail_sets_divergence_and_model_drift(registry: CollectorRegistry) -> None:
    metrics = QualificationMetrics(registry)
    report = make_report(Result.FAIL)
    metrics.record(report, namespace=NS)
    labels = _labels(Result.FAIL)
    model = next(d for d in report.verdict.drift if d.group == "model")

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("resumequal_qualification_passed") == 0.0
    assert value("resumequal_qualification_valid") == 1.0
    assert value("resumequal_first_divergent_step") == float(KILL_STEP)
    assert value("resumequal_param_max_abs_diff") == model.max_abs_diff
    assert value("resumequal_param_rel_l2_diff") == model.rel_l2
    assert value("resumequal_param_mismatch_fraction") == model.mismatch_fraction
    assert value("resumequal_loss_max_abs_diff") == max(
        d.abs_diff for d in report.verdict.loss_deltas
    )
    assert value("resumequal_negative_controls_detected") == 0.0
    assert value("resumequal_negative_controls_total") == 0.0
    assert registry.get_sample_value("resumequal_runs_total", {"result": "FAIL"}) == 1.0


def test_record_invalid_leaves_missing_figures_absent(registry: CollectorRegistry) -> None:
    metrics = QualificationMetrics(registry)
    labels = _labels(Result.INVALID)
    metrics.record(make_report(Result.FAIL), namespace=NS)  # same labels, then INVALID
    metrics.record(make_report(Result.INVALID), namespace=NS)
    assert registry.get_sample_value("resumequal_qualification_valid", labels) == 0.0
    assert registry.get_sample_value("resumequal_qualification_passed", labels) == 0.0
    assert registry.get_sample_value("resumequal_first_divergent_step", labels) == -1.0
    for name in (
        "resumequal_param_max_abs_diff",
        "resumequal_param_rel_l2_diff",
        "resumequal_param_mismatch_fraction",
        "resumequal_restart_seconds",
    ):
        assert registry.get_sample_value(name, labels) is None, name


def test_negative_controls_are_read_from_the_verdict(registry: CollectorRegistry) -> None:
    metrics = QualificationMetrics(registry)
    report = make_controls_report(blind=True)
    metrics.record(report, namespace=NS)
    labels = _labels(Result.INVALID)
    detected = registry.get_sample_value("resumequal_negative_controls_detected", labels)
    total = registry.get_sample_value("resumequal_negative_controls_total", labels)
    assert (detected, total) == (3.0, 4.0)  # one blind, one not applicable
    assert registry.get_sample_value("resumequal_qualification_valid", labels) == 0.0

    report.verdict.controls[0].status = "invalid"  # counted, not detected
    metrics.record(report, namespace=NS)
    detected = registry.get_sample_value("resumequal_negative_controls_detected", labels)
    total = registry.get_sample_value("resumequal_negative_controls_total", labels)
    assert (detected, total) == (2.0, 4.0)


def test_loss_max_abs_diff_is_infinite_when_a_delta_is_not_finite(
    registry: CollectorRegistry,
) -> None:
    report = make_report(Result.FAIL)
    report.verdict.loss_deltas[-1].abs_diff = math.nan
    QualificationMetrics(registry).record(report, namespace=NS)
    value = registry.get_sample_value("resumequal_loss_max_abs_diff", _labels(Result.FAIL))
    assert value == math.inf


def test_runs_total_counts_per_result(registry: CollectorRegistry) -> None:
    metrics = QualificationMetrics(registry)
    for result in (Result.PASS, Result.FAIL, Result.PASS, Result.NONDETERMINISTIC):
        metrics.record(make_report(result), namespace=NS)
    counts = {
        r.value: registry.get_sample_value("resumequal_runs_total", {"result": r.value})
        for r in Result
    }
    assert counts == {"PASS": 2.0, "FAIL": 1.0, "NONDETERMINISTIC": 1.0, "INVALID": 0.0}


def test_phase_durations_are_observed_per_phase(registry: CollectorRegistry) -> None:
    QualificationMetrics(registry).record(make_report(Result.PASS), namespace=NS)
    for (phase, start), (_, end) in pairwise(PHASES):
        labels = {"phase": phase}
        count = registry.get_sample_value("resumequal_phase_duration_seconds_count", labels)
        total = registry.get_sample_value("resumequal_phase_duration_seconds_sum", labels)
        assert count == 1.0, phase
        assert total == pytest.approx(end - start)
    # The terminal phase has no end, so no duration.
    last = {"phase": PHASES[-1][0]}
    assert registry.get_sample_value("resumequal_phase_duration_seconds_count", last) is None
    # Arming took 15 s: counted from the le=30 bucket on.
    arming = {"phase": "Arming", "le": "10.0"}
    assert registry.get_sample_value("resumequal_phase_duration_seconds_bucket", arming) == 0.0
    arming["le"] = "30.0"
    assert registry.get_sample_value("resumequal_phase_duration_seconds_bucket", arming) == 1.0
    assert PHASE_BUCKETS[0] == 1 and PHASE_BUCKETS[-1] == 7200


def test_forget_removes_only_that_runs_series(registry: CollectorRegistry) -> None:
    metrics = QualificationMetrics(registry)
    report = make_report(Result.PASS)
    metrics.record(report, namespace=NS)
    other = make_report(Result.FAIL)
    other.run = "nightly-other"
    metrics.record(other, namespace=NS)
    metrics.forget(NS, report.run, report.pin, "resume")

    def series(run: str) -> list[str]:
        return [
            s.name
            for family in registry.collect()
            for s in family.samples
            if s.labels.get("run") == run
        ]

    assert series(report.run) == []
    assert len(series("nightly-other")) == 11  # every per-run gauge
    metrics.forget(NS, "nightly-other")  # pin and scenario unknown: match any
    assert series("nightly-other") == []
    # Counters and histograms carry no run label, so they are untouched.
    assert registry.get_sample_value("resumequal_runs_total", {"result": "PASS"}) == 1.0


# -- the seed matrix ---------------------------------------------------------------------


def _matrix_series(registry: CollectorRegistry, run: str) -> dict[tuple[str, str], float]:
    """(family, scenario) -> value for every series of ``run`` except the main one."""
    return {
        (s.name, s.labels["scenario"]): s.value
        for family in registry.collect()
        for s in family.samples
        if s.labels.get("run") == run and s.labels.get("scenario") != "resume"
    }


def test_matrix_adds_passed_valid_and_first_step_per_scenario(
    registry: CollectorRegistry,
) -> None:
    metrics = QualificationMetrics(registry)
    report = make_matrix_report()
    metrics.record(report, namespace=NS)
    failing, _ = FAILING_CELL
    expected: dict[tuple[str, str], float] = {}
    for scenario in SCENARIOS:
        bad = scenario == failing
        expected[("resumequal_qualification_passed", scenario)] = 0.0 if bad else 1.0
        expected[("resumequal_qualification_valid", scenario)] = 1.0
        expected[("resumequal_first_divergent_step", scenario)] = (
            float(FAILING_STEP) if bad else -1.0
        )
    assert _matrix_series(registry, report.run) == expected
    # The main comparison keeps its own series (and its controls), unchanged by the matrix.
    main = _labels(Result.FAIL)
    assert registry.get_sample_value("resumequal_qualification_passed", main) == 0.0
    assert registry.get_sample_value("resumequal_first_divergent_step", main) == -1.0
    assert registry.get_sample_value("resumequal_negative_controls_total", main) == 4.0
    assert registry.get_sample_value("resumequal_param_max_abs_diff", main) == 0.0


def test_matrix_scenario_with_an_invalid_seed_is_not_valid(registry: CollectorRegistry) -> None:
    report = make_matrix_report()
    assert report.matrix is not None
    cell = report.matrix.cells[0]
    report.matrix.cells[0] = cell.model_copy(update={"result": Result.INVALID})
    report.matrix.summary[0].exact -= 1
    QualificationMetrics(registry).record(report, namespace=NS)
    series = _matrix_series(registry, report.run)
    assert series[("resumequal_qualification_valid", cell.scenario)] == 0.0
    assert series[("resumequal_qualification_passed", cell.scenario)] == 0.0
    assert series[("resumequal_first_divergent_step", cell.scenario)] == -1.0


def test_matrix_scenario_without_a_summary_row_is_judged_by_its_cells(
    registry: CollectorRegistry,
) -> None:
    report = make_matrix_report()
    assert report.matrix is not None
    report.matrix.summary = []
    QualificationMetrics(registry).record(report, namespace=NS)
    series = _matrix_series(registry, report.run)
    passed = {s: v for (f, s), v in series.items() if f == "resumequal_qualification_passed"}
    assert passed == {s: 0.0 if s == FAILING_CELL[0] else 1.0 for s in SCENARIOS}


def test_recording_again_drops_matrix_scenarios_no_longer_reported(
    registry: CollectorRegistry,
) -> None:
    metrics = QualificationMetrics(registry)
    report = make_matrix_report()
    metrics.record(report, namespace=NS)
    assert len(_matrix_series(registry, report.run)) == 3 * len(SCENARIOS)

    assert report.matrix is not None
    kept = SCENARIOS[:2]
    report.matrix.scenarios = list(kept)
    report.matrix.cells = [c for c in report.matrix.cells if c.scenario in kept]
    report.matrix.summary = [r for r in report.matrix.summary if r.scenario in kept]
    metrics.record(report, namespace=NS)
    assert {s for _, s in _matrix_series(registry, report.run)} == set(kept)

    report.matrix = None
    metrics.record(report, namespace=NS)
    assert _matrix_series(registry, report.run) == {}


def test_forget_removes_the_matrix_series_with_the_run(registry: CollectorRegistry) -> None:
    metrics = QualificationMetrics(registry)
    report = make_matrix_report()

    def every_series(run: str) -> int:
        return sum(
            s.labels.get("run") == run for family in registry.collect() for s in family.samples
        )

    metrics.record(report, namespace=NS)
    assert every_series(report.run) == 11 + 3 * len(SCENARIOS)  # bounded per run
    metrics.forget(NS, report.run, report.pin, "mid-hard")  # one matrix scenario
    assert {s for _, s in _matrix_series(registry, report.run)} == set(SCENARIOS) - {"mid-hard"}
    metrics.forget(NS, report.run, report.pin, "resume")  # the main comparison: all of it
    assert every_series(report.run) == 0

    metrics.record(report, namespace=NS)
    metrics.forget(NS, report.run, "another-pin")
    assert every_series(report.run) == 11 + 3 * len(SCENARIOS)
    metrics.forget(NS, report.run)
    assert every_series(report.run) == 0
    metrics.record(report, namespace=NS)  # nothing stale is remembered
    assert every_series(report.run) == 11 + 3 * len(SCENARIOS)


def test_matrix_scenario_named_like_the_main_one_is_skipped(
    registry: CollectorRegistry,
) -> None:
    report: Report = make_matrix_report()
    failing, _ = FAILING_CELL
    QualificationMetrics(registry).record(report, namespace=NS, scenario=failing)
    labels = {"namespace": NS, "run": report.run, "pin": report.pin, "scenario": failing}
    # The main comparison's first divergence (none), not the matrix scenario's step.
    assert registry.get_sample_value("resumequal_first_divergent_step", labels) == -1.0
    assert registry.get_sample_value("resumequal_restart_seconds", labels) == 8.25


def test_write_textfile_parses_back(registry: CollectorRegistry, tmp_path: Path) -> None:
    QualificationMetrics(registry).record(make_report(Result.FAIL), namespace=NS)
    path = tmp_path / "resumequal.prom"
    write_textfile(registry, path)
    families = {f.name: f for f in text_string_to_metric_families(path.read_text())}
    assert {
        "resumequal_qualification_passed",
        "resumequal_qualification_valid",
        "resumequal_first_divergent_step",
        "resumequal_param_max_abs_diff",
        "resumequal_param_rel_l2_diff",
        "resumequal_param_mismatch_fraction",
        "resumequal_loss_max_abs_diff",
        "resumequal_restart_seconds",
        "resumequal_negative_controls_detected",
        "resumequal_negative_controls_total",
        "resumequal_last_completion_timestamp_seconds",
        "resumequal_runs",
        "resumequal_phase_duration_seconds",
    } <= set(families)
    assert families["resumequal_runs"].type == "counter"
    assert families["resumequal_phase_duration_seconds"].type == "histogram"
    step = families["resumequal_first_divergent_step"].samples[0]
    assert step.value == float(KILL_STEP) and step.labels["namespace"] == NS
    assert [p.name for p in tmp_path.iterdir()] == ["resumequal.prom"]


def test_write_textfile_error_names_the_path(registry: CollectorRegistry, tmp_path: Path) -> None:
    with pytest.raises(MetricsError, match="missing-dir"):
        write_textfile(registry, tmp_path / "missing-dir" / "x.prom")


def test_push_rejects_a_bad_url_without_echoing_it(registry: CollectorRegistry) -> None:
    with pytest.raises(MetricsError) as info:
        push(registry, "http://bot:hunter2@gateway:99999999", "resumequal")
    assert "hunter2" not in str(info.value)
