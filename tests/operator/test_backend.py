"""KubernetesBackend against the real API server: what it refuses to kill, a resize's replicas,
and the comparator Job."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from resumequal.errors import NotAuthentic
from resumequal.qualify.machine import LegState
from resumequal.qualify.plan import qualification_plan
from resumequal.results.verdict import Result
from resumequal.run.beacons import GROW, Beacon
from resumequal.run.location import RunLocation
from resumequal.spec import PreemptionSpec
from resumequal_operator.backend import ComparatorFailed, KillRefused, KubernetesBackend, RunRef
from resumequal_operator.kube import JOBS, PYTORCHJOBS, QUALIFICATION_RUNS, Kube
from resumequal_operator.runkeys import MasterKey
from resumequal_operator.validation import parse_run_spec, qualification_spec
from testing.cluster.testapi import RealAPI
from testing.operator.harness import NAMESPACE, failed_job_status, run_location, run_manifest
from testing.operator.workers import verdict
from testing.trace_records import step_record, trace_line

# The run of :func:`run_manifest` shrunk to worker-0 at the kill, grown back after step 4.
RESIZE = {"preemption": {"mode": "hard", "resize": {"toNodes": 1, "growAfterStep": 4}},
          "comparison": {"mode": "tolerance", "tolerances": {
              "loss": 1e-4, "grad_norm": 1e-4, "params": 1e-4}}}


def _backend(api: RealAPI, tmp_path: Path, name: str = "unit",
             **spec: Any) -> KubernetesBackend:
    manifest = run_manifest(name, {"uri": f"file://{tmp_path}/store"}, **spec)
    obj = api.create(QUALIFICATION_RUNS.plural, manifest)
    ref = RunRef.of(obj)
    spec = parse_run_spec(obj["spec"])
    uri = f"{tmp_path}/store/{NAMESPACE}/unit/{ref.uid}"
    qspec = qualification_spec(spec, uri)
    return KubernetesBackend(Kube(api.api_client()), ref, spec, qspec,
                             qualification_plan(qspec), run_location(uri, ref.uid))


@pytest.fixture
def backend(api: RealAPI, tmp_path: Path) -> KubernetesBackend:
    return _backend(api, tmp_path)


def _pod(api: RealAPI, name: str, job: dict[str, Any], index: int) -> str:
    m = job["metadata"]
    pod = api.create("pods", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": {"training.kubeflow.org/replica-index": str(index)},
                     "ownerReferences": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                                          "name": m["name"], "uid": m["uid"],
                                          "controller": True}]},
        "spec": {"containers": [{"name": "pytorch", "image": "x"}]}})
    return str(pod["metadata"]["uid"])


def _beacon(pod: str, uid: str | None = None, armed_ago: float = 0.0) -> Beacon:
    return Beacon(pid=7, host=pod, pod=pod, pod_uid=uid, rank=1, attempt=0, step=4,
                  microstep=1, armed_at=time.time() - armed_ago)


def _kill(mode: str = "hard", target: str = "pod", grace: float = 20) -> PreemptionSpec:
    return PreemptionSpec(step=4, microstep=1, rank=1, mode=mode,  # type: ignore[arg-type]
                          target=target, grace_seconds=grace)  # type: ignore[arg-type]


def _api_deletions(api: RealAPI) -> list[Any]:
    return [d for d in api.deletions_of("pods") if d.cause == "api"]


def test_kills_only_a_non_rendezvous_pod_of_its_own_legs(
    api: RealAPI, backend: KubernetesBackend
) -> None:
    backend.launch_legs([backend.plan.leg("preempted")])
    backend.launch_legs([backend.plan.leg("preempted")])  # idempotent: 409 is "launched"
    assert len(api.created(PYTORCHJOBS.plural)) == 1
    job = api.get(PYTORCHJOBS.plural, NAMESPACE, backend.job_name("preempted"))
    assert job is not None
    name = job["metadata"]["name"]
    uid0 = _pod(api, f"{name}-worker-0", job, 0)
    uid1 = _pod(api, f"{name}-worker-1", job, 1)
    stranger = api.create(PYTORCHJOBS.plural, {**job, "metadata": {
        "name": "someone-else", "namespace": NAMESPACE}})
    uid_s = _pod(api, "someone-else-worker-1", stranger, 1)

    with pytest.raises(KillRefused, match="worker-0, which hosts the c10d rendezvous"):
        backend.deliver_kill("preempted", _beacon(f"{name}-worker-0", uid0), _kill())
    with pytest.raises(KillRefused, match="does not belong to a leg"):
        backend.deliver_kill("preempted", _beacon("someone-else-worker-1", uid_s), _kill())
    assert _api_deletions(api) == []

    backend.deliver_kill("preempted", _beacon(f"{name}-worker-1", uid1),
                         _kill("graceful", grace=2.5))
    (kill,) = _api_deletions(api)
    assert (kill.name, kill.grace_period_seconds) == (f"{name}-worker-1", 3)
    # gone already: no error
    backend.deliver_kill("preempted", _beacon(f"{name}-worker-1", uid1), _kill())

    # The training operator's replacement pod has the same name and a new uid: a retried
    # kill (its status write lost) must not take the resumed attempt down too, however
    # soon after the arming it was created.
    _pod(api, f"{name}-worker-1", job, 1)
    backend.deliver_kill("preempted", _beacon(f"{name}-worker-1", uid1), _kill())
    assert len(_api_deletions(api)) == 1


def test_a_beacon_without_a_pod_uid_falls_back_to_the_creation_time(
    api: RealAPI, backend: KubernetesBackend
) -> None:
    backend.launch_legs([backend.plan.leg("preempted")])
    job = api.get(PYTORCHJOBS.plural, NAMESPACE, backend.job_name("preempted"))
    assert job is not None
    name = job["metadata"]["name"]
    _pod(api, f"{name}-worker-1", job, 1)
    backend.deliver_kill("preempted", _beacon(f"{name}-worker-1", armed_ago=60), _kill())
    assert _api_deletions(api) == []  # created well after the arming: a replacement
    backend.deliver_kill("preempted", _beacon(f"{name}-worker-1"), _kill())
    assert len(_api_deletions(api)) == 1


def test_a_process_kill_is_an_order_in_the_store_and_deletes_nothing(
    api: RealAPI, backend: KubernetesBackend
) -> None:
    backend.launch_legs([backend.plan.leg("preempted")])
    beacon = _beacon("unit-preempted-worker-0", "uid-0")
    beacon = beacon.model_copy(update={"rank": 0})
    # rank 0 runs on worker-0: a process kill leaves its torchrun agent, and the
    # rendezvous, alive, so it is allowed there.
    backend.deliver_kill("preempted", beacon, _kill("graceful", target="process", grace=7))
    order = backend.location.leg("preempted").read_kill_order(0, 0)
    assert order is not None
    assert (order.pid, order.pod_uid, order.mode, order.grace_seconds) == (
        7, "uid-0", "graceful", 7)
    assert _api_deletions(api) == []


def test_a_leg_whose_job_vanished_is_failed(backend: KubernetesBackend) -> None:
    obs = backend.observe_leg("control")
    assert obs.state == LegState.FAILED and "no longer exists" in (obs.message or "")


def test_the_comparator_job_is_created_once_and_read_when_it_ends(
    api: RealAPI, backend: KubernetesBackend
) -> None:
    assert backend.compare() is None
    assert backend.compare() is None
    assert len(api.created(JOBS.plural)) == 1
    job = api.get(JOBS.plural, NAMESPACE, backend.comparator_name)
    assert job is not None
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][:2] == [
        "compare", backend.location.uri]
    api.patch_status(JOBS.plural, NAMESPACE, backend.comparator_name, failed_job_status())
    with pytest.raises(ComparatorFailed, match="failed without a verdict: Job has reached"):
        backend.compare()
    # Exit 1 (FAIL) fails the Job too, after the verdict was written: that is a verdict.
    backend.location.put_result("verdict.json", verdict(Result.FAIL).model_dump_json().encode())
    v = backend.compare()
    assert v is not None and v.result == Result.FAIL
    backend.cleanup()
    deleted = [d for d in api.deletions_of(JOBS.plural) if d.cause == "api"]
    assert [(d.name, d.propagation_policy) for d in deleted] == [
        (backend.comparator_name, "Background")]


# -- resize ---------------------------------------------------------------------------------


def _replicas(api: RealAPI, backend: KubernetesBackend, leg: str = "preempted") -> int:
    job = api.get(PYTORCHJOBS.plural, NAMESPACE, backend.job_name(leg))
    assert job is not None
    return int(job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])


def _writes(api: RealAPI) -> list[tuple[str, str]]:
    """(method, resource) of the PATCH and DELETE requests so far."""
    return [(m, p.rsplit("/", 2)[-2]) for m, p in api.requests if m in ("PATCH", "DELETE")]


def _step(backend: KubernetesBackend, leg: str, rank: int, attempt: int, step: int) -> None:
    sink = backend.location.trace_sink(leg, rank, attempt)
    sink.append(trace_line(step_record(rank, attempt, step, time.time())))


def test_a_resize_kill_lowers_the_replicas_first_and_once(
    api: RealAPI, tmp_path: Path
) -> None:
    backend = _backend(api, tmp_path, **RESIZE)
    backend.launch_legs(backend.plan.legs)
    job = api.get(PYTORCHJOBS.plural, NAMESPACE, backend.job_name("preempted"))
    assert job is not None
    name = job["metadata"]["name"]
    uid1 = _pod(api, f"{name}-worker-1", job, 1)
    preemption = backend.plan.leg("preempted").spec.preemption
    backend.deliver_kill("preempted", _beacon(f"{name}-worker-1", uid1), preemption)
    assert _replicas(api, backend) == 1 and _replicas(api, backend, "control") == 2
    assert _writes(api) == [("PATCH", "pytorchjobs"), ("DELETE", "pods")]
    assert [(n.reason, "2 -> 1" in n.message) for n in backend.notices] == [("Resized", True)]
    # A replayed kill finds the pod gone (or replaced) and changes nothing more.
    backend.deliver_kill("preempted", _beacon(f"{name}-worker-1", uid1), preemption)
    assert len(_writes(api)) == 2 and len(backend.notices) == 1


def test_a_resize_kill_is_refused_on_a_pod_that_lowering_the_replicas_keeps(
    api: RealAPI, tmp_path: Path
) -> None:
    backend = _backend(api, tmp_path, **{
        **RESIZE, "world": {"nnodes": 3, "nprocPerNode": 1},
        "preemption": {**RESIZE["preemption"], "rank": 2, "resize": {"toNodes": 2}}})
    backend.launch_legs([backend.plan.leg("preempted")])
    job = api.get(PYTORCHJOBS.plural, NAMESPACE, backend.job_name("preempted"))
    assert job is not None
    name = job["metadata"]["name"]
    uid1 = _pod(api, f"{name}-worker-1", job, 1)
    preemption = backend.plan.leg("preempted").spec.preemption
    with pytest.raises(KillRefused, match="deletes worker-2"):
        backend.deliver_kill("preempted", _beacon(f"{name}-worker-1", uid1), preemption)
    assert _api_deletions(api) == [] and _replicas(api, backend) == 3


def test_the_shrunk_world_grows_back_once_its_rank_0_waits_for_it(
    api: RealAPI, tmp_path: Path
) -> None:
    backend = _backend(api, tmp_path, **RESIZE)
    backend.launch_legs([backend.plan.leg("preempted")])
    api.patch(PYTORCHJOBS.plural, NAMESPACE, backend.job_name("preempted"),
              {"spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}})
    files = backend.location.leg("preempted")
    _step(backend, "preempted", 0, 1, 3)
    # A beacon of an earlier attempt, or one not at the grow, is no reason to grow.
    files.write_beacon(0, 0, 5, 0, GROW)
    files.write_beacon(0, 1, 4, 1, "microbatch")
    assert backend.observe_leg("preempted").state == LegState.RUNNING
    assert _replicas(api, backend) == 1 and backend.notices == []
    files.write_beacon(0, 1, 5, 0, GROW)
    backend.observe_leg("preempted")
    backend.observe_leg("preempted")
    assert _replicas(api, backend) == 2
    [grown] = backend.notices
    assert grown.reason == "Grown" and "1 -> 2" in grown.message and "step 5" in grown.message
    assert [m for m, _ in api.requests if m == "PATCH"] == ["PATCH"]  # once (the test's
    # own patch above is in-process, not a request)


def test_without_a_grow_the_leg_is_done_when_the_shrunk_world_is(
    api: RealAPI, tmp_path: Path
) -> None:
    backend = _backend(api, tmp_path, **{
        **RESIZE, "preemption": {**RESIZE["preemption"], "resize": {"toNodes": 1}}})
    backend.launch_legs(backend.plan.legs)
    for leg in ("preempted", "control"):
        backend.location.leg(leg).mark_rank_done(0, 1, 6)
    # The preempted leg finishes on worker-0 alone; the reference leg was never shrunk.
    assert backend.observe_leg("preempted").state == LegState.SUCCEEDED
    assert backend.observe_leg("control").state == LegState.RUNNING
    backend.location.leg("control").mark_rank_done(1, 0, 6)
    assert backend.observe_leg("control").state == LegState.SUCCEEDED


def test_legs_launched_together_find_their_specs_and_key_before_their_jobs(
    api: RealAPI, tmp_path: Path
) -> None:
    backend = _backend(api, tmp_path)
    seen: list[str] = []

    def admission(obj: dict[str, Any]) -> None:
        # What a leg's pods read exists once its job does: the store is written and the key
        # Secret created before either job is.
        location = backend.location
        legs = [location.read_leg_spec(p.name) is not None for p in backend.plan.legs]
        seen.append(f"{obj['metadata']['name']}: spec {location.has_spec()}, legs {legs}, "
                    f"secrets {len(api.list('secrets', NAMESPACE))}")

    api.add_validator(admission, {"PyTorchJob"})
    backend.launch_legs(backend.plan.legs)
    names = sorted(backend.job_name(p.name) for p in backend.plan.legs)
    assert sorted(seen) == [f"{n}: spec True, legs [True, True], secrets 1" for n in names]
    # Launching them again is a no-op (409s), as after a status write that was lost.
    backend.launch_legs(backend.plan.legs)
    assert sorted(j["metadata"]["name"] for j in api.created(PYTORCHJOBS.plural)) == names


def test_what_a_bucket_writer_plants_is_never_acted_on(
    api: RealAPI, backend: KubernetesBackend
) -> None:
    """Markers, a beacon and a verdict written without the run's key: the operator counts
    no rank done, fails no leg, kills nothing and concludes nothing from them."""
    backend.launch_legs(backend.plan.legs)
    store = backend.location.store
    for rank in (0, 1):
        store.put_bytes(f"control/done/rank-{rank}.json", json.dumps(
            {"rank": rank, "attempt": 0, "steps": 6, "at": 1.0}).encode())
    store.put_bytes("control/FAILED.json", b'{"reason": "planted", "at": 1.0}')
    obs = backend.observe_leg("control")
    assert (obs.state, obs.message) == (LegState.RUNNING, None)
    # Sealed for another run (its uid): no better.
    other = RunLocation.open(backend.location.uri, seal=MasterKey.generated().seal("other"))
    other.leg("control").mark_rank_done(0, 0, 6)
    assert backend.location.ranks_done("control") == set()
    store.put_bytes("preempted/beacons/attempt-0-rank-1.json", json.dumps(
        {"pid": 7, "host": "h", "pod": "victim", "rank": 1, "attempt": 0, "step": 4,
         "microstep": 1, "armedAt": 1.0}).encode())
    with pytest.raises(NotAuthentic, match="not a beacon of this run"):
        backend.read_beacon("preempted", 1)
    # A PASS put where the comparator's FAIL would go, once its Job has ended.
    assert backend.compare() is None
    store.put_bytes("verdict.json", verdict(Result.PASS).model_dump_json().encode())
    api.patch_status(JOBS.plural, NAMESPACE, backend.comparator_name, failed_job_status())
    with pytest.raises(ComparatorFailed, match=r"left no readable verdict: .*verdict\.json"):
        backend.compare()
    # What the operator itself wrote for the legs is sealed for them.
    seal = backend.location.seal
    assert seal is not None and seal == MasterKey.generated().seal(backend.run.uid)
    leg_spec = json.loads(store.get_bytes("legs/preempted.spec.json"))
    assert seal.open_json("legs/preempted.spec.json", leg_spec) is not None
