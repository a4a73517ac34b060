"""A QualificationRun from apply to verdict: legs, beacon, kill, restart, comparator, status,
events, metrics; the timeouts; an operator restart mid-run; deletion and retention."""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from resumequal.runfiles import PodKill
from resumequal.runstore import LegFiles, RunLocation
from resumequal.signing import KEY_ENV
from resumequal.store.s3settings import S3Spec
from resumequal_operator import pytorchjob
from resumequal_operator.kube import JOBS, PYTORCHJOBS, QUALIFICATION_RUNS
from resumequal_operator.manager import Operator
from testing.kubeapi import KubeAPI
from testing.kubeapi.api import QUALIFICATIONRUN_CRD
from testing.kubeapi.store import Deletion, Obj
from testing.kubeapi.training import SimulatedTrainingOperator
from tests.exposition import scrape, value
from tests.operator.harness import (
    NAMESPACE,
    Admission,
    Operators,
    condition,
    events,
    qr,
    run_manifest,
    wait_phase,
)
from tests.operator.workers import Workers
from tests.s3server import use_dummy_credentials
from tests.waiting import eventually

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS


def _live(api: KubeAPI, plural: str, run: str) -> list[str]:
    return [o["metadata"]["name"] for o in api.list(plural, NAMESPACE)
            if o["metadata"]["labels"].get("resumequal.dev/run") == run]


@dataclass
class Finished:
    """One run applied and qualified (PASS, hard pod kill), shared by the focused tests."""

    api: KubeAPI
    op: Operator
    run: Obj
    store: dict[str, str]
    admission: Admission

    @property
    def status(self) -> Obj:
        return dict(self.run["status"])

    def kills(self) -> list[Deletion]:
        return [d for d in self.api.deletions_of("pods") if d.cause == "api"]


LABELS = {"namespace": NAMESPACE, "pin": "train:2026-11-29", "run": "nightly",
          "scenario": "resume"}


@pytest.fixture(scope="module")
def finished(s3_server: SeaweedFS) -> Iterator[Finished]:
    """A QualificationRun from apply to verdict against scripted workers."""
    with pytest.MonkeyPatch.context() as mp, KubeAPI() as api:
        use_dummy_credentials(mp)
        api.register_pytorchjob_crd()
        api.register_crd(QUALIFICATIONRUN_CRD)
        admission = Admission()
        api.add_validator(admission)
        store = {"uri": f"s3://{s3_server.new_bucket()}/runs",
                 "endpointUrl": s3_server.endpoint, "region": "us-east-1",
                 "addressingStyle": "path"}
        workers = Workers(s3=S3Spec(endpoint_url=store["endpointUrl"], region="us-east-1",
                                    addressing_style="path"))
        ops = Operators(api, endpoints=(s3_server.endpoint,))
        with SimulatedTrainingOperator(api, run_container=workers):
            try:
                op = ops.start()
                api.create(QUALIFICATION_RUNS.plural, run_manifest("nightly", store))
                run = wait_phase(api, "nightly", ("Succeeded", "Failed"), timeout=30)
                assert run["status"]["phase"] == "Succeeded", condition(run, "Ready")
                yield Finished(api, op, run, store, admission)
            finally:
                ops.stop_all()


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
    assert _live(api, PYTORCHJOBS.plural, "nightly") == []
    assert _live(api, JOBS.plural, "nightly") == []
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
        text = json.dumps(obj)
        assert key not in text
        assert json.dumps(ref)[1:-1] in text
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
    # the cache), and every status write changed the status (an unchanged PUT would be a
    # no-op without a watch event in the emulator, as in the API server).
    assert "GET" not in requests()
    status_events = [e for e in api.history(QUALIFICATION_RUNS.plural)
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
    loc = RunLocation.open(finished.status["runUri"], S3Spec(
        endpoint_url=finished.store["endpointUrl"], addressing_style="path"))
    assert loc.read_verdict() is not None


def test_a_failing_verdict_and_graceful_kill(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    from resumequal.verdict import Result

    workers.result = Result.FAIL
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "spot", store, preemption={"mode": "graceful", "graceSeconds": 7.5},
        retention={"policy": "Delete"}))
    done = wait_phase(api, "spot", ("Succeeded", "Failed"), timeout=30)
    kills = [d for d in api.deletions_of("pods") if d.cause == "api"]
    assert [(k.name.rsplit("-", 2)[-2:], k.grace_period_seconds) for k in kills] == [
        (["worker", "1"], 8)]
    injected = [m for r, _, m in events(api, "spot") if r == "PreemptionInjected"]
    assert len(injected) == 1 and "graceful pod kill, grace 7.5s" in injected[0]
    v = done["status"]["verdict"]
    assert done["status"]["phase"] == "Succeeded"
    assert v["result"] == "FAIL" and v["firstDivergenceSummary"] == "step 5 lr rank 1"
    assert v["firstDivergence"] == {"step": 5, "boundary": "lr", "rank": 1}
    assert condition(done, "Qualified")["status"] == "False"
    assert condition(done, "Ready")["status"] == "True"
    labels = {"namespace": NAMESPACE, "pin": "train:2026-11-29", "run": "spot",
              "scenario": "resume"}
    assert eventually(lambda: value(scrape(op.health.port), "resumequal_first_divergent_step",
                                    **labels) == 5.0, what="the divergent step series")
    # Retention Delete: the store artifacts go with the run.
    loc = RunLocation.open(done["status"]["runUri"],
                           S3Spec(endpoint_url=store["endpointUrl"], addressing_style="path"))
    assert loc.store.list()
    api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "spot")
    api.wait_for(lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "spot") is None,
                 10, "the finalizer to let the run go")
    assert loc.store.list() == []


