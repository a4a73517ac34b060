"""The Grafana-managed alert rules: the committed file is what tools/grafana_alerts.py
renders from alerts.yaml, it validates against grafana-foundation-sdk's models, the chart
provisions it for Grafana's sidecar, and a real Prometheus finds both renderings firing on
the same series."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python as helm
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tests.chart.grafana import (
    DASHBOARD_UID,
    PANEL_ID,
    alerting_instances,
    promql,
    validate_provisioning,
)
from tests.chart.prometheus import JOB, metrics_endpoint, running_prometheus
from tests.chart.test_chart import NAMESPACE, by_kind, named, render, validate, values_all
from tests.tools import require

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/resumequal"
COMMITTED = CHART / "files/grafana-alerts.yaml"
ALERTS = CHART / "files/alerts.yaml"
DASHBOARD = CHART / "files/dashboard.json"
CONFIGMAP = "rq-resumequal-grafana-alerts"
FILE_KEY = "resumequal-alerts.yaml"
Obj = dict[str, Any]
Instances = set[frozenset[tuple[str, str]]]


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    path = ROOT / "tools/grafana_alerts.py"
    spec = importlib.util.spec_from_file_location("grafana_alerts_tool", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART) as c:
        yield c


def _committed() -> Obj:
    doc: Obj = yaml.safe_load(COMMITTED.read_text(encoding="utf-8"))
    return doc


def _grafana_rules(doc: Obj) -> dict[str, Obj]:
    return {r["title"]: r for g in doc["groups"] for r in g["rules"]}


def _prometheus_rules() -> list[Obj]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [r for g in doc["groups"] for r in g["rules"]]


def _provisioned(chart: helm.Chart, values: Obj) -> Obj:
    cm = named(render(chart, values), "ConfigMap", CONFIGMAP)
    doc: Obj = yaml.safe_load(cm["data"][FILE_KEY])
    return doc


# --- the rendering ----------------------------------------------------------------------


def test_committed_file_is_current(tool: ModuleType) -> None:
    assert COMMITTED.read_text(encoding="utf-8") == tool.render(), (
        "charts/resumequal/files/grafana-alerts.yaml is stale: "
        "run python tools/grafana_alerts.py --write"
    )
    assert tool.main(["--check"]) == 0


def test_check_fails_on_a_stale_file(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "grafana-alerts.yaml"
    stale.write_text("apiVersion: 1\n")
    monkeypatch.setattr(tool, "OUTPUT", stale)
    assert tool.main(["--check"]) == 1
    assert tool.main(["--write"]) == 0
    assert tool.main(["--check"]) == 0


def test_committed_file_validates_against_the_sdk_models() -> None:
    validate_provisioning(_committed())


@pytest.mark.parametrize(
    ("break_it", "message"),
    [
        (lambda r: r.update(noDataState="Nodata"), "noDataState"),
        (lambda r: r.update(dashboardUID="x"), "no field ['dashboardUID']"),
        (lambda r: r["data"][0].update(datasourceUID="x"), "no field ['datasourceUID']"),
        (lambda r: r["data"][0]["model"].update(instnt=True), "no field ['instnt']"),
        (lambda r: r["data"][0]["model"].update(datasource={"type": "nope"}), "no known kind"),
        (lambda r: r.update(condition="C"), ".condition"),
        (lambda r: r.update({"for": "5 minutes"}), ".for"),
        (lambda r: r["annotations"].pop(PANEL_ID), "go together"),
    ],
)
def test_validation_names_what_is_wrong(break_it: Any, message: str) -> None:
    doc = _committed()
    break_it(doc["groups"][0]["rules"][0])
    with pytest.raises(AssertionError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_provisioning(doc)


def test_one_source_two_renderings(tool: ModuleType) -> None:
    """Every alert of alerts.yaml, and only those, with its query, `for`, labels and annotations."""
    rules = _prometheus_rules()
    records = {r["record"]: r["expr"] for r in rules if "record" in r}
    alerts = [r for r in rules if "alert" in r]
    grafana = _grafana_rules(_committed())
    assert list(grafana) == [a["alert"] for a in alerts]
    for alert in alerts:
        rule = grafana[alert["alert"]]
        expression = promql(rule)
        assert expression == tool.inline_records(alert["expr"], records)
        assert not any(name in expression for name in records), "a record left in the query"
        assert rule["for"] == alert.get("for", "0s")
        assert rule["labels"] == alert["labels"]
        annotations = dict(rule["annotations"])
        assert annotations.pop(DASHBOARD_UID) == "resumequal"
        annotations.pop(PANEL_ID)
        assert annotations == {
            k: v.replace("$value", "$values.query.Value") for k, v in alert["annotations"].items()
        }
    # Per-run alerts carry the run's labels in their summary, as the PrometheusRule's do.
    summary = grafana["QualificationFailed"]["annotations"]["summary"]
    assert "{{ $labels.pin }}" in summary and "{{ $labels.namespace }}/{{ $labels.run }}" in summary


def test_inline_records_respects_names(tool: ModuleType) -> None:
    records = {"a:b": "x", "a:b_c": "y + a:b"}
    assert tool.inline_records("a:b_c > a:b or a:bc", records) == "(y + (x)) > (x) or a:bc"
    # A body is taken as it is, a matcher's escaped backslash included.
    assert tool.inline_records("r:a", {"r:a": 'up{job=~"a\\\\.b"}'}) == '(up{job=~"a\\\\.b"})'
    with pytest.raises(ValueError, match="cycle"):
        tool.inline_records("p:q", {"p:q": "r:s", "r:s": "p:q"})


def test_every_alert_links_to_its_dashboard_panel(tool: ModuleType) -> None:
    board = yaml.safe_load(DASHBOARD.read_text(encoding="utf-8"))
    panels = {p["id"]: p["title"] for p in board["panels"]}
    for title, rule in _grafana_rules(_committed()).items():
        assert rule["annotations"][DASHBOARD_UID] == board["uid"]
        assert panels[int(rule["annotations"][PANEL_ID])] == tool.PANELS[title]


# --- the chart --------------------------------------------------------------------------


def test_off_by_default(chart: helm.Chart) -> None:
    names = [o["metadata"]["name"] for o in by_kind(render(chart), "ConfigMap")]
    assert names == ["rq-resumequal-dashboard"]


def test_chart_provisions_the_rules_for_the_sidecar(chart: helm.Chart) -> None:
    objs = render(chart, {"grafanaAlerts": {"enabled": True}})
    for obj in objs:
        validate(obj)
    cm = named(objs, "ConfigMap", CONFIGMAP)
    assert cm["metadata"]["labels"]["grafana_alert"] == "1"
    assert cm["metadata"]["namespace"] == NAMESPACE
    provisioned = yaml.safe_load(cm["data"][FILE_KEY])
    validate_provisioning(provisioned)
    # With the default values, exactly the committed file.
    assert provisioned == _committed()


def test_chart_applies_the_alert_values(chart: helm.Chart) -> None:
    values = values_all()
    objs = render(chart, values)
    for obj in objs:
        validate(obj)
    cm = named(objs, "ConfigMap", CONFIGMAP)
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_alert"] == "resumequal"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Training"}
    provisioned = yaml.safe_load(cm["data"][FILE_KEY])
    validate_provisioning(provisioned)
    (group,) = provisioned["groups"]
    assert (group["folder"], group["interval"]) == ("Training", "30s")
    rules = _grafana_rules(provisioned)
    assert "ReconcileErrors" not in rules
    assert rules["OperatorDown"]["for"] == "10m"
    assert rules["OperatorDown"]["labels"] == {"severity": "warning", "team": "ml-platform"}
    assert rules["QualificationFailed"]["labels"] == {"severity": "critical", "team": "ml-platform"}
    for rule in rules.values():
        query = rule["data"][0]
        assert query["datasourceUid"] == "mimir"
        assert query["model"]["datasource"] == {"type": "prometheus", "uid": "mimir"}
    drift = promql(rules["ResumeDriftAboveThreshold"])
    assert "(vector(0.0005))" in drift and "1e-06" not in drift
    # The PrometheusRule rendered from the same values says the same.
    prometheus_rule = named(objs, "PrometheusRule", "rq-resumequal")
    spec = {
        r.get("alert") or r["record"]: r
        for g in prometheus_rule["spec"]["groups"]
        for r in g["rules"]
    }
    assert spec["resumequal:drift_threshold:param_rel_l2"]["expr"] == "vector(0.0005)"
    for title, rule in rules.items():
        assert rule["labels"] == spec[title]["labels"]
        assert rule["for"] == spec[title].get("for", "0s")


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"grafanaAlerts": {"enabled": "yes"}}, "/grafanaAlerts/enabled"),
        ({"grafanaAlerts": {"interval": "1 minute"}}, "/grafanaAlerts/interval"),
        ({"grafanaAlerts": {"datasourceUid": "a b"}}, "/grafanaAlerts/datasourceUid"),
        ({"grafanaAlerts": {"folder": ""}}, "/grafanaAlerts/folder"),
        ({"grafanaAlerts": {"labels": {}}}, "'labels'"),
    ],
)
def test_schema_rejects_bad_alert_values(chart: helm.Chart, values: Obj, field: str) -> None:
    with pytest.raises(helm.HelmValuesError) as e:
        render(chart, values)
    assert field in str(e.value)


# --- both renderings in a real Prometheus -----------------------------------------------

RUN_LABELS = ("namespace", "run", "pin", "scenario")
# (run, pin, scenario): passed, valid, hours since completion, rel L2, controls detected/total.
# Per-run alerts judge the latest run of each pin:
#   a: a-1 FAIL with drift, every control detected        -> Failed, Drift
#   b: b-1 FAIL, blind, large drift; b-2 PASS, newer       -> nothing
#   c: c-1 INVALID, 3 of 5 controls detected               -> Invalid, ControlBlind
#   d: d-1 PASS, its mid-graceful scenario failed          -> Failed (that scenario)
#   e: e-1 PASS, drift above the threshold                 -> Drift
Outcome = tuple[int, int, float, float | None, tuple[int, int] | None]
RUNS: list[tuple[tuple[str, str, str], Outcome]] = [
    (("a-1", "a", "resume"), (0, 1, 5, 1e-3, (5, 5))),
    (("b-1", "b", "resume"), (0, 1, 6, 1e-2, (3, 5))),
    (("b-2", "b", "resume"), (1, 1, 2, 0.0, None)),
    (("c-1", "c", "resume"), (0, 0, 5, None, (3, 5))),
    (("d-1", "d", "resume"), (1, 1, 5, 1e-9, None)),
    (("d-1", "d", "mid-graceful"), (0, 1, -1, None, None)),
    (("e-1", "e", "resume"), (1, 1, 5, 5e-5, None)),
]


class Series(Collector):
    """The qualification and operator series of the scenario, as the operator serves them."""

    def __init__(self) -> None:
        self.age_hours = 0.0  # added to every run's completion age
        self.errors = 3.0
        self.errors_grow = False

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        families = {
            name: GaugeMetricFamily(name, name, labels=RUN_LABELS)
            for name in (
                "resumequal_qualification_passed",
                "resumequal_qualification_valid",
                "resumequal_last_completion_timestamp_seconds",
                "resumequal_param_rel_l2_diff",
                "resumequal_negative_controls_detected",
                "resumequal_negative_controls_total",
            )
        }
        now = time.time()
        for (run, pin, scenario), (passed, valid, hours, rel_l2, controls) in RUNS:
            labels = ["ml", run, pin, scenario]
            families["resumequal_qualification_passed"].add_metric(labels, passed)
            families["resumequal_qualification_valid"].add_metric(labels, valid)
            if hours >= 0:  # a seed-matrix scenario has no completion time of its own
                completed = now - (hours + self.age_hours) * 3600
                families["resumequal_last_completion_timestamp_seconds"].add_metric(
                    labels, completed
                )
            if rel_l2 is not None:
                families["resumequal_param_rel_l2_diff"].add_metric(labels, rel_l2)
            if controls is not None:
                families["resumequal_negative_controls_detected"].add_metric(labels, controls[0])
                families["resumequal_negative_controls_total"].add_metric(labels, controls[1])
        yield from families.values()
        if self.errors_grow:
            self.errors += 1
        errors = CounterMetricFamily(
            "resumequal_operator_reconcile_errors", "errors", labels=["namespace", "pod"]
        )
        errors.add_metric(["resumequal", "rq-0"], self.errors)
        yield errors


def _run(run: str, pin: str, scenario: str) -> frozenset[tuple[str, str]]:
    return frozenset({"namespace": "ml", "run": run, "pin": pin, "scenario": scenario}.items())


PER_RUN: dict[str, Instances] = {
    "QualificationFailed": {_run("a-1", "a", "resume"), _run("d-1", "d", "mid-graceful")},
    "QualificationInvalid": {_run("c-1", "c", "resume")},
    "ResumeDriftAboveThreshold": {_run("a-1", "a", "resume"), _run("e-1", "e", "resume")},
    "NegativeControlBlind": {_run("c-1", "c", "resume")},
}


def _prometheus_outcome(
    prometheus: Any, rule_labels: dict[str, dict[str, str]]
) -> dict[str, Instances]:
    """Per alert, the series Prometheus' rule engine has active (pending or firing)."""
    outcome: dict[str, Instances] = {name: set() for name in rule_labels}
    for alert in prometheus.alerts():
        name = alert["labels"]["alertname"]
        drop = {"alertname", *rule_labels[name]}
        outcome[name].add(frozenset((k, v) for k, v in alert["labels"].items() if k not in drop))
    return outcome


