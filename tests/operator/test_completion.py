"""A leg is done when every rank is, not when the elastic PyTorchJob says Succeeded.

The training operator v1.9 marks an elastic job Succeeded as soon as one worker succeeded
(pytorchjob_controller.go, PR #1752), and with cleanPodPolicy Running it would then delete
the pods of ranks still writing their last trace segments and final checkpoint. torchrun's
exit barrier holds a finished agent until the others finish, but only for 300 s: a rank
slower than that (here the barrier is shortened to 1 s) is what this guards against.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from resumequal.run.location import RunLocation
from resumequal.store.s3settings import S3Settings
from resumequal_operator.kube import PYTORCHJOBS, QUALIFICATION_RUNS
from testing.cluster.node.scriptnode import NodeRuntime
from testing.cluster.podcluster import PodCluster
from testing.cluster.testapi import RealAPI
from testing.operator.harness import NAMESPACE, Operators, qr, run_manifest, wait_phase
from testing.operator.workers import Workers
from tests.waiting import eventually

SLOW_S = 4.0  # how long rank 1 still writes after its last step
BARRIER_S = 1.0  # torchrun's exit barrier, shortened from its 300 s


def _succeeded(api: RealAPI, job: str) -> bool:
    obj = api.get(PYTORCHJOBS.plural, NAMESPACE, job) or {}
    return any(c["type"] == "Succeeded" and c["status"] == "True"
               for c in (obj.get("status") or {}).get("conditions", []))


@pytest.fixture
def pods(pod_cluster: PodCluster, workers: Workers) -> Iterator[PodCluster]:
    """The pod cluster, rank 1 slow to finish and torchrun's exit barrier short."""
    workers.finish_seconds = {1: SLOW_S}
    pod_cluster.scripts.bind(lambda: NodeRuntime(workers, exit_barrier_timeout=BARRIER_S))
    try:
        yield pod_cluster
    finally:
        pod_cluster.scripts.unbind()


def test_the_comparison_waits_for_the_last_rank_and_no_pod_is_deleted_under_it(
    api: RealAPI, operators: Operators, pods: PodCluster, store: dict[str, str],
) -> None:
    seen = api.watch("pods")
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("slow-rank", store))
    job = eventually(lambda: qr(api, "slow-rank").get("status", {}).get("legs", {}).get(
        "control", {}).get("job"), what="the control leg's job", timeout=60)
    # Rank 0 finished: the elastic job is Succeeded while rank 1 still writes.
    eventually(lambda: _succeeded(api, job), timeout=60, what="the first worker's success")
    status = qr(api, "slow-rank")["status"]
    assert status["legs"]["control"].get("finishedAt") is None
    assert status["phase"] != "Comparing"
    # cleanPodPolicy None: the training operator deletes nothing under the writing rank.
    assert not [e for e in seen() if e.object["metadata"]["name"].startswith(job)
                and (e.type == "DELETED" or e.object["metadata"].get("deletionTimestamp"))]

    done = wait_phase(api, "slow-rank", ("Succeeded", "Failed"), timeout=120)
    assert done["status"]["phase"] == "Succeeded"
    location = RunLocation.open(done["status"]["runUri"], S3Settings(
        endpoint_url=store["endpointUrl"], region=store["region"], addressing_style="path"))
    assert location.ranks_done("control") == {0, 1}
    assert done["status"]["legs"]["control"]["steps"] == 6
