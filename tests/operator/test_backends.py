"""Which backend runs a run's legs: ``spec.backend``, else the operator's default, fixed when
the run starts; a TrainJob run on an operator that does not run TrainJobs is refused."""

from __future__ import annotations

import time

import pytest

from resumequal_operator.kube import PYTORCHJOBS, QUALIFICATION_RUNS, TRAINJOBS
from resumequal_operator.legjobs import TrainerSettings
from resumequal_operator.trainjob import leg_runtime
from testing.cluster.testapi import RealAPI
from testing.operator.harness import Admission, Operators, condition, qr, run_manifest, wait_phase

pytestmark = pytest.mark.timeout(60)


def test_a_trainjob_run_on_an_operator_without_trainjobs_is_refused_before_anything(
        api: RealAPI, operators: Operators, store: dict[str, str]) -> None:
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("tj", store, backend="trainjob"))
    done = wait_phase(api, "tj", "Failed")
    ready = condition(done, "Ready")
    assert ready["reason"] == "NotAllowed"
    assert ready["message"].startswith("spec.backend: trainjob: this operator does not run "
                                       "TrainJobs"), ready
    assert api.created(PYTORCHJOBS.plural) == [] and api.created("secrets") == []


def test_the_default_backend_is_pinned_when_the_run_starts(
        api: RealAPI, operators: Operators, store: dict[str, str],
        admission: Admission) -> None:
    api.register_trainer_crds()
    api.create("clustertrainingruntimes", leg_runtime())
    op = operators.start(default_backend="trainjob", trainer=TrainerSettings())
    api.create(QUALIFICATION_RUNS.plural, run_manifest("pinned", store))
    run = api.wait_for(lambda: (r := qr(api, "pinned")).get("status", {}).get("legs", {}).get(
        "preempted", {}).get("job") and r, 20, "both legs launched")
    assert run["status"]["backend"] == "trainjob"
    assert run["status"]["machine"]["runSpec"]["backend"] == "trainjob"
    # Both legs' TrainJobs are created at once: which is stored first is not fixed.
    assert sorted(leg["job"] for leg in run["status"]["legs"].values()) == sorted(
        t["metadata"]["name"] for t in api.created(TRAINJOBS.plural))
    assert admission.validated["TrainJob"] == 2
    # A new default does not move a started run: it keeps observing its TrainJobs.
    operators.stop(op)
    again = operators.start(default_backend="pytorchjob", trainer=TrainerSettings())
    before = again.reconciles
    api.wait_for(lambda: again.reconciles > before + 5, 20, "reconciles by the new operator")
    time.sleep(0.2)
    assert api.created(PYTORCHJOBS.plural) == []
    assert qr(api, "pinned")["status"]["backend"] == "trainjob"
    assert len(api.created(TRAINJOBS.plural)) == 2
