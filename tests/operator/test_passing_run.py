"""One QualificationRun from apply to a PASS verdict on the pod cluster, shared by focused
tests: the kill, the verdict, the legs' progress, events, owned objects, the checkpoint
key, metrics, the cache, deletion and retention.

Its own module: the run lives until the module's last test, and the pod cluster's other
tests sweep the test namespace when they end.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

from resumequal.run.location import RunLocation
from resumequal.store.s3settings import S3Settings
from resumequal_operator import pytorchjob
from resumequal_operator.kube import JOBS, PYTORCHJOBS, QUALIFICATION_RUNS
from resumequal_operator.manager import Operator
from testing.cluster.node.scriptnode import NodeRuntime
from testing.cluster.podcluster import PodCluster
from testing.cluster.proxy import Deletion
from testing.cluster.testapi import History, RealAPI
from testing.operator.harness import (
    NAMESPACE,
    Admission,
    Operators,
    condition,
    events,
    live,
    qr,
    run_manifest,
    s3_store,
    store_s3,
    wait_phase,
)
from testing.operator.workers import Workers
from tests.exposition import scrape, value
from tests.s3server import use_dummy_credentials
from tests.waiting import eventually

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS

Obj = dict[str, Any]


@dataclass
class Finished:
    """One run applied and qualified (PASS, hard pod kill), shared by the focused tests."""

    api: RealAPI
    op: Operator
    run: Obj
    store: dict[str, str]
    admission: Admission
    runs: History  # the QualificationRuns' watch, from before the run was applied

    @property
    def status(self) -> Obj:
        return dict(self.run["status"])

    def kills(self) -> list[Deletion]:
        return self.api.deletions_of("pods")


LABELS = {"namespace": NAMESPACE, "pin": "train:2026-11-29", "run": "nightly",
          "scenario": "resume"}


@pytest.fixture(scope="module")
def finished(s3_server: SeaweedFS, pod_cluster: PodCluster) -> Iterator[Finished]:
    """A QualificationRun from apply to verdict against scripted workers."""
    with pytest.MonkeyPatch.context() as mp:
        use_dummy_credentials(mp)
        api = RealAPI(pod_cluster.api, NAMESPACE)
        admission = Admission()
        api.add_validator(admission)
        store = s3_store(s3_server.endpoint, s3_server.new_bucket())
        workers = Workers(s3=store_s3(store))
        pod_cluster.scripts.bind(lambda: NodeRuntime(workers))
        ops = Operators(api, endpoints=(s3_server.endpoint,))
        try:
            runs = api.watch(QUALIFICATION_RUNS.plural)
            op = ops.start()
            api.create(QUALIFICATION_RUNS.plural, run_manifest("nightly", store))
            run = wait_phase(api, "nightly", ("Succeeded", "Failed"), timeout=120)
            assert run["status"]["phase"] == "Succeeded", condition(run, "Ready")
            yield Finished(api, op, run, store, admission, runs)
        finally:
            try:
                ops.stop_all()
                api.close()
            finally:
                pod_cluster.scripts.unbind()


def test_the_beacons_pod_is_killed_hard(finished: Finished) -> None:
    # worker-1 (not worker-0, which hosts the rendezvous), deleted with grace 0.
    [kill] = finished.kills()
    assert kill.name.endswith("-worker-1") and kill.grace_period_seconds == 0
    preemption = finished.status["preemption"]
    assert preemption["pod"] == kill.name
    assert preemption["mode"] == "hard" and preemption["rank"] == 1


def test_the_verdict_conditions_and_printer_fields(finished: Finished) -> None:
    status, run = finished.status, finished.run
    v = status["verdict"]
    assert v["result"] == "PASS" and v["firstDivergenceSummary"] == "none"
    assert v["exactThroughStep"] == 6 and v["paramMaxAbsDiff"] == 0.0
    assert condition(run, "Ready")["status"] == "True"
    assert condition(run, "Qualified")["status"] == "True"
    assert status["pin"] == "train:2026-11-29"
    assert status["observedGeneration"] == run["metadata"]["generation"]
    uid = run["metadata"]["uid"]
    assert status["runUri"] == f"{finished.store['uri']}/{NAMESPACE}/nightly/{uid}"
    assert status["reportUrl"] == f"{status['runUri']}/report.html"
    assert status["comparatorJob"].startswith("nightly-compare-")


def test_the_legs_progress(finished: Finished) -> None:
    legs = finished.status["legs"]
    assert legs["preempted"]["attempts"] == 2 and legs["preempted"]["steps"] == 6
    assert legs["control"]["attempts"] == 1 and legs["control"]["steps"] == 6
    assert legs["preempted"]["restartSeconds"] > 0


def test_events_name_each_phase_and_the_kill(finished: Finished) -> None:
    seen = events(finished.api, "nightly")
    reasons = [r for r, _, _ in seen]
    assert reasons[:2] == ["LegsRunning", "Armed"] and reasons[-2:] == ["Comparing", "Succeeded"]
    assert {"Preempted", "PreemptionInjected", "Resumed"} <= set(reasons)
    preempted = next(m for r, _, m in seen if r == "PreemptionInjected")
    assert finished.kills()[0].name in preempted


def test_every_job_is_owned_valid_and_deleted_once_concluded(finished: Finished) -> None:
    api, uid = finished.api, finished.run["metadata"]["uid"]
    assert live(api, PYTORCHJOBS.plural, "nightly") == []
    assert live(api, JOBS.plural, "nightly") == []
    for plural in (PYTORCHJOBS.plural, JOBS.plural):
        for obj in api.created(plural):
            assert obj["metadata"]["ownerReferences"][0]["uid"] == uid
    assert len(api.created(PYTORCHJOBS.plural)) == 2 and len(api.created(JOBS.plural)) == 1
    validated = finished.admission.validated
    assert validated["PyTorchJob"] >= 2 and validated["Job"] >= 1 and validated["Event"] >= 6


def test_the_checkpoint_key_is_a_secret_of_the_run_that_the_pods_reference(
    finished: Finished,
) -> None:
    api, uid = finished.api, finished.run["metadata"]["uid"]
    [secret] = api.created("secrets")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == uid  # deleted with the run
    key = base64.b64decode(secret["data"][pytorchjob.CHECKPOINT_KEY]).decode()
    assert len(key) >= 32
    ref = {"secretKeyRef": {"name": secret["metadata"]["name"],
                            "key": pytorchjob.CHECKPOINT_KEY}}
    for obj in api.created(PYTORCHJOBS.plural) + api.created(JOBS.plural):
        # Keys sorted: the API server answers with a custom resource's keys in its own order.
        text = json.dumps(obj, sort_keys=True)
        assert key not in text
        assert json.dumps(ref, sort_keys=True)[1:-1] in text
    # Never in the status nor the events.
    assert key not in json.dumps(finished.status)
    assert all(key not in json.dumps(e) for e in events(api, "nightly"))


def test_metrics_follow_the_verdict(finished: Finished) -> None:
    port = finished.op.health.port
    assert eventually(lambda: value(scrape(port), "resumequal_qualification_passed", **LABELS)
                      == 1.0, what="the passed series")
    text = scrape(port)
    assert value(text, "resumequal_first_divergent_step", **LABELS) == -1.0
    assert (value(text, "resumequal_restart_seconds", **LABELS) or 0) > 0
    assert value(text, "resumequal_runs_total", result="PASS") == 1.0
    assert value(text, "resumequal_operator_leader") == 1.0
    assert (value(text, "resumequal_operator_reconcile_total", result="requeue") or 0) > 0
    assert (value(text, "resumequal_operator_reconcile_duration_seconds_count") or 0) > 0
    assert value(text, "resumequal_operator_build_info") == 1.0
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            assert r.status == 200


def test_a_concluded_run_is_read_from_the_cache_and_left_alone_until_it_changes(
    finished: Finished
) -> None:
    api, op = finished.api, finished.op
    path = QUALIFICATION_RUNS.path(NAMESPACE, "nightly")

    def requests() -> list[str]:
        return [m for m, p in api.requests if p.split("?")[0] in (path, f"{path}/status")]

    # From apply to verdict no reconcile asked the API server for the run (the watch feeds
    # the cache), and every status write changed the status (an unchanged PUT is a no-op
    # without a watch event in the API server).
    assert "GET" not in requests()
    status_events = [e for e in finished.runs()
                     if e.object["metadata"]["name"] == "nightly" and e.type == "MODIFIED"]
    assert requests().count("PUT") <= len(status_events)
    before, seen = len(requests()), len(events(api, "nightly"))
    for _ in range(5):  # as resyncs and a new leader would
        reconciles = op.reconciles
        op.queue.add(f"{NAMESPACE}/nightly")
        eventually(lambda r=reconciles: op.reconciles > r, what="one more reconcile")
    assert len(requests()) == before and len(events(api, "nightly")) == seen

    # A change of its object (a new generation) is reconciled: the status says it saw it.
    api.patch(QUALIFICATION_RUNS.plural, NAMESPACE, "nightly",
              {"spec": {"timeouts": {"legSeconds": 99}}})
    eventually(lambda: qr(api, "nightly")["status"]["observedGeneration"] == 2,
               what="the new generation observed")
    assert qr(api, "nightly")["status"]["phase"] == "Succeeded"
    assert [r for r, _, _ in events(api, "nightly")][seen:] == ["SpecChangeIgnored"]


def test_deletion_removes_the_series_and_keeps_the_artifacts(finished: Finished) -> None:
    # Last in the module: it deletes the shared run. Retention Retain is the default.
    api, port = finished.api, finished.op.health.port
    api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "nightly")
    api.wait_for(lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "nightly") is None,
                 10, "the finalizer to let the run go")
    assert eventually(lambda: value(scrape(port), "resumequal_qualification_passed", **LABELS)
                      is None, what="the series to be removed")
    loc = RunLocation.open(finished.status["runUri"], S3Settings(
        endpoint_url=finished.store["endpointUrl"], addressing_style="path"))
    assert loc.read_verdict() is not None
