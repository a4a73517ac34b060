"""QualificationRuns end to end with real pods: the operator against the API emulator, the
faithful training operator, Job controller and kubelet (testing/kubeapi), every container a
real process tree — `resumequal launch` around real torchrun reading only the PET_*
variables, real gloo, real signals from the kubelet, the real comparator Job
(`resumequal compare --write`) — and SeaweedFS as the S3 store.

Each preemption users face: a hard pod kill (a lost node: the kubelet's SIGTERM is answered
by SIGKILL, nothing is saved, the pod is recreated under its name), a graceful pod kill (a
drained node: the emergency checkpoint), a process kill (a kill order: the worker SIGKILLs
itself, torchrun restarts the group inside the same pods), and an elastic resize (the
lost node is not replaced until the shrunk world asks to grow).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from resumequal.runstore import RunLocation
from resumequal.store.s3settings import S3Spec
from resumequal.trace.records import StepRecord
from resumequal.verdict import Report
from resumequal_operator.kube import JOBS, PYTORCHJOBS, QUALIFICATION_RUNS, TRAINJOBS, Kind
from resumequal_operator.legjobs import TrainerSettings
from resumequal_operator.manager import Operator
from resumequal_operator.pytorchjob import LEG_LABEL
from resumequal_operator.trainjob import COMPLETION_INDEX, leg_runtime
from testing.kubeapi import KubeAPI
from testing.kubeapi.kubeflow import REPLICA_INDEX
from testing.kubeapi.processes import ProcessRuntime
from testing.kubeapi.training import SimulatedTrainingOperator
from tests.exposition import scrape, value
from tests.operator.harness import (
    NAMESPACE,
    Admission,
    Operators,
    condition,
    events,
    run_manifest,
    wait_phase,
)
from tests.operator.test_rbac import chart_rules, request_of
from tests.waiting import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

Obj = dict[str, Any]
# Small legs: 2 pods x 1 rank, 6 steps of 2 microbatches, a checkpoint every 2 steps; the
# cut before microbatch 1 of step 4 on rank 1 (pod worker-1): the periodic checkpoint
# before it is step 2, an emergency one would be step 3 with 1 microbatch pending.
SPEC: Obj = {
    "workload": {"name": "tiny-gpt", "params": {"n_layers": 1, "d_model": 32}},
    "training": {"steps": 6, "accumulationSteps": 2, "microbatchSize": 4},
    "timeouts": {"processGroupSeconds": 120, "armSeconds": 90, "restartSeconds": 150,
                 "legSeconds": 300},
}


@pytest.fixture
def pods(kubeapi: KubeAPI, tmp_path: Path, aws_env: dict[str, str]
         ) -> Iterator[tuple[SimulatedTrainingOperator, ProcessRuntime]]:
    """The simulated cluster running every container as a real process; the store's
    credentials come from the node, as an instance role would give them."""
    runtime = ProcessRuntime(tmp_path / "pods", node_env=aws_env)
    sim = SimulatedTrainingOperator(kubeapi, runtime=runtime).start()
    try:
        yield sim, runtime
    finally:
        try:
            sim.stop()
        finally:
            print(runtime.logs())


def _events(api: KubeAPI, name: str) -> list[tuple[str, str]]:
    return [(reason, message) for reason, _, message in events(api, name)]


def _qualify(api: KubeAPI, operators: Operators, store: dict[str, str], name: str,
             runtime: ProcessRuntime, *, backend: str = "pytorchjob",
             **preemption: Any) -> tuple[Operator, Obj, RunLocation]:
    op = operators.start(**({"trainer": TrainerSettings()} if backend == "trainjob" else {}))
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        name, store, **SPEC, backend=backend,
        preemption={"step": 4, "microstep": 1, "rank": 1, **preemption}))
    done = wait_phase(api, name, ("Succeeded", "Failed"), timeout=400)
    assert done["status"]["phase"] == "Succeeded", (condition(done, "Ready"), runtime.logs())
    location = RunLocation.open(done["status"]["runUri"], S3Spec(
        endpoint_url=store["endpointUrl"], region=store["region"], addressing_style="path"))
    return op, done, location


def _checkpoints(location: RunLocation, leg: str) -> set[str]:
    base = f"{leg}/checkpoints/"
    return {o.key[len(base):].split("/", 1)[0] for o in location.store.list(f"{leg}/checkpoints")}


def _check_pass(op: Operator, api: KubeAPI, done: Obj, name: str, admission: Admission,
                kind: Kind = PYTORCHJOBS) -> Obj:
    """The verdict, conditions, Events and metrics of a passing run whose legs ran as
    ``kind``; its verdict."""
    status = done["status"]
    v = status["verdict"]
    assert v["result"] == "PASS" and v["firstDivergenceSummary"] == "none", v
    assert v["exactThroughStep"] == 6 and v["paramMaxAbsDiff"] == 0.0
    assert condition(done, "Ready")["status"] == "True"
    assert condition(done, "Qualified")["status"] == "True"
    legs = status["legs"]
    assert legs["preempted"]["attempts"] == 2 and legs["preempted"]["steps"] == 6
    assert legs["control"]["attempts"] == 1 and legs["control"]["steps"] == 6
    assert legs["preempted"]["restartSeconds"] > 0
    reasons = [r for r, _ in _events(api, name)]
    assert reasons[:2] == ["LegsRunning", "Armed"] and reasons[-2:] == ["Comparing", "Succeeded"]
    assert {"Preempted", "PreemptionInjected", "Resumed"} <= set(reasons)
    labels = {"namespace": NAMESPACE, "pin": "train:2026-11-29", "run": name,
              "scenario": "resume"}
    port = op.health.port
    assert eventually(lambda: value(scrape(port), "resumequal_qualification_passed", **labels)
                      == 1.0, what="the passed series")
    assert (value(scrape(port), "resumequal_restart_seconds", **labels) or 0) > 0
    leg_jobs = api.created(kind.plural)
    assert len(leg_jobs) == 2 and len(api.created(JOBS.plural)) == (3 if kind == TRAINJOBS else 1)
    assert admission.validated[leg_jobs[0]["kind"]] >= 2 and admission.validated["Job"] >= 1
    # Every job it started is deleted once it concluded.
    assert [j["metadata"]["name"] for j in api.list(kind.plural, NAMESPACE)] == []
    return dict(v)


def _comparator_timeline(location: RunLocation, kill: str) -> None:
    """The comparator Job's report has the kill time and the restart seconds, whichever
    way the kill was delivered (a pod deletion leaves a record of it for the timeline)."""
    report = Report.model_validate_json(location.store.get_bytes("report.json", 1 << 26))
    assert report.kill_at is not None and (report.restart_seconds or 0) > 0, report.phases
    [preempted] = [p for p in report.phases if p.phase == "Preempted"]
    assert preempted.at == report.kill_at and kill in (preempted.message or "")


def _resumed_from(location: RunLocation) -> str | None:
    """The checkpoint the resumed attempt loaded, as the comparator's verdict.json says."""
    verdict = location.read_verdict()
    assert verdict is not None
    return verdict.resumed_from


