"""The controller without workers: spec validation, finalizer, watch recovery, leadership."""

from __future__ import annotations

import boto3
from prometheus_client import CollectorRegistry

from resumequal_operator.kube import LEASES, PYTORCHJOBS, QUALIFICATION_RUNS, Kube
from resumequal_operator.manager import Operator, Settings
from resumequal_operator.runtime.cache import ObjectCache
from resumequal_operator.runtime.leader import LeaseSettings
from resumequal_operator.runtime.watching import Watcher
from testing.cluster.testapi import RealAPI
from testing.operator.harness import (
    NAMESPACE,
    Admission,
    Operators,
    condition,
    events,
    qr,
    run_manifest,
    wait_phase,
)
from tests.waiting import eventually


def _jobs(api: RealAPI, run: str) -> list[str]:
    return sorted(j["metadata"]["name"] for j in api.list(PYTORCHJOBS.plural, NAMESPACE)
                  if j["metadata"]["labels"].get("resumequal.dev/run") == run)


def test_an_invalid_spec_fails_naming_the_field_while_a_valid_run_proceeds(
    api: RealAPI, operators: Operators, store: dict[str, str], admission: Admission
) -> None:
    operators.start()
    api.create(QUALIFICATION_RUNS.plural,
               run_manifest("bad", store, preemption={"step": 9}))
    api.create(QUALIFICATION_RUNS.plural, run_manifest("good", store))

    bad = wait_phase(api, "bad", "Failed")
    ready = condition(bad, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert "spec.preemption.step" in ready["message"]
    assert condition(bad, "Qualified")["status"] == "False"
    assert bad["status"]["verdict"]["result"] == "INVALID"
    assert "spec.preemption.step" in bad["status"]["verdict"]["reason"]
    assert _jobs(api, "bad") == []  # nothing started for it
    assert [reason for reason, _, _ in events(api, "bad")] == ["InvalidSpec"]

    good = wait_phase(api, "good", "LegsRunning")
    assert condition(good, "Ready")["status"] == "Unknown"
    assert len(eventually(lambda: _jobs(api, "good") if len(_jobs(api, "good")) == 2 else None,
                          what="both legs' PyTorchJobs")) == 2
    assert "resumequal.dev/cleanup" in qr(api, "good")["metadata"]["finalizers"]
    assert admission.validated["PyTorchJob"] == 2
    assert admission.validated["QualificationRun"] >= 3  # the operator's status writes


def test_a_corrected_spec_starts_the_run(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("fixme", store, preemption={"rank": 0}))
    failed = wait_phase(api, "fixme", "Failed")
    assert "spec.preemption.rank" in condition(failed, "Ready")["message"]
    api.patch(QUALIFICATION_RUNS.plural, NAMESPACE, "fixme", {"spec": {"preemption": {"rank": 1}}})
    wait_phase(api, "fixme", "LegsRunning")


def test_watch_expiry_is_recovered_by_listing_again(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    op = operators.start()
    eventually(lambda: all(w.synced.is_set() for w in op.watchers), what="synced caches")
    # Move the resourceVersion past what the watch has seen, drop the history and break
    # the watch: its next request, from the version it saw last, gets 410 Gone.
    api.create("secrets", {"metadata": {"name": "bump"}, "data": {}}, NAMESPACE)
    api.compact()
    api.end_watches()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("after-gone", store))
    wait_phase(api, "after-gone", "LegsRunning", timeout=15)
    assert op.watchers[0].relists >= 1


def test_a_run_deleted_while_the_watch_was_down_leaves_the_cache_after_the_410(
    api: RealAPI, store: dict[str, str]
) -> None:
    for name in ("kept", "deleted"):
        api.create(QUALIFICATION_RUNS.plural, run_manifest(name, store))
    kube, cache, enqueued = Kube(api.api_client()), ObjectCache(), []
    watcher = Watcher(kube, NAMESPACE, enqueued.append, cache=cache, timeout_seconds=1,
                      retry_seconds=0.1)
    watcher.start()
    try:
        eventually(lambda: watcher.synced.is_set(), what="the first listing")
        assert sorted(cache.keys()) == [f"{NAMESPACE}/deleted", f"{NAMESPACE}/kept"]
        api.stop()  # the watch breaks; meanwhile the run goes and the history with it
        api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "deleted")
        api.compact()
        enqueued.clear()
        api.start()
        eventually(lambda: watcher.relists >= 1, timeout=10, what="a listing after 410 Gone")
        assert cache.keys() == [f"{NAMESPACE}/kept"]
        # Both reconciled: the deleted one to forget its metrics and store references.
        assert sorted(set(enqueued)) == [f"{NAMESPACE}/deleted", f"{NAMESPACE}/kept"]
        api.patch(QUALIFICATION_RUNS.plural, NAMESPACE, "kept", {"spec": {"controls": {
            "enabled": True}}})
        eventually(lambda: (cache.get(f"{NAMESPACE}/kept") or {}).get("metadata", {})
                   .get("generation") == 2, what="the watch resumed from the listing")
    finally:
        watcher.stop()
        kube.close()