def test_a_failing_verdict_is_zoomed_by_a_job_of_its_own_when_asked(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    from resumequal.verdict import Result

    workers.result = Result.FAIL
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("zoomed", store, zoom="onFail"))
    done = wait_phase(api, "zoomed", "Succeeded", timeout=30)
    assert done["status"]["verdict"]["result"] == "FAIL"
    # The verdict is out first; the zoom Job follows it and its finding lands in the status.
    obj = eventually(lambda: (o := qr(api, "zoomed"))["status"].get("zoom", {}).get("state")
                     == "Succeeded" and o, what="the zoom to conclude", timeout=30)
    zoom = obj["status"]["zoom"]
    name = pytorchjob.zoom_job_name("zoomed", obj["metadata"]["uid"])
    assert zoom["job"] == name and zoom["originKind"] == "module"
    assert zoom["origins"] == ["blocks.1.mix"] and zoom["url"].endswith("/zoom.json")
    [job] = [j for j in api.created(JOBS.plural) if j["metadata"]["name"] == name]
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["zoom", obj["status"]["runUri"], "--namespace", NAMESPACE]
    assert any(e["name"] == KEY_ENV for e in container["env"])
    reasons = [r for r, _, _ in events(api, "zoomed")]
    assert reasons.count("ZoomStarted") == 1 and reasons.count("Zoomed") == 1
    # Done with, like the comparator's: deleted once it succeeded.
    assert eventually(lambda: api.get(JOBS.plural, NAMESPACE, name) is None,
                      what="the zoom Job to be deleted")
    labels = {"namespace": NAMESPACE, "pin": "train:2026-11-29", "run": "zoomed",
              "scenario": "resume", "origin_kind": "module", "origin": "blocks.1.mix"}
    assert eventually(lambda: value(scrape(op.health.port), "resumequal_zoom_origin_info",
                                    **labels) == 1.0, what="the zoom origin series")


def test_a_zoom_job_that_fails_leaves_the_verdict_and_says_so(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    from resumequal.verdict import Result

    workers.result, workers.zoom_exit = Result.FAIL, 2
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("nozoom", store, zoom="onFail"))
    obj = eventually(lambda: (o := qr(api, "nozoom")).get("status", {}).get("zoom", {})
                     .get("state") == "Failed" and o, what="the zoom to fail", timeout=40)
    assert obj["status"]["phase"] == "Succeeded"
    assert obj["status"]["verdict"]["result"] == "FAIL"
    assert "failed" in obj["status"]["zoom"]["summary"]
    warnings = [m for r, t, m in events(api, "nozoom") if r == "ZoomFailed"]
    assert len(warnings) == 1


def test_a_passing_run_starts_no_zoom(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("clean", store, zoom="onFail"))
    done = wait_phase(api, "clean", "Succeeded", timeout=30)
    assert done["status"]["verdict"]["result"] == "PASS" and "zoom" not in done["status"]
    assert not [j for j in _live(api, JOBS.plural, "clean") if "-zoom-" in j]