def test_a_hard_pod_kill_resumes_from_the_periodic_checkpoint(
    api: KubeAPI, operators: Operators, store: dict[str, str], admission: Admission,
    pods: tuple[SimulatedTrainingOperator, ProcessRuntime],
) -> None:
    _, runtime = pods
    op, done, location = _qualify(api, operators, store, "hard-pod", runtime,
                                  mode="hard", target="pod")
    _check_pass(op, api, done, "hard-pod", admission)
    # The pod was deleted with grace 0; its kubelet still sent SIGTERM first, and the
    # launcher answered with SIGKILL: no emergency checkpoint exists, the resume was from
    # the periodic one.
    [kill] = [d for d in api.deletions_of("pods") if d.cause == "api"]
    assert kill.name.endswith("-worker-1") and kill.grace_period_seconds == 0
    assert _resumed_from(location) == "step-00000002"
    assert not [c for c in _checkpoints(location, "preempted") if "+" in c], \
        _checkpoints(location, "preempted")
    injected = next(m for r, m in _events(api, "hard-pod") if r == "PreemptionInjected")
    assert "deleted pod" in injected and "hard pod kill" in injected
    _comparator_timeline(location, f"deleted pod {kill.name} (hard, grace 0s)")


def test_a_graceful_pod_kill_resumes_from_the_emergency_checkpoint(
    api: KubeAPI, operators: Operators, store: dict[str, str], admission: Admission,
    pods: tuple[SimulatedTrainingOperator, ProcessRuntime],
) -> None:
    _, runtime = pods
    op, done, location = _qualify(api, operators, store, "graceful-pod", runtime,
                                  mode="graceful", target="pod", graceSeconds=30)
    _check_pass(op, api, done, "graceful-pod", admission)
    [kill] = [d for d in api.deletions_of("pods") if d.cause == "api"]
    assert kill.name.endswith("-worker-1") and kill.grace_period_seconds == 30
    # The launcher passed SIGTERM on and exited 143 (retryable): the job was not failed,
    # the pod came back under its name, every rank stopped together and saved.
    assert _resumed_from(location) == "step-00000003+1"
    assert "step-00000003+1" in _checkpoints(location, "preempted")
    _comparator_timeline(location, f"deleted pod {kill.name} (graceful, grace 30s)")