def test_a_listing_enqueues_what_it_shows_unchanged_at_low_priority(
    api: RealAPI, store: dict[str, str]
) -> None:
    for name in ("kept", "edited", "deleted"):
        api.create(QUALIFICATION_RUNS.plural, run_manifest(name, store))
    kube, cache = Kube(api.api_client()), ObjectCache()
    normal: list[str] = []
    low: list[str] = []
    watcher = Watcher(kube, NAMESPACE, normal.append, enqueue_low=low.append, cache=cache,
                      timeout_seconds=1, retry_seconds=0.1)
    watcher.start()
    try:
        # Start-up: every run listed is old news, behind any change to come.
        eventually(lambda: watcher.synced.is_set(), what="the first listing")
        assert (sorted(low), normal) == ([f"{NAMESPACE}/{n}" for n in (
            "deleted", "edited", "kept")], [])
        api.stop()
        api.patch(QUALIFICATION_RUNS.plural, NAMESPACE, "edited", {"spec": {"controls": {
            "enabled": True}}})
        api.delete(QUALIFICATION_RUNS.plural, NAMESPACE, "deleted")
        api.create(QUALIFICATION_RUNS.plural, run_manifest("new", store))
        api.compact()
        low.clear()
        api.start()
        eventually(lambda: watcher.relists >= 1, timeout=10, what="a listing after 410 Gone")
        # What changed, went or came meanwhile is a change; the rest is old news again.
        assert sorted(set(normal)) == [f"{NAMESPACE}/{n}" for n in ("deleted", "edited",
                                                                   "new")]
        assert low == [f"{NAMESPACE}/kept"]
    finally:
        watcher.stop()
        kube.close()


def test_at_start_up_runs_in_flight_go_before_concluded_ones(
    api: RealAPI, store: dict[str, str]
) -> None:
    for name, phase in (("done-1", "Succeeded"), ("flying", "LegsRunning"),
                        ("done-2", "Failed"), ("new", None)):
        obj = api.create(QUALIFICATION_RUNS.plural, run_manifest(name, store))
        if phase is not None:
            api.replace(QUALIFICATION_RUNS.plural, NAMESPACE, name,
                        {**obj, "status": {"phase": phase}}, subresource="status")
    kube = Kube(api.api_client())
    op = Operator(kube, Settings(namespaces=(NAMESPACE,), port=0, host="127.0.0.1",
                                 identity="start-up"), CollectorRegistry())
    try:
        op.watchers[0]._list()  # what its watcher does first when started
        taken = [op.queue.get(0) for _ in range(5)]
        # A concluded run waits behind every other; the rest keep the listing's order.
        assert taken == [f"{NAMESPACE}/{n}" for n in ("flying", "new", "done-1", "done-2")
                         ] + [None]
    finally:
        kube.close()


