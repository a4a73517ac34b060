"""Every request the operator makes to the API server but a watch is timed, by verb and
resource, answered or refused: what of a reconcile's time the API server takes."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from resumequal.errors import ClusterError
from resumequal_operator.kube import QUALIFICATION_RUNS, SECRETS, Kube
from resumequal_operator.manager import Operator, Settings
from testing.operator.harness import FAST, NAMESPACE, run_manifest

HISTOGRAM = "resumequal_operator_api_request_duration_seconds"


def _count(registry: CollectorRegistry, verb: str, resource: str) -> float:
    value = registry.get_sample_value(f"{HISTOGRAM}_count",
                                      {"verb": verb, "resource": resource})
    return 0.0 if value is None else value


def test_each_verb_is_timed_under_its_resource_refusals_included(kube: Kube) -> None:
    registry = CollectorRegistry()
    # Built, never started: its metrics are the kube's observer, and nothing else calls.
    Operator(kube, Settings(namespaces=(NAMESPACE,), port=0, host="127.0.0.1", **FAST),
             registry=registry)
    name = "timed"
    kube.create(QUALIFICATION_RUNS, NAMESPACE, run_manifest(name, {"uri": "s3://b/runs"}))
    run = kube.get(QUALIFICATION_RUNS, NAMESPACE, name)
    kube.list(QUALIFICATION_RUNS, NAMESPACE)
    kube.patch(QUALIFICATION_RUNS, NAMESPACE, name, {"status": {"phase": "Pending"}},
               sub="status")
    run = kube.get(QUALIFICATION_RUNS, NAMESPACE, name)
    kube.replace(QUALIFICATION_RUNS, NAMESPACE, run, sub="status")
    with pytest.raises(ClusterError):
        kube.get(SECRETS, NAMESPACE, "absent")
    kube.delete(QUALIFICATION_RUNS, NAMESPACE, name)
    plural = QUALIFICATION_RUNS.plural
    assert {(verb, resource): _count(registry, verb, resource) for verb, resource in [
        ("create", plural), ("get", plural), ("list", plural), ("patch", f"{plural}/status"),
        ("update", f"{plural}/status"), ("delete", plural), ("get", "secrets")]} == {
        ("create", plural): 1, ("get", plural): 2, ("list", plural): 1,
        ("patch", f"{plural}/status"): 1, ("update", f"{plural}/status"): 1,
        ("delete", plural): 1, ("get", "secrets"): 1}
    total = registry.get_sample_value(f"{HISTOGRAM}_sum", {"verb": "get", "resource": plural})
    assert total is not None and 0 < total < 30


def test_a_kube_of_its_own_times_nothing(kube: Kube) -> None:
    assert kube.observe is None
    kube.list(QUALIFICATION_RUNS, NAMESPACE)  # no observer: nothing to call