def test_a_process_kill_restarts_the_group_in_its_pods(
    api: KubeAPI, operators: Operators, store: dict[str, str], admission: Admission,
    pods: tuple[SimulatedTrainingOperator, ProcessRuntime],
) -> None:
    _, runtime = pods
    op, done, location = _qualify(api, operators, store, "process", runtime,
                                  mode="hard", target="process")
    _check_pass(op, api, done, "process", admission)
    # Nothing was deleted: the armed worker obeyed its kill order (SIGKILL to itself) and
    # torchrun restarted the group inside the same pods.
    assert [d for d in api.deletions_of("pods") if d.cause == "api"] == []
    order = location.leg("preempted").read_kill_order(1, 0)
    assert order is not None and order.mode == "hard" and order.pod_uid
    assert _resumed_from(location) == "step-00000002"
    # What the operator's worker-0 rule rests on: with nprocPerNode 1, rank r runs on pod
    # worker-r, as the rendezvous orders nodes by host name: the beacon of the armed rank 1
    # names worker-1 (so rank 0 is worker-0's, of two).
    beacon = location.read_beacon("preempted", 1, 0)
    assert beacon is not None and str(beacon.pod).endswith("-worker-1"), beacon
    injected = next(m for r, m in _events(api, "process") if r == "PreemptionInjected")
    assert "ordered the kill of pid" in injected and "hard process kill" in injected
    _comparator_timeline(location, f"killed pid {order.pid} (hard)")


# -- elastic resize -----------------------------------------------------------------------

# The cut as above; the world then shrinks to worker-0 alone, resumes from step 2, commits
# step 4 and waits at step 5 for the grow: worker-1 comes back, steps 5-6 run on 2 ranks.
RESIZE: Obj = {"step": 4, "microstep": 1, "rank": 1, "mode": "hard", "target": "pod",
               "resize": {"toNodes": 1, "growAfterStep": 4}}
TOLERANCE: Obj = {"mode": "tolerance",
                  "tolerances": {"loss": 1.0e-4, "grad_norm": 1.0e-4, "params": 1.0e-4}}