def test_only_the_leader_reconciles_and_a_standby_takes_over(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    # A lease a loaded machine renews in time (the harness's 0.8 s renew deadline can lapse
    # under load, and the standby then rightly leads), yet short enough to wait out below.
    lease = LeaseSettings(namespace=NAMESPACE, lease_seconds=4.0, renew_deadline_seconds=3.0,
                          retry_seconds=0.1)
    first = operators.start(leader_elect=True, lease=lease)
    eventually(lambda: first.is_leader, what="the first replica to lead")
    second = operators.start(leader_elect=True, lease=lease)
    eventually(lambda: second.elector is not None and second.elector.known.is_set(),
               what="the second replica to know who leads")
    api.create(QUALIFICATION_RUNS.plural, run_manifest("led", store))
    wait_phase(api, "led", "LegsRunning")
    eventually(lambda: first.reconciles > 0, what="the leader's reconciles to be counted")
    assert second.reconciles == 0
    assert not second.is_leader
    lease = api.get(LEASES.plural, NAMESPACE, "resumequal-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] == first.settings.identity

    # A crash: the leader stops without releasing; the standby waits out the lease.
    assert first.elector is not None
    first.elector.stop(release=False)
    operators.stop(first)
    eventually(lambda: second.is_leader, timeout=12, what="the standby to take over")
    before = second.reconciles
    eventually(lambda: second.reconciles > before, what="the new leader to reconcile")
    lease = api.get(LEASES.plural, NAMESPACE, "resumequal-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] == second.settings.identity
    assert lease["spec"]["leaseTransitions"] >= 1


def test_a_leader_that_stops_releases_the_lease_at_once(
    api: RealAPI, operators: Operators
) -> None:
    slow = LeaseSettings(namespace=NAMESPACE, lease_seconds=30, renew_deadline_seconds=20,
                         retry_seconds=0.1)
    first = operators.start(leader_elect=True, lease=slow)
    eventually(lambda: first.is_leader, what="the first replica to lead")
    second = operators.start(leader_elect=True, lease=first.settings.lease)
    eventually(lambda: second.elector is not None and second.elector.known.is_set(),
               what="the second replica to know who leads")
    assert not second.is_leader
    operators.stop(first)
    # A 30 s lease, yet the standby leads within a few retries: it was released.
    eventually(lambda: second.is_leader, timeout=3, what="the standby to take over")
    lease = api.get(LEASES.plural, NAMESPACE, "resumequal-operator")
    assert lease is not None and lease["spec"]["holderIdentity"] == second.settings.identity


def _metric(op: object, name: str, labels: dict[str, str] | None = None) -> float:
    value = op.registry.get_sample_value(name, labels or {})  # type: ignore[attr-defined]
    return float(value or 0.0)


def test_a_status_conflict_is_retried_after_reading_again(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    api.inject_fault(method="PUT", kind=QUALIFICATION_RUNS.plural + ".resumequal.dev",
                     subresource="status", code=409, times=2, message="the object changed")
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("contested", store))
    wait_phase(api, "contested", "LegsRunning")
    assert not api.faults_pending()  # both conflicts were served
    assert _metric(op, "resumequal_operator_reconcile_errors_total") == 0.0
    puts = [p for m, p in api.requests if m == "PUT" and p.endswith("/contested/status")]
    assert len(puts) >= 3  # two conflicts, then the write


def test_an_api_error_backs_off_and_the_run_still_proceeds(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    api.inject_fault(method="POST", kind="pytorchjobs.kubeflow.org", code=500, times=3)
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("flaky", store))
    eventually(lambda: len(_jobs(api, "flaky")) == 2, what="both legs despite the errors")
    assert _metric(op, "resumequal_operator_reconcile_errors_total") >= 1.0
    assert _metric(op, "resumequal_operator_reconcile_total", {"result": "error"}) >= 1.0


def _phase(api: RealAPI, namespace: str, name: str) -> str | None:
    obj = api.get(QUALIFICATION_RUNS.plural, namespace, name) or {}
    return (obj.get("status") or {}).get("phase")


def test_watches_the_namespaces_it_is_given(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    operators.start(namespaces=(NAMESPACE, "team-b"))
    for ns in (NAMESPACE, "team-b", "team-c"):
        api.create(QUALIFICATION_RUNS.plural, run_manifest("q", store, namespace=ns))
    eventually(lambda: _phase(api, NAMESPACE, "q") and _phase(api, "team-b", "q"),
               what="both watched namespaces reconciled")
    assert _phase(api, "team-c", "q") is None


def test_watches_every_namespace(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    operators.start(namespaces=())
    for ns in ("team-x", "team-y"):
        api.create(QUALIFICATION_RUNS.plural, run_manifest("q", store, namespace=ns))
    eventually(lambda: _phase(api, "team-x", "q") and _phase(api, "team-y", "q"),
               what="runs in any namespace reconciled")


def test_an_unchanged_run_is_polled_without_writing_its_status(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("idle", store))
    wait_phase(api, "idle", "LegsRunning")
    eventually(lambda: len(_jobs(api, "idle")) == 2, what="both legs")

    def writes() -> int:
        return sum(1 for m, p in api.requests if m == "PUT" and p.endswith("/idle/status"))

    before, reconciles = writes(), op.reconciles
    eventually(lambda: op.reconciles >= reconciles + 10, what="ten more reconciles")
    assert writes() == before


def test_a_started_run_keeps_the_spec_it_started_with(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("pinned", store))
    wait_phase(api, "pinned", "LegsRunning")
    # Applied, this would time the legs out at once.
    api.patch(QUALIFICATION_RUNS.plural, NAMESPACE, "pinned",
              {"spec": {"timeouts": {"legSeconds": 0.01}}})
    reconciles = op.reconciles
    eventually(lambda: op.reconciles >= reconciles + 10, what="ten more reconciles")
    obj = qr(api, "pinned")
    assert obj["status"]["phase"] == "LegsRunning"
    assert obj["status"]["observedGeneration"] == obj["metadata"]["generation"] == 2
    # The spec it started with (the API server's defaults for the section, not the patch).
    assert obj["status"]["machine"]["runSpec"].get("timeouts", {}).get("legSeconds") != 0.01
    reasons = [reason for reason, _, _ in events(api, "pinned")]
    assert reasons.count("SpecChangeIgnored") == 1


def test_a_new_run_stores_and_creates_nothing_before_its_finalizer_is_on(
    api: RealAPI, operators: Operators, store: dict[str, str]
) -> None:
    # The finalizer's PATCH goes while the run starts; until it is answered nothing the
    # finalizer cleans up (its store artifacts, its jobs) may exist.
    api.inject_fault(method="PATCH", kind=QUALIFICATION_RUNS.plural + ".resumequal.dev",
                     code=503, times=10**6, message="the API server is busy")
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest("guarded", store))
    path = QUALIFICATION_RUNS.path(NAMESPACE, "guarded")

    def patches() -> list[int]:
        return [i for i, (m, p) in enumerate(list(api.requests))
                if m == "PATCH" and p.split("?")[0] == path]

    eventually(lambda: len(patches()) >= 3, what="the finalizer's PATCH retried")
    assert _jobs(api, "guarded") == []
    assert _stored(store) == []
    assert "status" not in qr(api, "guarded")
    api.clear_faults()
    wait_phase(api, "guarded", "LegsRunning")
    assert "resumequal.dev/cleanup" in qr(api, "guarded")["metadata"]["finalizers"]
    first_job = min(i for i, (m, p) in enumerate(list(api.requests))
                    if m == "POST" and p.split("?")[0].endswith("/pytorchjobs"))
    assert max(patches()) < first_job
    assert any(key.endswith("/spec.json") for key in _stored(store))


def _stored(store: dict[str, str]) -> list[str]:
    """Every key in the run store's bucket."""
    bucket = store["uri"].removeprefix("s3://").split("/", 1)[0]
    s3 = boto3.client("s3", endpoint_url=store["endpointUrl"], region_name=store["region"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket)
    return [o["Key"] for page in pages for o in page.get("Contents", [])]
