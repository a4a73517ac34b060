"""QualificationRuns end to end with real pods: the operator against the API emulator, the
faithful training operator, Job controller and kubelet (testing/kubeapi), every container a
real process tree — `resumequal launch` around real torchrun reading only the PET_*
variables, real gloo, real signals from the kubelet, the real comparator Job
(`resumequal compare --write`) — and SeaweedFS as the S3 store.

Each preemption users face: a hard pod kill (a lost node: the kubelet's SIGTERM is answered
by SIGKILL, nothing is saved, the pod is recreated under its name), a graceful pod kill (a
drained node: the emergency checkpoint), a process kill (a kill order: the worker SIGKILLs
itself, torchrun restarts the group inside the same pods), and an elastic resize (the
lost node is not replaced until the shrunk world asks to grow). TrainJob legs run on the
real Trainer and JobSet in the cluster suite (tests/cluster).
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
from resumequal_operator.kube import JOBS, PYTORCHJOBS, QUALIFICATION_RUNS
from resumequal_operator.manager import Operator
from resumequal_operator.pytorchjob import LEG_LABEL
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
             runtime: ProcessRuntime, **preemption: Any) -> tuple[Operator, Obj, RunLocation]:
    op = operators.start()
    api.create(QUALIFICATION_RUNS.plural, run_manifest(
        name, store, **SPEC,
        preemption={"step": 4, "microstep": 1, "rank": 1, **preemption}))
    done = wait_phase(api, name, ("Succeeded", "Failed"), timeout=400)
    assert done["status"]["phase"] == "Succeeded", (condition(done, "Ready"), runtime.logs())
    location = RunLocation.open(done["status"]["runUri"], S3Spec(
        endpoint_url=store["endpointUrl"], region=store["region"], addressing_style="path"))
    return op, done, location


def _checkpoints(location: RunLocation, leg: str) -> set[str]:
    base = f"{leg}/checkpoints/"
    return {o.key[len(base):].split("/", 1)[0] for o in location.store.list(f"{leg}/checkpoints")}


def _check_pass(op: Operator, api: KubeAPI, done: Obj, name: str, admission: Admission) -> Obj:
    """The verdict, conditions, Events and metrics of a passing run; its verdict."""
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
    leg_jobs = api.created(PYTORCHJOBS.plural)
    assert len(leg_jobs) == 2 and len(api.created(JOBS.plural)) == 1
    assert admission.validated[leg_jobs[0]["kind"]] >= 2 and admission.validated["Job"] >= 1
    # Every job it started is deleted once it concluded.
    assert [j["metadata"]["name"] for j in api.list(PYTORCHJOBS.plural, NAMESPACE)] == []
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
