"""The chart's alert rules in a real Prometheus scraping the operator's own ``/metrics``.

A QualificationRun whose comparator says FAIL is driven through the operator (the pod
cluster: the real API server, controllers and Kubeflow training operator; SeaweedFS S3);
Prometheus, configured like the chart's ServiceMonitor (job ``resumequal-operator``,
honorLabels), must fire ``QualificationFailed`` naming the run, and let it resolve once the
run is deleted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from resumequal.results.verdict import Result
from resumequal_operator.kube import QUALIFICATION_RUNS
from testing.cluster.podcluster import PodCluster
from testing.cluster.testapi import RealAPI
from testing.operator.harness import NAMESPACE, Operators, run_manifest, wait_phase
from tests.chart.prometheus import JOB, Prometheus, running_prometheus
from tests.exposition import samples, scrape, value
from tests.tools import require
from tests.waiting import eventually

ALERTS = Path(__file__).resolve().parents[2] / "charts/resumequal/files/alerts.yaml"
RUN = "nightly-fail"
PIN = "train:2026-11-29"  # pin_of() of run_manifest's image


@pytest.fixture
def verdict_result() -> Result:
    return Result.FAIL


def _active(prometheus: Prometheus, name: str) -> list[dict[str, Any]]:
    """The pending or firing alerts named ``name``."""
    return [a for a in prometheus.alerts() if a["labels"]["alertname"] == name]


# About 10 s (Prometheus' start overlaps the run): under the suite's bar for slow.
@pytest.mark.timeout(240)
def test_a_failed_run_fires_qualification_failed_until_it_is_deleted(
    api: RealAPI, operators: Operators, pods: PodCluster,
    store: dict[str, str], tmp_path: Path,
) -> None:
    require("prometheus")
    op = operators.start()
    port = op.health.port
    # Prometheus starts while the qualification runs.
    with running_prometheus(tmp_path, port, [ALERTS]) as prometheus:
        api.create(QUALIFICATION_RUNS.plural, run_manifest(RUN, store))
        done = wait_phase(api, RUN, ("Succeeded", "Failed"), timeout=120)
        assert done["status"]["verdict"]["result"] == "FAIL", done["status"]
        assert done["status"]["pin"] == PIN

        def failed() -> list[dict[str, Any]]:
            return [a for a in _active(prometheus, "QualificationFailed")
                    if a["state"] == "firing"]

        (alert,) = prometheus.wait_for("firing QualificationFailed", failed, timeout=30)
        labels = alert["labels"]
        assert (labels["namespace"], labels["run"], labels["pin"]) == (NAMESPACE, RUN, PIN)
        assert labels["scenario"] == "resume" and labels["severity"] == "critical"
        assert labels["job"] == JOB
        assert f"run {NAMESPACE}/{RUN} failed" in alert["annotations"]["summary"]

        # Valid (not INVALID), no negative controls to miss (0 of 0), the target up. The
        # simulated comparator's drift (relative L2 0.01) is above the default threshold.
        by_state = {(a["labels"]["alertname"], a["state"]) for a in prometheus.alerts()}
        assert {n for n, s in by_state if s == "firing"} == {
            "QualificationFailed", "ResumeDriftAboveThreshold"}, by_state
        for silent in ("QualificationInvalid", "NegativeControlBlind", "OperatorDown"):
            assert not _active(prometheus, silent), prometheus.alerts()
        assert [s["value"][1] for s in prometheus.query(f'up{{job="{JOB}"}}')] == ["1"]

        # The operator's own families came through the same scrape.
        reconciles = {s["metric"]["result"]: float(s["value"][1]) for s in
                      prometheus.query(f'resumequal_operator_reconcile_total{{job="{JOB}"}}')}
        assert set(reconciles) == {"success", "requeue", "error"} and reconciles["requeue"] > 0
        (depth,) = prometheus.query(f'resumequal_operator_queue_depth{{job="{JOB}"}}')
        assert float(depth["value"][1]) >= 0

        # Deleting the run removes its series from /metrics; the alert resolves.
        api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, RUN)
        api.wait_for(lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, RUN) is None,
                     10, "the finalizer to let the run go")
        eventually(lambda: not [s for s in samples(scrape(port)) if s.labels.get("run") == RUN],
                   what="the run's series gone")
        assert (value(scrape(port), "resumequal_operator_reconcile_total", result="success")
                or 0) > 0
        prometheus.wait_for("QualificationFailed to resolve",
                            lambda: not _active(prometheus, "QualificationFailed"), timeout=15)
        assert prometheus.query(f'resumequal_qualification_passed{{run="{RUN}"}}') == []
