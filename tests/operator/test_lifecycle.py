"""A QualificationRun's other ends on the pod cluster: a FAIL verdict and its zoom, the
timeouts, an operator restart mid-run, deletion of a running run, a finalizer that gives
up, failures of the legs and the comparator (the PASS from apply to verdict:
``test_passing_run.py``)."""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import pytest

from resumequal.run.beacons import PodKill
from resumequal.run.legfiles import LegFiles
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV
from resumequal.store.s3settings import S3Settings
from resumequal_operator import pytorchjob
from resumequal_operator.kube import JOBS, PYTORCHJOBS, QUALIFICATION_RUNS
from testing.cluster.podcluster import PodCluster
from testing.cluster.testapi import RealAPI
from testing.operator.harness import (
    NAMESPACE,
    Operators,
    condition,
    events,
    live,
    qr,
    run_manifest,
    wait_phase,
)
from testing.operator.workers import Workers
from tests.exposition import scrape, value
from tests.waiting import eventually

if TYPE_CHECKING:
    from tests.s3server import SeaweedFS

Obj = dict[str, Any]
# From apply to a verdict on the pod cluster: pods scheduled, started and deleted by the
# real controllers, on a loaded machine.
VERDICT_S = 120


def test_a_failing_verdict_and_graceful_kill(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    from resumequal.results.verdict import Result

    workers.result = Result.FAIL
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "spot", store, preemption={"mode": "graceful", "graceSeconds": 7.5},
        retention={"policy": "Delete"}))
    done = wait_phase(api, "spot", ("Succeeded", "Failed"), timeout=VERDICT_S)
    kills = api.deletions_of("pods")
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
                           S3Settings(endpoint_url=store["endpointUrl"], addressing_style="path"))
    assert loc.store.list()
    api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "spot")
    api.wait_for(lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "spot") is None,
                 10, "the finalizer to let the run go")
    assert loc.store.list() == []


def test_a_failing_verdict_is_zoomed_by_a_job_of_its_own_when_asked(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    from resumequal.results.verdict import Result

    workers.result = Result.FAIL
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("zoomed", store, zoom="onFail"))
    done = wait_phase(api, "zoomed", "Succeeded", timeout=VERDICT_S)
    assert done["status"]["verdict"]["result"] == "FAIL"
    # The verdict is out first; the zoom Job follows it and its finding lands in the status.
    obj = eventually(lambda: (o := qr(api, "zoomed"))["status"].get("zoom", {}).get("state")
                     == "Succeeded" and o, what="the zoom to conclude", timeout=VERDICT_S)
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
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    from resumequal.results.verdict import Result

    workers.result, workers.zoom_exit = Result.FAIL, 2
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("nozoom", store, zoom="onFail"))
    obj = eventually(lambda: (o := qr(api, "nozoom")).get("status", {}).get("zoom", {})
                     .get("state") == "Failed" and o, what="the zoom to fail", timeout=VERDICT_S)
    assert obj["status"]["phase"] == "Succeeded"
    assert obj["status"]["verdict"]["result"] == "FAIL"
    assert "failed" in obj["status"]["zoom"]["summary"]
    warnings = [m for r, t, m in events(api, "nozoom") if r == "ZoomFailed"]
    assert len(warnings) == 1


def test_a_passing_run_starts_no_zoom(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("clean", store, zoom="onFail"))
    done = wait_phase(api, "clean", "Succeeded", timeout=VERDICT_S)
    assert done["status"]["verdict"]["result"] == "PASS" and "zoom" not in done["status"]
    assert not [j for j in live(api, JOBS.plural, "clean") if "-zoom-" in j]


def test_a_finalizer_that_cannot_clean_up_gives_up(
    api: RealAPI, operators: Operators, pods: PodCluster,
    s3_server: SeaweedFS, store: dict[str, str]
) -> None:
    """Retention Delete with the bucket gone: the run is deleted all the same, after
    ``cleanup_seconds``, with a Warning Event naming what was left."""
    operators.start(cleanup_seconds=2.0)
    api.create(QUALIFICATION_RUNS.plural, run_manifest("orphan", store,
                                                       retention={"policy": "Delete"}))
    done = wait_phase(api, "orphan", ("Succeeded", "Failed"), timeout=VERDICT_S)
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


def _failed_with_timeout(api: RealAPI, name: str) -> str:
    done = wait_phase(api, name, ("Succeeded", "Failed"), timeout=VERDICT_S)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Timeout", ready
    assert condition(done, "Qualified")["status"] == "False"
    assert done["status"]["verdict"]["result"] == "INVALID"
    assert done["status"]["verdict"]["reason"].startswith("Timeout: ")
    api.wait_for(lambda: not live(api, PYTORCHJOBS.plural, name), 10, "the legs deleted")
    assert not live(api, JOBS.plural, name)
    failed = [m for r, t, m in events(api, name) if r == "Failed"]
    assert len(failed) == 1 and [t for r, t, _ in events(api, name) if r == "Failed"] == [
        "Warning"]
    return str(ready["message"])