def test_a_finalizer_that_cannot_clean_up_gives_up(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator,
    s3_server: SeaweedFS, store: dict[str, str]
) -> None:
    """Retention Delete with the bucket gone: the run is deleted all the same, after
    ``cleanup_seconds``, with a Warning Event naming what was left."""
    operators.start(cleanup_seconds=2.0)
    api.create(QUALIFICATION_RUNS.plural, run_manifest("orphan", store,
                                                       retention={"policy": "Delete"}))
    done = wait_phase(api, "orphan", ("Succeeded", "Failed"), timeout=30)
    bucket = store["uri"].removeprefix("s3://").split("/", 1)[0]
    s3 = s3_server.client()
    for obj in s3.list_objects_v2(Bucket=bucket).get("Contents", []):
        s3.delete_object(Bucket=bucket, Key=obj["Key"])
    s3.delete_bucket(Bucket=bucket)
    api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "orphan")
    api.wait_for(lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "orphan") is None,
                 15, "the finalizer to give up")
    abandoned = [(t, m) for r, t, m in events(api, "orphan") if r == "CleanupAbandoned"]
    assert len(abandoned) == 1, events(api, "orphan")
    kind, message = abandoned[0]
    assert kind == "Warning"
    assert done["status"]["runUri"] in message and "left in the store" in message


def _failed_with_timeout(api: KubeAPI, name: str) -> str:
    done = wait_phase(api, name, ("Succeeded", "Failed"), timeout=30)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Timeout", ready
    assert condition(done, "Qualified")["status"] == "False"
    assert done["status"]["verdict"]["result"] == "INVALID"
    assert done["status"]["verdict"]["reason"].startswith("Timeout: ")
    api.wait_for(lambda: not _live(api, PYTORCHJOBS.plural, name), 10, "the legs deleted")
    assert not _live(api, JOBS.plural, name)
    failed = [m for r, t, m in events(api, name) if r == "Failed"]
    assert len(failed) == 1 and [t for r, t, _ in events(api, name) if r == "Failed"] == [
        "Warning"]
    return str(ready["message"])


