"""The alert rules of charts/resumequal/files/alerts.yaml: promtool checks and unit tests,
their shape, the metric names they use, and one end-to-end firing in a real Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from resumequal.results.metrics import QualificationMetrics
from resumequal.results.verdict import Result
from resumequal_operator import opmetrics
from tests.chart.monitoring import OPERATOR_FAMILIES, metric_names
from tests.chart.prometheus import metrics_endpoint, running_prometheus
from tests.tools import require
from tests.unit.report_samples import make_report

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "charts/resumequal/files/alerts.yaml"
PROMTOOL_TESTS = ROOT / "tests/chart/alerts_test.yaml"
SCHEMA = ROOT / "charts/resumequal/values.schema.json"
PER_RUN = {
    "QualificationFailed",
    "QualificationInvalid",
    "ResumeDriftAboveThreshold",
    "NegativeControlBlind",
}
EVERY_ALERT = PER_RUN | {"NoPassingQualification", "OperatorDown", "ReconcileErrors"}


def _promtool() -> str:
    return require("promtool")


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _alerts() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in _rules() if "alert" in r}


def test_promtool_check_rules() -> None:
    done = subprocess.run(
        [_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests() -> None:
    done = subprocess.run(
        [_promtool(), "test", "rules", str(PROMTOOL_TESTS)],
        capture_output=True,
        text=True,
        cwd=PROMTOOL_TESTS.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    doc = yaml.safe_load(PROMTOOL_TESTS.read_text())
    firing: set[str] = set()
    silent: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else silent).add(check["alertname"])
        # A per-run alert is silent on the runs of the same case it does not list.
        runs = {
            m.group(1)
            for s in case["input_series"]
            if (m := re.search(r'run="([^"]+)"', s["series"]))
        }
        for check in case.get("alert_rule_test", []):
            listed = {a["exp_labels"].get("run") for a in check.get("exp_alerts") or []}
            if check["alertname"] in PER_RUN and runs - listed:
                silent.add(check["alertname"])
    assert firing == EVERY_ALERT
    assert silent == EVERY_ALERT


def test_alerts_are_the_documented_set() -> None:
    assert set(_alerts()) == EVERY_ALERT
    schema = json.loads(SCHEMA.read_text())
    overridable = schema["properties"]["prometheusRule"]["properties"]["alerts"]["properties"]
    assert set(overridable) == EVERY_ALERT


@pytest.mark.parametrize("name", sorted(EVERY_ALERT))
def test_alert_shape(name: str) -> None:
    rule = _alerts()[name]
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    text = rule["annotations"]["summary"] + rule["annotations"]["description"]
    if name in PER_RUN:
        for label in ("pin", "run", "namespace"):
            assert "{{ $labels." + label + " }}" in text, f"{name} does not name {label}"


def test_alerts_use_only_metrics_that_exist() -> None:
    known = metric_names()
    assert "resumequal_runs_total" in known and "resumequal_qualification_passed" in known
    for rule in _rules():
        for name in re.findall(r"\bresumequal_[a-z0-9_]+", rule["expr"]):
            assert name in known, f"{rule.get('alert') or rule.get('record')}: no metric {name}"


# --- a real Prometheus scraping a real resumequal metrics endpoint -----------------------


@pytest.mark.slow
@pytest.mark.waits
@pytest.mark.timeout(120)
def test_prometheus_fires_qualification_failed(tmp_path: Path) -> None:
    require("prometheus")
    report = make_report(Result.FAIL)
    registry = CollectorRegistry()
    QualificationMetrics(registry).record(report, namespace="ml")
    with (
        metrics_endpoint(registry) as target,
        running_prometheus(tmp_path, target, [ALERTS]) as prometheus,
    ):

        def failed() -> list[dict[str, Any]]:
            return [
                a
                for a in prometheus.alerts()
                if a["labels"]["alertname"] == "QualificationFailed" and a["state"] == "firing"
            ]

        (alert,) = prometheus.wait_for("firing QualificationFailed", failed)
        assert alert["labels"]["pin"] == report.pin
        assert alert["labels"]["run"] == report.run
        assert alert["labels"]["namespace"] == "ml"
        assert alert["labels"]["severity"] == "critical"
        assert f"run ml/{report.run} failed" in alert["annotations"]["summary"]
        names = {a["labels"]["alertname"] for a in prometheus.alerts() if a["state"] == "firing"}
        # The target is up and the run is valid and saw every control; its parameters
        # drifted past the default threshold (1e-6).
        model = next(d for d in report.verdict.drift if d.group == "model")
        assert model.rel_l2 > 1e-6
        assert names == {"QualificationFailed", "ResumeDriftAboveThreshold"}


def test_operator_families_are_the_operators() -> None:
    registry = CollectorRegistry()
    opmetrics.OperatorMetrics(registry)
    served = {
        f.name + ("_total" if f.type == "counter" else "")
        for f in registry.collect()
        if f.name.startswith("resumequal_operator_")
    }
    assert served == OPERATOR_FAMILIES