def _grafana_outcome(prometheus: Any, rules: dict[str, Obj]) -> dict[str, Instances]:
    """Per alert, the series Grafana alerts for: its query run by Prometheus, then its nodes."""
    return {
        name: alerting_instances(rule, prometheus.query(promql(rule)))
        for name, rule in rules.items()
    }


@pytest.mark.slow
@pytest.mark.waits
@pytest.mark.timeout(180)
def test_both_renderings_fire_on_the_same_series(chart: helm.Chart, tmp_path: Path) -> None:
    require("prometheus")
    objs = render(chart, {"grafanaAlerts": {"enabled": True}})
    groups = named(objs, "PrometheusRule", "rq-resumequal")["spec"]["groups"]
    rule_file = tmp_path / "prometheusrule.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": groups}))
    rule_labels = {r["alert"]: r["labels"] for g in groups for r in g["rules"] if "alert" in r}
    grafana = _grafana_rules(yaml.safe_load(named(objs, "ConfigMap", CONFIGMAP)["data"][FILE_KEY]))
    assert set(grafana) == set(rule_labels)
    # A lower threshold, as the chart renders it: only a-1 (1e-3) is above 1e-4.
    low = _grafana_rules(
        _provisioned(
            chart, {"grafanaAlerts": {"enabled": True}, "prometheusRule": {"driftThreshold": 1e-4}}
        )
    )

    series = Series()
    registry = CollectorRegistry()
    registry.register(series)
    standby_job = f"{JOB}-standby"
    with ExitStack() as standby_up, metrics_endpoint(registry) as target:
        standby_port = standby_up.enter_context(metrics_endpoint(CollectorRegistry()))
        with running_prometheus(tmp_path, target, [rule_file], {standby_job: standby_port}) as prom:

            def settled(expected: dict[str, Instances]) -> dict[str, Instances]:
                """Prometheus' outcome once it is ``expected``, and Grafana's at that moment."""
                with suppress(AssertionError):  # a timeout: the comparison below says how
                    prom.wait_for(
                        "the scenario's alerts",
                        lambda: _prometheus_outcome(prom, rule_labels) == expected,
                    )
                assert _prometheus_outcome(prom, rule_labels) == expected
                return _grafana_outcome(prom, grafana)

            # Every qualification series carries the scrape's job and instance too.
            scrape = {("job", JOB), ("instance", f"127.0.0.1:{target}")}
            per_run = {name: {run | scrape for run in runs} for name, runs in PER_RUN.items()}
            quiet: dict[str, Instances] = {
                "NoPassingQualification": set(), "OperatorDown": set(), "ReconcileErrors": set(),
            }  # fmt: skip
            assert settled({**per_run, **quiet}) == {**per_run, **quiet}
            drift = low["ResumeDriftAboveThreshold"]
            assert alerting_instances(drift, prom.query(promql(drift))) == {
                _run("a-1", "a", "resume") | scrape
            }

            # Every run 30 h older (the latest of each pin unchanged, so no pass within
            # 26 h), the standby operator gone, reconcile errors growing.
            series.age_hours = 30
            series.errors_grow = True
            standby_up.close()
            broken: dict[str, Instances] = {
                **per_run,
                "NoPassingQualification": {frozenset()},
                "OperatorDown": {
                    frozenset({"job": standby_job, "instance": f"127.0.0.1:{standby_port}"}.items())
                },
                "ReconcileErrors": {
                    frozenset(
                        {
                            "job": JOB,
                            "instance": f"127.0.0.1:{target}",
                            "namespace": "resumequal",
                            "pod": "rq-0",
                        }.items()
                    )
                },
            }
            assert settled(broken) == broken