def test_a_cut_never_reached_times_out_at_the_leg_deadline(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    workers.arm = False
    operators.start()
    # Long enough for the control leg to finish on a loaded machine: only the preempted
    # leg, whose cut never comes, may reach it.
    api.create(QUALIFICATION_RUNS.plural,
               run_manifest("never-armed", store, timeouts={"legSeconds": 10}))
    message = _failed_with_timeout(api, "never-armed")
    assert "preempted leg did not finish within timeouts.legSeconds=10" in message
    assert [d for d in api.deletions_of("pods") if d.cause == "api"] == []  # nothing killed


def test_a_leg_that_does_not_resume_times_out(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    workers.resume = False
    operators.start()
    api.create(QUALIFICATION_RUNS.plural,
               run_manifest("stuck", store, timeouts={"restartSeconds": 1}))
    message = _failed_with_timeout(api, "stuck")
    assert "preempted leg did not resume within timeouts.restartSeconds=1" in message


def test_the_kill_is_recorded_in_the_store_while_the_status_says_so(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # After the pod's deletion, the record the comparator's timeline reads and the status
    # that records the kill go side by side: one round trip, not two. Each waits here until
    # the other has started; written one after the other, the first would wait alone.
    record_started, status_started = threading.Event(), threading.Event()
    overlapped: dict[str, bool] = {}
    write_pod_kill = LegFiles.write_pod_kill

    def recording(self: LegFiles, kill: PodKill) -> str:
        record_started.set()
        overlapped["the record saw the status"] = status_started.wait(10)
        return write_pod_kill(self, kill)

    def admit(obj: Obj) -> None:
        phase = (obj.get("status") or {}).get("phase")
        if obj.get("kind") == "QualificationRun" and phase == "Preempted" \
                and not status_started.is_set():
            status_started.set()
            overlapped["the status saw the record"] = record_started.wait(10)

    monkeypatch.setattr(LegFiles, "write_pod_kill", recording)
    api.add_validator(admit)
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("recorded", store))
    run = wait_phase(api, "recorded", ("Succeeded", "Failed"), timeout=30)
    assert run["status"]["phase"] == "Succeeded", condition(run, "Ready")
    assert overlapped == {"the record saw the status": True, "the status saw the record": True}
    record = RunLocation.open(run["status"]["runUri"], workers.s3).leg("preempted") \
        .read_pod_kill(1, 0)
    assert record is not None and record.pod == run["status"]["preemption"]["pod"]


def test_a_huge_failure_reason_is_truncated_everywhere_it_is_shown(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    """A leg's FAILED.json says why in 1 MiB: status, conditions and Events take 1 KiB of
    it, marked as truncated."""
    workers.fail_reason = "out of memory " + "x" * ((1 << 20) - 100)  # FAILED.json: 1 MiB
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("verbose", store))
    done = wait_phase(api, "verbose", ("Succeeded", "Failed"), timeout=30)
    status = done["status"]
    ready = condition(done, "Ready")
    assert status["phase"] == "Failed" and ready["reason"] == "LegFailed", ready
    shown = [c["message"] for c in status["conditions"]] + [status["verdict"]["reason"],
                                                            status["machine"]["message"]]
    shown += [e["message"] for e in status["machine"]["history"] if e.get("message")]
    seen = events(api, "verbose")
    assert any(r == "Failed" for r, _, _ in seen), seen
    shown += [m for _, _, m in seen]
    assert all(len(m.encode()) <= 1024 for m in shown), sorted(len(m) for m in shown)
    long = [m for m in shown if "out of memory" in m]
    assert len(long) >= 4 and all("[truncated: " in m for m in long), long
    assert len(json.dumps(status)) < 32 * 1024


def test_a_beacon_naming_no_pod_fails_the_run_without_a_request(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    """A pod name from the store goes into API paths only if it is one (DNS-1123)."""
    workers.beacon_pod = "../../secrets/x"
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("planted", store))
    done = wait_phase(api, "planted", ("Succeeded", "Failed"), timeout=30)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Error", ready
    assert "'../../secrets/x'" in ready["message"] and "no pod name" in ready["message"]
    assert [d for d in api.deletions_of("pods") if d.cause == "api"] == []
    assert not [p for _, p in api.requests if "secrets/x" in p or ".." in p], api.requests


def test_a_verdict_that_is_none_fails_the_run(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    """A verdict.json nested too deeply to read ends the run (it is written once)."""
    workers.verdict_bytes = b"[" * 100_000 + b"]" * 100_000
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("garbled", store))
    done = wait_phase(api, "garbled", ("Succeeded", "Failed"), timeout=30)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Error", ready
    assert "left no readable verdict" in ready["message"] and "verdict.json" in ready["message"]
    assert eventually(lambda: value(scrape(op.health.port), "resumequal_qualification_valid",
                                    namespace=NAMESPACE, pin="train:2026-11-29", run="garbled",
                                    scenario="resume") == 0.0, what="the run's metrics")


def test_a_restarted_operator_continues_from_the_status(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, store: dict[str, str]
) -> None:
    first = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("survivor", store))
    wait_phase(api, "survivor", ("Armed", "Preempted", "Resumed"))
    operators.stop(first)
    mid = qr(api, "survivor")["status"]
    assert mid["machine"]["legs"]["preempted"]["launchedAt"] is not None

    operators.start()
    done = wait_phase(api, "survivor", ("Succeeded", "Failed"), timeout=30)
    assert done["status"]["phase"] == "Succeeded", condition(done, "Ready")
    kills = [d for d in api.deletions_of("pods") if d.cause == "api"]
    assert len(kills) == 1  # the second operator did not kill again
    history = [e["phase"] for e in done["status"]["machine"]["history"]]
    assert history == ["Pending", "LegsRunning", "Armed", "Preempted", "Resumed", "Comparing",
                       "Succeeded"]
    assert len(api.created(PYTORCHJOBS.plural)) == 2  # no leg launched twice
    assert done["status"]["startedAt"] == mid["startedAt"]


def test_deleting_a_running_run_stops_its_legs(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    workers.arm = False  # keeps the preempted leg running
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("doomed", store))
    api.wait_for(lambda: len(_live(api, PYTORCHJOBS.plural, "doomed")) == 2, 10, "both legs")
    api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "doomed")
    api.wait_for(lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "doomed") is None,
                 10, "the finalizer to let the run go")
    deleted = {d.name for d in api.deletions_of(PYTORCHJOBS.plural) if d.cause == "api"}
    assert len(deleted) == 2
    assert all(d.propagation_policy == "Background"
               for d in api.deletions_of(PYTORCHJOBS.plural) if d.cause == "api")


def test_a_comparator_that_writes_no_verdict_fails_the_run(
    api: KubeAPI, operators: Operators, training: SimulatedTrainingOperator, workers: Workers,
    store: dict[str, str]
) -> None:
    workers.write_verdict = False
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("no-verdict", store))
    done = wait_phase(api, "no-verdict", ("Succeeded", "Failed"), timeout=30)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Error"
    assert "comparator Job no-verdict-compare-" in ready["message"]
    assert "without a verdict" in ready["message"]
    # Nothing was compared: INVALID, with the reason the run failed.
    assert done["status"]["verdict"]["result"] == "INVALID"
    assert done["status"]["verdict"]["reason"].startswith("Error: ")
    assert "firstDivergenceSummary" not in done["status"]["verdict"]
    api.wait_for(lambda: not _live(api, JOBS.plural, "no-verdict"), 10, "the Job deleted")
