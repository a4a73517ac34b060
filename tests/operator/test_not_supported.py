"""A run whose spec needs a feature its ``stack.torchVersion`` lacks ends Failed,
NotSupported, naming the feature, before any object is created; on a torch that has the
feature the same spec proceeds."""

from __future__ import annotations

from resumequal_operator.kube import JOBS, PYTORCHJOBS, QUALIFICATION_RUNS
from testing.cluster.testapi import RealAPI
from testing.operator.harness import Operators, condition, events, run_manifest, wait_phase
from tests.waiting import eventually

FSDP2 = {"parallelism": {"kind": "fsdp2"}}


def _created_for(api: RealAPI, run: str) -> list[str]:
    """Everything ever created for ``run``: jobs, PyTorchJobs, its checkpoint key Secret."""
    return [f"{plural}/{o['metadata']['name']}"
            for plural in (PYTORCHJOBS.plural, JOBS.plural, "secrets")
            for o in api.created(plural)
            if (o["metadata"].get("labels") or {}).get("resumequal.dev/run") == run]


def test_a_feature_the_images_torch_lacks_is_refused_before_anything_is_created(
    api: RealAPI, operators: Operators, store: dict[str, str],
) -> None:
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "old-torch", store, stack={"torchVersion": "2.6.0"}, **FSDP2))
    failed = wait_phase(api, "old-torch", "Failed")
    ready = condition(failed, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NotSupported")
    assert ready["message"] == (
        "spec.stack.torchVersion: parallelism.kind=fsdp2 (fsdp2) is not supported by torch "
        "2.6.0: it needs FSDP2's custom reduce-scatter (FSDPModule.set_custom_reduce_scatter), "
        "first in torch 2.9.0")
    assert condition(failed, "Qualified")["reason"] == "NotSupported"
    assert failed["status"]["verdict"]["result"] == "INVALID"
    [(reason, kind, message)] = events(api, "old-torch")
    assert (reason, kind, message) == ("NotSupported", "Warning", ready["message"])
    assert _created_for(api, "old-torch") == []

    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "new-torch", store, stack={"torchVersion": "2.9.1"}, **FSDP2))
    wait_phase(api, "new-torch", "LegsRunning")
    assert eventually(
        lambda: [n for n in _created_for(api, "new-torch") if n.startswith(PYTORCHJOBS.plural)]
        or None, what="the supported run's PyTorchJobs")