class LegWrites:
    """Admission sees every write as the store commits it, in order: what happened to one
    leg's PyTorchJob (its Worker replicas, on each change) and its pods (each creation)."""

    def __init__(self, leg: str) -> None:
        self.leg = leg
        self.seen: list[tuple[str, int | str]] = []
        self._uids: set[str] = set()

    def __call__(self, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        if (meta.get("labels") or {}).get(LEG_LABEL) != self.leg:
            return
        if obj.get("kind") == "PyTorchJob":
            replicas = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
            if ("replicas", replicas) != next(
                    (e for e in reversed(self.seen) if e[0] == "replicas"), None):
                self.seen.append(("replicas", replicas))
        elif obj.get("kind") == "Pod" and meta["uid"] not in self._uids:
            self._uids.add(meta["uid"])
            self.seen.append(("pod", f"worker-{meta['labels'][REPLICA_INDEX]}"))


def _world_sizes(location: RunLocation, leg: str, rank: int) -> list[int | None]:
    """The world sizes one rank's steps ran at, in trace order, repeats collapsed."""
    out: list[int | None] = []
    for record in location.trace_records(leg, rank):
        if record["kind"] == "step":
            size = StepRecord.model_validate(record).world_size
            if not out or out[-1] != size:
                out.append(size)
    return out


def _check_resize_verdict(done: Obj, location: RunLocation) -> None:
    """The comparator Job judged the resize: exact before it, exact handoff and ledger,
    drift within the tolerances; the run succeeded on that PASS."""
    status = done["status"]
    verdict = location.read_verdict()
    assert verdict is not None and verdict.resize is not None, status
    assert status["phase"] == "Succeeded", (status, verdict.reason)
    assert status["verdict"]["result"] == verdict.result.value == "PASS", verdict.reason
    assert verdict.resumed_from == "step-00000002", verdict.resumed_from
    assert verdict.reason.startswith("resize: 2→1→2 ranks; exact through step 2 before the "
                                     "resize; handoff exact (2 restores); ledger exact"), \
        verdict.reason
    assert all(part.ok for part in verdict.resize.parts), verdict.resize.parts
    assert condition(done, "Qualified")["status"] == "True"


def test_a_resize_shrinks_the_world_and_grows_it_back(
    api: KubeAPI, operators: Operators, store: dict[str, str], admission: Admission,
    pods: tuple[SimulatedTrainingOperator, ProcessRuntime],
) -> None:
    _, runtime = pods
    writes = LegWrites("preempted")
    api.add_validator(writes)
    operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "resize", store, **SPEC, preemption=RESIZE, comparison=TOLERANCE))
    done = wait_phase(api, "resize", ("Succeeded", "Failed"), timeout=400)
    status = done["status"]
    legs = status["legs"]
    assert legs["preempted"].get("finishedAt") and legs["control"].get("finishedAt"), \
        (condition(done, "Ready"), runtime.logs())
    # The replicas went down before the kill and up at the grow; the victim pod came back
    # only then, under its name, created by the training operator.
    assert writes.seen[:1] == [("replicas", 2)]
    assert sorted(writes.seen[1:3]) == [("pod", "worker-0"), ("pod", "worker-1")]
    assert writes.seen[3:] == [("replicas", 1), ("replicas", 2), ("pod", "worker-1")], \
        writes.seen
    [kill] = [d for d in api.deletions_of("pods") if d.cause == "api"]
    assert kill.name.endswith("-worker-1") and kill.grace_period_seconds == 0
    patches = [p for m, p in api.requests if m == "PATCH" and "/pytorchjobs/" in p]
    assert len(patches) == 2 and len(set(patches)) == 1, patches
    reasons = [r for r, _ in _events(api, "resize")]
    assert reasons.index("Resized") < reasons.index("PreemptionInjected") \
        < reasons.index("Grown") < reasons.index("Comparing"), reasons
    assert reasons.count("Resized") == 1 and reasons.count("Grown") == 1, reasons
    grown = next(m for r, m in _events(api, "resize") if r == "Grown")
    assert "1 -> 2" in grown and "step 5" in grown, grown
    # 2 ranks until the cut, rank 0 alone from the checkpoint of step 2, 2 again after 4.
    location = RunLocation.open(status["runUri"], S3Spec(
        endpoint_url=store["endpointUrl"], region=store["region"], addressing_style="path"))
    assert _world_sizes(location, "preempted", 0) == [2, 1, 2]
    assert _world_sizes(location, "preempted", 1) == [2], "rank 1 skipped the shrunk world"
    assert _world_sizes(location, "control", 0) == [2]
    assert legs["preempted"]["steps"] == 6 and legs["control"]["steps"] == 6
    assert legs["preempted"]["attempts"] == 3 and legs["preempted"]["restartSeconds"] > 0
    assert location.ranks_done("preempted") == {0, 1} == location.ranks_done("control")
    assert len(api.created(JOBS.plural)) == 1 and admission.validated["PyTorchJob"] >= 4
    _check_resize_verdict(done, location)


# -- TrainJob legs (Kubeflow Trainer v2) ----------------------------------------------------


