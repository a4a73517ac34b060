"""The Grafana dashboard: the committed JSON is what tools/dashboard.py builds, and every
panel queries metrics that exist, filtered by the namespace and pin variables."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from resumequal.results.metrics import RUN_LABELS, QualificationMetrics
from resumequal.results.verdict import Result
from resumequal_operator import opmetrics
from tests.chart.monitoring import metric_names
from tests.chart.prometheus import metrics_endpoint, running_prometheus
from tests.tools import require
from tests.unit.report_samples import make_report, with_forensics

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "charts/resumequal/files/dashboard.json"
ALERTS = ROOT / "charts/resumequal/files/alerts.yaml"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboard_tool", ROOT / "tools/dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def board(tool: ModuleType) -> dict[str, Any]:
    built: dict[str, Any] = tool.build()
    return built


def _panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def _exprs(board: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _panels(board) for t in p.get("targets", [])]


def test_committed_json_is_current(tool: ModuleType) -> None:
    assert COMMITTED.read_text(encoding="utf-8") == tool.render(), (
        "charts/resumequal/files/dashboard.json is stale: run python tools/dashboard.py --write"
    )
    assert tool.main(["--check"]) == 0


def test_check_fails_on_a_stale_file(
    tool: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "dashboard.json"
    stale.write_text("{}\n")
    monkeypatch.setattr(tool, "OUTPUT", stale)
    assert tool.main(["--check"]) == 1
    assert tool.main(["--write"]) == 0
    assert tool.main(["--check"]) == 0


def test_variables(board: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "pin"}
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("namespace", "pin"):
        assert variables[name]["multi"] and variables[name]["includeAll"]
        assert f", {name})" in variables[name]["query"]
    assert '{namespace=~"$namespace"}' in variables["pin"]["query"]


def test_panels_cover_what_operators_need(board: dict[str, Any]) -> None:
    exprs = "\n".join(_exprs(board))
    for family in (
        "resumequal_qualification_passed",
        "resumequal_qualification_valid",
        "resumequal_first_divergent_step",
        "resumequal_param_max_abs_diff",
        "resumequal_param_rel_l2_diff",
        "resumequal_param_mismatch_fraction",
        "resumequal_loss_max_abs_diff",
        "resumequal_restart_seconds",
        "resumequal_phase_duration_seconds_bucket",
        "resumequal_negative_controls_detected",
        "resumequal_negative_controls_total",
        "resumequal_runs_total",
        "resumequal_operator_reconcile_errors_total",
        "resumequal_operator_queue_depth",
    ):
        assert family in exprs, f"no panel shows {family}"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in _panels(board):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["title"] and p["description"]
        assert p["gridPos"]["w"] <= 24


def test_queries_use_existing_metrics_and_the_variables(board: dict[str, Any]) -> None:
    known = metric_names() | {"resumequal:drift_threshold:param_rel_l2"}
    registry = CollectorRegistry()
    QualificationMetrics(registry)
    # The gauges carry the per-run labels namespace, run, pin and scenario.
    per_run = {f.name for f in registry.collect() if f.type == "gauge"}
    for expr in _exprs(board):
        for name in re.findall(r"\bresumequal[a-z0-9_:]*", expr):
            assert name in known, f"{expr}: no metric {name}"
        for name in re.findall(r"\b(resumequal_[a-z0-9_]+)(\{[^}]*\})?", expr):
            if name[0] in per_run:
                assert name[1] == '{namespace=~"$namespace", pin=~"$pin"}', expr
    assert set(RUN_LABELS) >= {"namespace", "pin"}


def test_verdict_panel_maps_every_verdict(board: dict[str, Any]) -> None:
    (verdict,) = [p for p in _panels(board) if p["type"] == "state-timeline"]
    (mapping,) = verdict["fieldConfig"]["defaults"]["mappings"]
    texts = {k: v["text"] for k, v in mapping["options"].items()}
    assert texts == {"2": "PASS", "1": "FAIL", "0": "INVALID"}
    json.dumps(verdict)  # serialisable as it is


def _as_grafana_sends(expr: str) -> str:
    """The query with the dashboard's variables as Grafana substitutes them for "All"."""
    for variable, value in {
        "$namespace": ".*",
        "$pin": ".*",
        "$__range": "1h",
        "$__rate_interval": "1m",
    }.items():
        expr = expr.replace(variable, value)
    return expr


@pytest.mark.slow
@pytest.mark.waits
@pytest.mark.timeout(120)
def test_every_query_runs_in_prometheus(board: dict[str, Any], tmp_path: Path) -> None:
    require("prometheus")
    registry = CollectorRegistry()
    operator = opmetrics.OperatorMetrics(registry)
    report = with_forensics(make_report(Result.FAIL))
    with (
        metrics_endpoint(registry) as target,
        running_prometheus(tmp_path, target, [ALERTS]) as prometheus,
    ):
        # Counters and histograms are scraped at zero first, so increase() sees the run.
        prometheus.wait_for("two scrapes", lambda: prometheus.query("count_over_time(up[1h]) >= 2"))
        operator.qualification.record(report, namespace="ml")
        prometheus.wait_for(
            "the run in the alert records",
            lambda: prometheus.query("count_over_time(resumequal:qualification_latest[1h]) >= 2"),
        )
        results = {expr: prometheus.query(_as_grafana_sends(expr)) for expr in _exprs(board)}
    (verdict,) = [p for p in _panels(board) if p["type"] == "state-timeline"]
    (series,) = results[verdict["targets"][0]["expr"]]
    assert series["metric"] == {"namespace": "ml", "pin": report.pin}
    assert series["value"][1] == "1"  # FAIL
    (runs,) = [p for p in _panels(board) if p["title"].startswith("Runs by result")]
    by_result = {
        s["metric"]["result"]: float(s["value"][1]) for s in results[runs["targets"][0]["expr"]]
    }
    assert by_result["FAIL"] > 0 and by_result["PASS"] == 0
    # Every panel about the recorded run has data; the operator's rates may not yet.
    empty = [e for e, r in results.items() if not r and "resumequal_operator_" not in e]
    assert empty == []
