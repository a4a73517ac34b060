"""A qualification's timeline: when it went through its phases, and the main leg's kill and
resume (the restart time).

A timeline comes from the qualification machine's memory when the caller has it (the
runner, the controller), and otherwise from the run location (the comparator): trace
records, beacons and kill orders carry the same timestamps on a folder and on S3.

Shared with the operator: it must import neither torch nor numpy, nor the reports; traces
are read as their records' models (:mod:`resumequal.trace.records`) through
:mod:`.traces`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from resumequal.errors import StoreError
from resumequal.qualify.machine import MAIN_LEG, Phase, QualificationStatus, Reason
from resumequal.results.verdict import PhaseEvent, Result, Verdict
from resumequal.run.beacons import Beacon, InvalidBeacon
from resumequal.run.location import RunLocation
from resumequal.run.progress import progress_of
from resumequal.spec import REFERENCE_LEG, QualificationSpec
from resumequal.trace.records import ArmRecord, StartupRecord, StepRecord

log = logging.getLogger(__name__)

# The pair every report summarises: the reference leg and the main preempted leg.
REPORTED_LEGS = (REFERENCE_LEG, MAIN_LEG)

__all__ = ["REPORTED_LEGS", "Timeline", "read_timeline", "restart_seconds"]


def restart_seconds(killed_at: float | None, resumed_at: float | None) -> float | None:
    """Kill -> first resumed step finished; None unless both happened."""
    if killed_at is None or resumed_at is None:
        return None
    return resumed_at - killed_at


class Timeline(BaseModel):
    """When the qualification went through its phases, and the main leg's kill and resume."""

    model_config = ConfigDict(extra="forbid")
    phases: list[PhaseEvent] = Field(default_factory=list)
    kill_at: float | None = None
    resumed_at: float | None = None

    @property
    def restart_seconds(self) -> float | None:
        return restart_seconds(self.kill_at, self.resumed_at)

    @classmethod
    def of(cls, status: QualificationStatus) -> Timeline:
        """From the machine's memory (what the runner and the controller hold)."""
        main = status.main()
        return cls(phases=list(status.history), kill_at=main.killed_at,
                   resumed_at=main.resumed_at)


def _earliest(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def read_timeline(location: RunLocation, spec: QualificationSpec, *, compared_at: float,
                  verdict: Verdict | None = None, concluded_at: float | None = None,
                  ) -> Timeline:
    """The timeline of a run from what its legs left in ``location`` (the comparator's view).

    LegsRunning: the first worker process started; Armed: the target rank's arm record (or
    beacon); Preempted: the kill order of a process kill, or the record of a pod deletion;
    Resumed: the last rank's first finished step of a later attempt;
    Comparing at ``compared_at``; then Succeeded or Failed as ``verdict`` concludes.
    """
    world, p = spec.world.world_size, spec.preemption
    legs = {leg: location.traces(leg).records_so_far(world) for leg in REPORTED_LEGS}
    every = [rec for per_rank in legs.values() for recs in per_rank.values() for rec in recs]
    started = _earliest(r.process_started_at for r in every if isinstance(r, StartupRecord))
    started = started if started is not None else _earliest(
        r.started_at for r in every if isinstance(r, StepRecord))
    main = legs[MAIN_LEG]
    armed = _earliest(r.armed_at for r in main.get(p.rank, [])
                      if isinstance(r, ArmRecord) and r.attempt == 0)
    beacon, killed_at, kill = None, None, None
    try:
        beacon = _beacon(location, p.rank)
        order = location.leg(MAIN_LEG).read_kill_order(p.rank, 0)
        pod_kill = None if order is not None else location.leg(MAIN_LEG).read_pod_kill(p.rank, 0)
    except StoreError as e:
        # A half-written beacon or record leaves the timeline without that event.
        log.warning("timeline: %s", e)
        order, pod_kill = None, None
    if order is not None:
        killed_at, kill = order.issued_at, f"killed pid {order.pid} ({order.mode})"
    elif pod_kill is not None:
        killed_at = pod_kill.issued_at
        kill = f"deleted pod {pod_kill.pod} ({pod_kill.mode}, grace {pod_kill.grace_seconds:g}s)"
    if armed is None and beacon is not None:
        armed = beacon.armed_at
    resumed = progress_of(main, world).resumed_at
    events: list[PhaseEvent] = []
    if started is not None:
        events.append(PhaseEvent(phase=Phase.LEGS_RUNNING.value, at=started))
    if armed is not None:
        events.append(PhaseEvent(phase=Phase.ARMED.value, at=armed))
    if killed_at is not None:
        events.append(PhaseEvent(phase=Phase.PREEMPTED.value, at=killed_at,
                                 message=f"{MAIN_LEG}: {kill}"))
    if resumed is not None:
        events.append(PhaseEvent(phase=Phase.RESUMED.value, at=resumed))
    events.append(PhaseEvent(phase=Phase.COMPARING.value, at=compared_at))
    if verdict is not None:
        events.append(_concluded(verdict, concluded_at if concluded_at is not None
                                 else compared_at))
    return Timeline(phases=events, kill_at=killed_at, resumed_at=resumed)


def _beacon(location: RunLocation, rank: int) -> Beacon | None:
    """The main leg's beacon of attempt 0; None when there is none, or it is no beacon."""
    try:
        return location.read_beacon(MAIN_LEG, rank)
    except InvalidBeacon as e:
        # Its fields only date the arming: the kill order is read all the same.
        log.warning("timeline: %s", e)
        return None


def _concluded(verdict: Verdict, at: float) -> PhaseEvent:
    """The machine's last phase once a verdict is in (see ``Qualification._compare``)."""
    if verdict.result == Result.INVALID:
        return PhaseEvent(phase=Phase.FAILED.value, at=at, reason=Reason.INVALID.value,
                          message=verdict.reason)
    return PhaseEvent(phase=Phase.SUCCEEDED.value, at=at, reason=Reason.COMPLETED.value,
                      message=f"{verdict.result}: {verdict.reason}")
