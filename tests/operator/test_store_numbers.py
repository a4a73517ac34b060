"""Numbers read back from the store are bounded before they become status: a trace record
whose ``finished_at`` no timestamp can hold is no resume time, a beacon whose numbers no
status holds is refused naming the field, and a time out of range that reached the machine
anyway is clamped in the status, never raised on every reconcile."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest

from resumequal.errors import NotAuthentic
from resumequal.qualify.machine import LegRun, Phase, QualificationStatus
from resumequal.qualify.plan import qualification_plan
from resumequal.run.beacons import MAX_EPOCH_SECONDS, InvalidBeacon
from resumequal.run.progress import progress_of
from resumequal.trace.records import StepRecord
from resumequal_operator.backend import KubernetesBackend, RunRef
from resumequal_operator.kube import QUALIFICATION_RUNS, Kube
from resumequal_operator.status import run_status
from resumequal_operator.validation import parse_run_spec, qualification_spec
from testing.cluster.testapi import RealAPI
from testing.k8s_schemas import validate_qualificationrun
from testing.operator.harness import NAMESPACE, run_location, run_manifest
from testing.trace_records import step_record, trace_line

OUT_OF_RANGE = [1e300, -1e300, MAX_EPOCH_SECONDS + 1, float("inf"), float("nan")]


def _step(rank: int, attempt: int, step: int, finished_at: float) -> StepRecord:
    return step_record(rank, attempt, step, finished_at)


@pytest.mark.parametrize("at", OUT_OF_RANGE)
def test_a_finished_at_no_timestamp_can_hold_is_no_resume_time(at: float) -> None:
    records = {0: [_step(0, 0, 2, 10.0), _step(0, 1, 3, at)]}
    assert progress_of(records, 1).resumed_at is None
    # The next record of the attempt that holds a time is the resume's.
    records[0].append(_step(0, 1, 4, 20.0))
    assert progress_of(records, 1).resumed_at == 20.0


def test_a_trace_record_with_finished_at_1e300_leaves_the_leg_unresumed(
    api: RealAPI, tmp_path: Path
) -> None:
    obj = api.create(QUALIFICATION_RUNS.plural,
                     run_manifest("huge", {"uri": f"file://{tmp_path}/store"}))
    ref, spec = RunRef.of(obj), parse_run_spec(obj["spec"])
    uri = f"{tmp_path}/store/{NAMESPACE}/huge/{ref.uid}"
    qspec = qualification_spec(spec, uri)
    backend = KubernetesBackend(Kube(api.api_client()), ref, spec, qspec,
                                qualification_plan(qspec), run_location(uri, ref.uid))
    backend.launch_legs([backend.plan.leg("preempted")])
    for rank in (0, 1):  # whoever can write the store wrote these
        sink = backend.location.trace_sink("preempted", rank, 1)
        sink.append(trace_line(_step(rank, 1, 5, 1e300)))
        sink.close()
    seen = backend.observe_leg("preempted")
    assert seen.attempts == 2 and seen.resumed_at is None


@pytest.mark.parametrize(("field", "value"), [
    ("rank", 10**30), ("pid", -1), ("step", 2**31), ("armed_at", 1e300),
    ("armed_at", float("inf")), ("armed_at", float("nan")),
])
def test_a_beacon_whose_numbers_no_status_holds_is_refused_naming_the_field(
    api: RealAPI, tmp_path: Path, field: str, value: float,
) -> None:
    obj = api.create(QUALIFICATION_RUNS.plural,
                     run_manifest("beacon", {"uri": f"file://{tmp_path}/store"}))
    ref, spec = RunRef.of(obj), parse_run_spec(obj["spec"])
    uri = f"{tmp_path}/store/{NAMESPACE}/beacon/{ref.uid}"
    qspec = qualification_spec(spec, uri)
    backend = KubernetesBackend(Kube(api.api_client()), ref, spec, qspec,
                                qualification_plan(qspec), run_location(uri, ref.uid))
    body = {"pid": 7, "host": "h", "pod": "p-worker-1", "rank": 1, "attempt": 0, "step": 4,
            "microstep": 1, "armed_at": 100.0, field: value}
    files = backend.location.leg("preempted")
    key = files.beacon_key(1, 0)
    seal = backend.location.seal
    assert seal is not None
    if math.isfinite(value):
        # Sealed with the run's key: a worker of the run (or whoever holds its key) wrote it.
        files.store.put_bytes(key, seal.seal_json(key, body))
        with pytest.raises(InvalidBeacon, match=f"not a beacon: {field}"):
            backend.read_beacon("preempted", 1)
    else:
        # No writer that seals can write Infinity or NaN (its MAC covers canonical JSON,
        # which has neither); json.dumps writes them, and json.loads takes them back.
        with pytest.raises(ValueError):
            seal.seal_json(key, body)
        files.store.put_bytes(key, json.dumps({**body, "mac": "0" * 64}).encode())
        with pytest.raises(NotAuthentic, match="not a beacon of this run"):
            backend.read_beacon("preempted", 1)


@pytest.mark.parametrize("at", OUT_OF_RANGE)
def test_a_stored_time_out_of_range_is_clamped_in_the_status_with_a_warning(
    at: float, caplog: pytest.LogCaptureFixture
) -> None:
    # As a machine restored from an older status, or one a status writer edited, holds it.
    machine = QualificationStatus(phase=Phase.RESUMED, legs={
        "preempted": LegRun(launched_at=1.0, killed_at=10.0, resumed_at=at),
        "control": LegRun(launched_at=1.0, finished_at=at)})
    with caplog.at_level(logging.WARNING, logger="resumequal_operator.resource"):
        status = run_status(machine, previous=None, generation=1, pin="train:1",
                            run_uri="s3://b/p", report_url=None, leg_jobs={},
                            comparator_job=None, preemption_mode="hard", run_spec={})
    body = status.to_k8s()
    shown = "1970-01-01T00:00:00Z" if not at > 0 else "9999-12-31T23:59:59Z"
    assert body["legs"]["preempted"]["resumedAt"] == shown
    assert body["legs"]["control"]["finishedAt"] == shown
    assert "out of range" in caplog.text
    run = run_manifest("clamped", {"uri": "s3://bucket/runs"})
    validate_qualificationrun({**run, "status": body})  # the API server takes it
