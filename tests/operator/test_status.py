"""A run's status from the machine: conditions, transition times, the verdict summary."""

from __future__ import annotations

from resumequal.qualify.machine import LegRun, Phase, QualificationStatus, Reason
from resumequal.results.verdict import Cut, Divergence, Result, Verdict
from resumequal.run.beacons import Beacon
from resumequal_operator.runstatus import QualificationRunStatus
from resumequal_operator.status import machine_of, run_status


def _status(machine: QualificationStatus,
            previous: QualificationRunStatus | None = None) -> QualificationRunStatus:
    return run_status(machine, previous=previous, generation=3, pin="train:1",
                      run_uri="s3://b/p/ns/r/u", report_url=None,
                      leg_jobs={"control": "r-control-1", "preempted": "r-preempted-2"},
                      comparator_job=None, preemption_mode="hard", run_spec={"x": 1})


def _conditions(s: QualificationRunStatus) -> dict[str, tuple[str, str | None]]:
    return {c.type: (c.status, c.reason) for c in s.conditions}


def test_conditions_follow_the_phase_and_keep_their_transition_time() -> None:
    m = QualificationStatus(phase=Phase.LEGS_RUNNING,
                            legs={"control": LegRun(launched_at=100.0), "preempted": LegRun()})
    first = _status(m)
    assert _conditions(first) == {"Ready": ("Unknown", "LegsRunning"),
                                  "Qualified": ("Unknown", "NoVerdict")}
    assert first.legs["control"].job == "r-control-1" and first.legs["preempted"].job is None
    m.phase = Phase.ARMED
    again = _status(m, first)
    # Still Unknown: the transition time stays that of the first write.
    assert again.conditions[0].last_transition_time == first.conditions[0].last_transition_time
    m.phase, m.reason, m.message = Phase.FAILED, Reason.TIMEOUT, "did not resume"
    failed = _status(m, again)
    assert _conditions(failed) == {"Ready": ("False", "Timeout"),
                                   "Qualified": ("False", "Timeout")}
    assert failed.conditions[0].message == "did not resume"
    assert failed.conditions[0].observed_generation == 3


def test_a_verdict_is_summarised_and_the_machine_kept_without_it() -> None:
    v = Verdict(result=Result.FAIL, reason="diverged", cut=Cut(step=6, microstep=1, rank=1,
                                                               mode="hard"),
                resumed_from="step-4", exact_through_step=5, checks=[],
                first_divergence=Divergence(step=6, boundary="lr", rank=1, control=1,
                                            preempted=2, before_cut=False))
    beacon = Beacon(pid=1, host="h", pod="r-preempted-2-worker-1", rank=1, attempt=0, step=6,
                    microstep=1, armed_at=1.0)
    m = QualificationStatus(phase=Phase.SUCCEEDED, reason=Reason.COMPLETED, verdict=v,
                            legs={"preempted": LegRun(launched_at=1.0, beacon=beacon,
                                                      killed_at=10.0, resumed_at=12.5)})
    s = _status(m)
    assert s.verdict is not None and s.verdict.first_divergence_summary == "step 6 lr rank 1"
    assert _conditions(s)["Qualified"] == ("False", "FAIL")
    assert _conditions(s)["Ready"] == ("True", "Completed")
    assert s.legs["preempted"].restart_seconds == 2.5
    assert s.preemption is not None and s.preemption.pod == "r-preempted-2-worker-1"
    assert "verdict" not in s.machine and s.machine["runSpec"] == {"x": 1}
    # A difference in the restored state says so where kubectl shows the summary.
    assert v.first_divergence is not None
    v.first_divergence.at_restore, v.first_divergence.boundary = True, "params"
    restored = _status(m)
    assert restored.verdict is not None
    assert restored.verdict.first_divergence_summary == "step 6 params rank 1 at the restore"
    k8s = s.to_k8s()
    assert k8s["verdict"]["firstDivergence"] == {"step": 6, "boundary": "lr", "rank": 1}
    restored = machine_of(QualificationRunStatus.model_validate(k8s))
    assert restored is not None and restored.phase == Phase.SUCCEEDED
    assert restored.legs["preempted"].killed_at == 10.0
    # Stored camelCase like the rest of the status; a machine stored by name still reads.
    leg = k8s["machine"]["legs"]["preempted"]
    assert (leg["killedAt"], leg["beacon"]["armedAt"]) == (10.0, 1.0) and "killed_at" not in leg
    by_name = {**m.model_dump(mode="json", exclude={"verdict"}), "runSpec": {"x": 1}}
    older = machine_of(QualificationRunStatus.model_validate({**k8s, "machine": by_name}))
    assert older is not None and older.legs["preempted"].beacon == beacon
    # The summary outlives the machine's verdict on the next write.
    assert _status(restored, s).verdict == s.verdict
