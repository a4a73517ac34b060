"""The operator brings its CRD up to date at start-up (Helm never upgrades ``crds/``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from resumequal_operator.crd import CRD_NAME, DIGEST_ANNOTATION, build_crd
from resumequal_operator.crdsync import CRDS, CRDMismatch, ensure_crd
from resumequal_operator.kube import QUALIFICATION_RUNS, Kube
from testing.cluster.testapi import RealAPI
from testing.operator.harness import NAMESPACE, run_manifest
from tests.waiting import eventually


def _old_crd() -> dict[str, Any]:
    """The CRD an earlier chart installed: no digest, and a status without comparatorJob."""
    crd = copy.deepcopy(build_crd())
    del crd["metadata"]["annotations"]
    status = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
    del status["properties"]["comparatorJob"]
    return crd


def _status_survives(api: RealAPI, name: str) -> bool:
    """Whether a status field of the current schema is stored, or pruned."""
    api.create(QUALIFICATION_RUNS.plural, run_manifest(name, {"uri": "s3://b/runs"}))
    api.patch_status(QUALIFICATION_RUNS.plural, NAMESPACE, name,
                     {"phase": "Comparing", "comparatorJob": f"{name}-compare-1"})
    stored = api.get(QUALIFICATION_RUNS.plural, NAMESPACE, name)
    assert stored is not None
    return (stored.get("status") or {}).get("comparatorJob") == f"{name}-compare-1"


def test_an_old_crd_left_by_a_helm_upgrade_is_updated(api: RealAPI, kube: Kube) -> None:
    api.register_crd(_old_crd())
    # What happens without the start-up check: the new status field is pruned.
    assert ensure_crd(kube, "skip") == "skipped"
    assert not _status_survives(api, "before")
    assert ensure_crd(kube, "apply") == "updated"
    installed = kube.get(CRDS, None, CRD_NAME)
    assert installed["metadata"]["annotations"][DIGEST_ANNOTATION] == \
        build_crd()["metadata"]["annotations"][DIGEST_ANNOTATION]
    # The API server serves the new schema once its handler for the CRD has been rebuilt
    # from the update (apiextensions-apiserver's crdHandler): moments later, not at once.
    tries = iter(range(100))
    eventually(lambda: _status_survives(api, f"after-{next(tries)}"), timeout=10,
               what="the updated schema served")
    assert ensure_crd(kube, "apply") == "current"  # idempotent: nothing written again


def test_a_missing_crd_is_created(api: RealAPI, kube: Kube) -> None:
    api.delete("customresourcedefinitions", "", CRD_NAME)
    assert ensure_crd(kube, "apply") == "created"
    assert ensure_crd(kube, "verify") == "current"


def test_verify_refuses_to_start_on_an_old_crd(api: RealAPI, kube: Kube) -> None:
    api.register_crd(_old_crd())
    with pytest.raises(CRDMismatch, match=r"schema digest \(none\)"):
        ensure_crd(kube, "verify")
    api.delete("customresourcedefinitions", "", CRD_NAME)
    with pytest.raises(CRDMismatch, match="not installed"):
        ensure_crd(kube, "verify")


def test_the_chart_ships_the_crd_the_operator_expects(api: RealAPI, kube: Kube) -> None:
    # The fixture installs the chart's crds/ file: a fresh install is current at once.
    assert ensure_crd(kube, "verify") == "current"