@pytest.fixture
def trainjob_pods(kubeapi: KubeAPI, tmp_path: Path, aws_env: dict[str, str]
                  ) -> Iterator[tuple[SimulatedTrainingOperator, ProcessRuntime]]:
    """As ``pods``, with Kubeflow Trainer v2 and JobSet served and the runtime the chart
    installs (tests/chart/test_chart.py holds the chart's rendering to this one); the
    containers see this repository's ``tests`` package (a resume that is not exact)."""
    kubeapi.register_trainer_crds()
    kubeapi.create("clustertrainingruntimes", leg_runtime())
    repo = str(Path(__file__).resolve().parents[2])
    runtime = ProcessRuntime(tmp_path / "pods", node_env={**aws_env, "PYTHONPATH": repo})
    sim = SimulatedTrainingOperator(kubeapi, runtime=runtime).start()
    try:
        yield sim, runtime
    finally:
        try:
            sim.stop()
        finally:
            print(runtime.logs())


def _node_pods(api: KubeAPI, leg: str) -> list[Obj]:
    """Every pod ever created for a leg's TrainJob, oldest first."""
    return [p for p in api.created("pods") if (p["metadata"].get("labels") or {}).get(
        LEG_LABEL) == leg and "jobset.sigs.k8s.io/jobset-name" in p["metadata"]["labels"]]


def _check_replaced(api: KubeAPI, kill_name: str) -> None:
    """The deleted pod of node 1 came back under a new name (same index), created by the
    Job controller after its pod failure backoff; node 0's pod was never touched."""
    pods = _node_pods(api, "preempted")
    by_index: dict[str, list[str]] = {}
    for p in pods:
        by_index.setdefault(p["metadata"]["annotations"][COMPLETION_INDEX], []).append(
            p["metadata"]["name"])
    assert len(by_index["0"]) == 1 and len(by_index["1"]) == 2, by_index
    assert by_index["1"][0] == kill_name and by_index["1"][1] != kill_name
    assert all(n.startswith(f"{kill_name.rsplit('-', 2)[0]}-1-") for n in by_index["1"])


def test_a_trainjob_hard_pod_kill_resumes_from_the_periodic_checkpoint(
    api: KubeAPI, operators: Operators, store: dict[str, str], admission: Admission,
    trainjob_pods: tuple[SimulatedTrainingOperator, ProcessRuntime],
) -> None:
    _, runtime = trainjob_pods
    op, done, location = _qualify(api, operators, store, "tj-hard", runtime,
                                  backend="trainjob", mode="hard", target="pod")
    _check_pass(op, api, done, "tj-hard", admission, kind=TRAINJOBS)
    assert done["status"]["backend"] == "trainjob"
    [kill] = [d for d in api.deletions_of("pods") if d.cause == "api"]
    assert kill.grace_period_seconds == 0
    _check_replaced(api, kill.name)
    # The Job counted the deleted pod (exit 137 after the launcher's SIGKILL) once, under
    # its backoffLimit; no emergency checkpoint exists, the resume was from step 2.
    assert _resumed_from(location) == "step-00000002"
    assert not [c for c in _checkpoints(location, "preempted") if "+" in c]
    assert admission.validated["TrainJob"] >= 2
    _comparator_timeline(location, f"deleted pod {kill.name} (hard, grace 0s)")
    # The chart's RBAC with TrainJob legs on allows every request this run made, and each
    # TrainJob rule was needed (a leg's TrainJob is read from the watch, never patched).
    rules = chart_rules({"trainjob": {"enabled": True}})
    made = [request_of(m, p) for m, p in api.requests]
    assert sorted({str(r) for r in made if not any(rule.allows(r) for rule in rules)}) == []
    used = {r.verb for r in made if r.resource == "trainjobs"}
    assert {rule.verb for rule in rules if rule.resource == "trainjobs"} - used <= {"get"}


def test_a_trainjob_graceful_pod_kill_resumes_from_the_emergency_checkpoint(
    api: KubeAPI, operators: Operators, store: dict[str, str], admission: Admission,
    trainjob_pods: tuple[SimulatedTrainingOperator, ProcessRuntime],
) -> None:
    _, runtime = trainjob_pods
    op, done, location = _qualify(api, operators, store, "tj-graceful", runtime,
                                  backend="trainjob", mode="graceful", target="pod",
                                  graceSeconds=30)
    _check_pass(op, api, done, "tj-graceful", admission, kind=TRAINJOBS)
    [kill] = [d for d in api.deletions_of("pods") if d.cause == "api"]
    assert kill.grace_period_seconds == 30
    _check_replaced(api, kill.name)
    # The launcher exited 143, which the runtime's podFailurePolicy counts (a signal
    # death) rather than failing the Job: every rank stopped together and saved.
    assert _resumed_from(location) == "step-00000003+1"
    _comparator_timeline(location, f"deleted pod {kill.name} (graceful, grace 30s)")


