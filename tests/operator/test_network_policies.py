"""Each leg's pods admit connections only from the same leg's pods: the operator creates a
NetworkPolicy per leg before the leg's job, owned by the run, valid under Kubernetes' own
schema; none with ``--no-network-policies``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resumequal.run.location import RunLocation
from resumequal_operator import pytorchjob
from resumequal_operator.backend import Notice, RunRef, observe_zoom
from resumequal_operator.kube import JOBS, NETWORK_POLICIES, PYTORCHJOBS, QUALIFICATION_RUNS, Kube
from resumequal_operator.validation import parse_run_spec
from testing.cluster.podcluster import PodCluster
from testing.cluster.testapi import RealAPI
from testing.k8s_schemas import validate_core
from testing.operator.harness import NAMESPACE, Admission, Operators, run_manifest, wait_phase
from tests.waiting import eventually

# The label the training operator puts on a job's pods (kubeflow/training-operator
# pkg/apis/kubeflow.org/v1/common_types.go, JobNameLabel).
JOB_NAME = "training.kubeflow.org/job-name"


def _selects(policy: dict[str, Any], pod: dict[str, Any]) -> bool:
    wanted = policy["spec"]["podSelector"]["matchLabels"]
    return wanted.items() <= (pod["metadata"].get("labels") or {}).items()


def test_each_leg_admits_only_its_own_pods(
    api: RealAPI, operators: Operators, store: dict[str, str], admission: Admission,
    pods: PodCluster,  # runs the legs' pods
) -> None:
    operators.start()
    run = api.create(QUALIFICATION_RUNS.plural, run_manifest("fenced", store))
    uid = run["metadata"]["uid"]
    wait_phase(api, "fenced", ("LegsRunning", "Armed", "Preempted"), timeout=120)
    jobs = eventually(lambda: (len(api.list(PYTORCHJOBS.plural, NAMESPACE)) == 2
                      and api.list(PYTORCHJOBS.plural, NAMESPACE)) or None, what="both legs")
    policies = {p["metadata"]["name"]: p for p in api.list(NETWORK_POLICIES.plural, NAMESPACE)}
    assert sorted(policies) == sorted(j["metadata"]["name"] for j in jobs)
    assert admission.validated["NetworkPolicy"] == 2  # Kubernetes' strict schema
    pods = eventually(lambda: (len(api.list("pods", NAMESPACE)) == 4
                      and api.list("pods", NAMESPACE)) or None, what="2 pods per leg",
                      timeout=60)
    for job in jobs:
        name = job["metadata"]["name"]
        # A list's items come without their apiVersion and kind.
        policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                  **policies[name]}
        validate_core(policy)
        # Created first: no pod of the leg is ever up without it.
        assert int(policy["metadata"]["resourceVersion"]) < \
            int(job["metadata"]["resourceVersion"])
        assert policy["metadata"]["ownerReferences"][0]["uid"] == uid  # deleted with the run
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        [rule] = policy["spec"]["ingress"]
        assert rule == {"from": [{"podSelector": policy["spec"]["podSelector"]}]}
        own = {p["metadata"]["name"] for p in pods
               if p["metadata"]["labels"].get(JOB_NAME) == name}
        assert len(own) == 2
        # It selects (isolates) exactly the leg's pods, and admits exactly them.
        assert {p["metadata"]["name"] for p in pods if _selects(policy, p)} == own


def test_no_policies_when_turned_off(
    api: RealAPI, operators: Operators, store: dict[str, str],
) -> None:
    operators.start(network_policies=False)
    api.create(QUALIFICATION_RUNS.plural, run_manifest("open", store))
    eventually(lambda: len(api.list(PYTORCHJOBS.plural, NAMESPACE)) == 2 or None,
               what="both legs")
    assert api.created(NETWORK_POLICIES.plural) == []


def test_the_zoom_jobs_pod_admits_only_itself(api: RealAPI, tmp_path: Path) -> None:
    obj = api.create(QUALIFICATION_RUNS.plural,
                     run_manifest("zoomed", {"uri": f"file://{tmp_path}/s"}, zoom="onFail"))
    ref, spec = RunRef.of(obj), parse_run_spec(obj["spec"])
    notices: list[Notice] = []
    observe_zoom(Kube(api.api_client()), ref, spec, RunLocation.open(f"{tmp_path}/s"), None,
                 notices, key_secret="zoomed-checkpoint-key-x7k2q")
    [policy] = api.created(NETWORK_POLICIES.plural)
    [job] = api.created(JOBS.plural)
    validate_core(policy)
    assert policy["metadata"]["name"] == job["metadata"]["name"]
    pod = {"metadata": job["spec"]["template"]["metadata"]}
    assert _selects(policy, pod)
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        pytorchjob.UID_LABEL: ref.uid, pytorchjob.COMPONENT: "zoom"}
    # Not a leg's pod: a leg's policy does not admit the zoom, nor the zoom's a leg.
    leg_pod = {"metadata": {"labels": pytorchjob.labels("zoomed", ref.uid, "control")}}
    assert not _selects(policy, leg_pod)