def test_a_cut_never_reached_times_out_at_the_leg_deadline(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
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
    assert api.deletions_of("pods") == []  # nothing killed


def test_a_leg_that_does_not_resume_times_out(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    workers.resume = False
    operators.start()
    api.create(QUALIFICATION_RUNS.plural,
               run_manifest("stuck", store, timeouts={"restartSeconds": 1}))
    message = _failed_with_timeout(api, "stuck")
    assert "preempted leg did not resume within timeouts.restartSeconds=1" in message


def test_the_kill_is_recorded_in_the_store_while_the_status_says_so(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
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
    run = wait_phase(api, "recorded", ("Succeeded", "Failed"), timeout=VERDICT_S)
    assert run["status"]["phase"] == "Succeeded", condition(run, "Ready")
    assert overlapped == {"the record saw the status": True, "the status saw the record": True}
    record = RunLocation.open(run["status"]["runUri"], workers.s3).leg("preempted") \
        .read_pod_kill(1, 0)
    assert record is not None and record.pod == run["status"]["preemption"]["pod"]


def test_a_huge_failure_reason_is_truncated_everywhere_it_is_shown(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    """A leg's FAILED.json says why in 1 MiB: status, conditions and Events take 1 KiB of
    it, marked as truncated."""
    workers.fail_reason = "out of memory " + "x" * ((1 << 20) - 100)  # FAILED.json: 1 MiB
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("verbose", store))
    done = wait_phase(api, "verbose", ("Succeeded", "Failed"), timeout=VERDICT_S)
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
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    """A pod name from the store goes into API paths only if it is one (DNS-1123)."""
    workers.beacon_pod = "../../secrets/x"
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("planted", store))
    done = wait_phase(api, "planted", ("Succeeded", "Failed"), timeout=VERDICT_S)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Error", ready
    assert "'../../secrets/x'" in ready["message"] and "no pod name" in ready["message"]
    assert api.deletions_of("pods") == []
    assert not [p for _, p in api.requests if "secrets/x" in p or ".." in p], api.requests


def test_a_verdict_that_is_none_fails_the_run(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    """A verdict.json nested too deeply to read ends the run (it is written once)."""
    workers.verdict_bytes = b"[" * 100_000 + b"]" * 100_000
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("garbled", store))
    done = wait_phase(api, "garbled", ("Succeeded", "Failed"), timeout=VERDICT_S)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Error", ready
    assert "left no readable verdict" in ready["message"] and "verdict.json" in ready["message"]
    assert eventually(lambda: value(scrape(op.health.port), "resumequal_qualification_valid",
                                    namespace=NAMESPACE, pin="train:2026-11-29", run="garbled",
                                    scenario="resume") == 0.0, what="the run's metrics")


def test_a_restarted_operator_continues_from_the_status(
    api: RealAPI, operators: Operators, pods: PodCluster, store: dict[str, str]
) -> None:
    first = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("survivor", store))
    wait_phase(api, "survivor", ("Armed", "Preempted", "Resumed"))
    operators.stop(first)
    mid = qr(api, "survivor")["status"]
    assert mid["machine"]["legs"]["preempted"]["launchedAt"] is not None

    operators.start()
    done = wait_phase(api, "survivor", ("Succeeded", "Failed"), timeout=VERDICT_S)
    assert done["status"]["phase"] == "Succeeded", condition(done, "Ready")
    kills = api.deletions_of("pods")
    assert len(kills) == 1  # the second operator did not kill again
    history = [e["phase"] for e in done["status"]["machine"]["history"]]
    assert history == ["Pending", "LegsRunning", "Armed", "Preempted", "Resumed", "Comparing",
                       "Succeeded"]
    assert len(api.created(PYTORCHJOBS.plural)) == 2  # no leg launched twice
    assert done["status"]["startedAt"] == mid["startedAt"]


def test_deleting_a_running_run_stops_its_legs(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    workers.arm = False  # keeps the preempted leg running
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("doomed", store))
    api.wait_for(lambda: len(live(api, PYTORCHJOBS.plural, "doomed")) == 2, 10, "both legs")
    api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "doomed")
    api.wait_for(lambda: api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "doomed") is None,
                 10, "the finalizer to let the run go")
    deleted = {d.name for d in api.deletions_of(PYTORCHJOBS.plural)}
    assert len(deleted) == 2
    assert all(d.propagation_policy == "Background"
               for d in api.deletions_of(PYTORCHJOBS.plural))


def test_a_comparator_that_writes_no_verdict_fails_the_run(
    api: RealAPI, operators: Operators, pods: PodCluster, workers: Workers,
    store: dict[str, str]
) -> None:
    workers.write_verdict = False
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("no-verdict", store))
    done = wait_phase(api, "no-verdict", ("Succeeded", "Failed"), timeout=VERDICT_S)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Error"
    assert "comparator Job no-verdict-compare-" in ready["message"]
    assert "without a verdict" in ready["message"]
    # Nothing was compared: INVALID, with the reason the run failed.
    assert done["status"]["verdict"]["result"] == "INVALID"
    assert done["status"]["verdict"]["reason"].startswith("Error: ")
    assert "firstDivergenceSummary" not in done["status"]["verdict"]
    api.wait_for(lambda: not live(api, JOBS.plural, "no-verdict"), 10, "the Job deleted")