def test_a_trainjob_resume_that_is_not_exact_fails_and_is_zoomed_by_a_real_zoom_job(
    api: KubeAPI, operators: Operators, store: dict[str, str],
    trainjob_pods: tuple[SimulatedTrainingOperator, ProcessRuntime],
) -> None:
    _, runtime = trainjob_pods
    operators.start(trainer=TrainerSettings())
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "tj-fail", store, **{**SPEC, "workload": {"name": "tests.history_workload:build"}},
        backend="trainjob", preemption={"step": 4, "microstep": 1, "rank": 1},
        zoom="onFail"))
    done = wait_phase(api, "tj-fail", ("Succeeded", "Failed"), timeout=400)
    assert done["status"]["phase"] == "Succeeded", (condition(done, "Ready"), runtime.logs())
    verdict = done["status"]["verdict"]
    # The workload computes differently in a resumed process: the first step after the
    # resume from step 2 differs.
    assert verdict["result"] == "FAIL" and verdict["firstDivergence"]["step"] == 3, verdict
    assert "after the resume from step-00000002" in verdict["reason"]
    assert condition(done, "Qualified")["status"] == "False"
    assert [j["metadata"]["name"] for j in api.list(TRAINJOBS.plural, NAMESPACE)] == []
    # The zoom Job (the same batch Job for either backend) replays both legs in its pod,
    # from the bucket, with the run's key, and names the module.
    obj = eventually(lambda: (o := api.get(QUALIFICATION_RUNS.plural, NAMESPACE, "tj-fail"))
                     and o["status"].get("zoom", {}).get("state") in ("Succeeded", "Failed")
                     and o, timeout=300, what="the zoom Job to conclude")
    zoom = obj["status"]["zoom"]
    assert zoom["state"] == "Succeeded", (zoom, runtime.logs())
    assert zoom["originKind"] == "module" and zoom["origins"] == ["mix"], zoom
    location = RunLocation.open(done["status"]["runUri"], S3Spec(
        endpoint_url=store["endpointUrl"], region=store["region"], addressing_style="path"))
    report = Report.model_validate_json(location.store.get_bytes("report.json", 1 << 26))
    assert report.zoom is not None and all(r.reproduced for r in report.zoom.replays)
    assert report.zoom.step == report.verdict.first_divergence.step  # type: ignore[union-attr]
    assert b'id="zoom"' in location.store.get_bytes("report.html", 1 << 26)
    reasons = [r for r, _ in _events(api, "tj-fail")]
    assert reasons.count("ZoomStarted") == 1 and reasons.count("Zoomed") == 1


@pytest.mark.usefixtures("trainjob_pods")
def test_a_trainjob_leg_that_outlives_its_timeout_ends_the_run(
    api: KubeAPI, operators: Operators, store: dict[str, str],
) -> None:
    operators.start(trainer=TrainerSettings())
    # The killed pod comes back only after the Job's 10 s pod failure backoff: a leg
    # cannot finish within 15 s.
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        "tj-timeout", store, **{**SPEC, "timeouts": {**SPEC["timeouts"], "legSeconds": 15}},
        backend="trainjob", preemption={"step": 4, "microstep": 1, "rank": 1}))
    done = wait_phase(api, "tj-timeout", ("Succeeded", "Failed"), timeout=120)
    ready = condition(done, "Ready")
    assert done["status"]["phase"] == "Failed" and ready["reason"] == "Timeout", ready
    assert "did not finish within timeouts.legSeconds=15" in ready["message"], ready
    assert done["status"]["verdict"]["result"] == "INVALID"
    # Everything it started is deleted: the TrainJobs (their JobSets, Jobs and pods go
    # with them).
    eventually(lambda: not api.list(TRAINJOBS.plural, NAMESPACE), 30, "the TrainJobs deleted")
