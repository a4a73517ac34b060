"""The qualification state machine, independent of where legs run.

Pending → LegsRunning → Armed → Preempted → Resumed → Comparing → Succeeded | Failed.

The machine is level-triggered: each :meth:`Qualification.tick` observes the legs through
a backend, acts (launch, kill, compare) and moves at most as far as the observations
allow. Its whole memory is a serialisable :class:`QualificationStatus`, so a controller
that restarts can continue from a stored status. It knows nothing about processes, pods
or torch: the backend does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from resumequal.errors import ClusterError, NotAuthentic, StoreError
from resumequal.qualify.plan import LegPlan, Plan, qualification_plan
from resumequal.redact import redact
from resumequal.results.verdict import Cut, PhaseEvent, Result, ValidityCheck, Verdict
from resumequal.run.beacons import Beacon, InvalidBeacon, KillOrder
from resumequal.spec import PreemptionSpec, QualificationSpec
from resumequal.words import clip

log = logging.getLogger(__name__)



class Phase(StrEnum):
    PENDING = "Pending"
    LEGS_RUNNING = "LegsRunning"
    ARMED = "Armed"
    PREEMPTED = "Preempted"
    RESUMED = "Resumed"
    COMPARING = "Comparing"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class Reason(StrEnum):
    TIMEOUT = "Timeout"
    LEG_FAILED = "LegFailed"
    INVALID = "Invalid"
    INTERRUPTED = "Interrupted"
    ERROR = "Error"
    COMPLETED = "Completed"


# The machine's memory reads both spellings and dumps camelCase when asked (by_alias):
# a cluster keeps it in a resource's status, where every field is camelCase.
_STATE_CONFIG = ConfigDict(alias_generator=to_camel, validate_by_name=True,
                           validate_by_alias=True)


def kill_order(beacon: Beacon, preemption: PreemptionSpec) -> KillOrder:
    """The order that kills the worker ``beacon`` names, as ``preemption`` says, issued now;
    in the store it also dates the kill (see ``resumequal.qualify.timeline``)."""
    return KillOrder(rank=beacon.rank, attempt=beacon.attempt, pid=beacon.pid,
                     pod_uid=beacon.pod_uid, mode=preemption.mode,
                     grace_seconds=preemption.grace_seconds, issued_at=time.time())


class LegState(StrEnum):
    NOT_STARTED = "NotStarted"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class LegObservation(BaseModel):
    """What a backend can see of one leg right now."""

    state: LegState
    steps_done: int = 0
    attempts: int = 0
    resumed_at: float | None = Field(
        default=None, description="when the first step of an attempt >= 1 finished"
    )
    message: str | None = None


class Backend(Protocol):
    """Where legs run: torchrun processes on this machine, or PyTorchJobs on a cluster."""

    def launch_legs(self, plans: Sequence[LegPlan]) -> None:
        """Start these legs, each with its own spec; must be idempotent for a leg already
        started."""

    def observe_leg(self, leg: str) -> LegObservation:
        """The leg's current state, progress and attempts."""
        ...

    def read_beacon(self, leg: str, rank: int) -> Beacon | None:
        """The armed worker's beacon of attempt 0, once it exists."""
        ...

    def deliver_kill(self, leg: str, beacon: Beacon, preemption: PreemptionSpec) -> None:
        """Kill the armed worker of ``leg`` as ``preemption`` says: its process or its pod,
        hard, or SIGTERM then SIGKILL after the grace period."""

    def compare(self) -> Verdict | None:
        """Compare the finished legs and conclude; ``None`` while the comparison still runs.

        A cluster runs the comparator as a Job, so its verdict arrives on a later tick;
        the machine stays in Comparing until then, for at most ``timeouts.leg_seconds``.
        """
        ...

    def cleanup(self) -> None:
        """Stop everything this backend started; safe to call more than once."""


class LegRun(BaseModel):
    """What the machine remembers of one leg."""

    model_config = _STATE_CONFIG

    launched_at: float | None = None
    armed_at: float | None = None
    beacon: Beacon | None = None
    killed_at: float | None = None
    resumed_at: float | None = None
    finished_at: float | None = None
    steps: int = 0
    attempts: int = 0


class ErrorStreak(BaseModel):
    """Consecutive ticks that failed on the API or the store, since the last clean one."""

    since: float
    attempts: int = 1
    message: str


class QualificationStatus(BaseModel):
    """The machine's whole memory; what a controller would keep in a resource's status."""

    model_config = _STATE_CONFIG

    phase: Phase = Phase.PENDING
    reason: Reason | None = None
    message: str | None = None
    history: list[PhaseEvent] = Field(default_factory=list)
    legs: dict[str, LegRun] = Field(default_factory=dict)
    verdict: Verdict | None = None
    errors: ErrorStreak | None = None

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL

    def main(self) -> LegRun:
        return self.legs.get(MAIN_LEG, LegRun())

    def enter(self, phase: Phase, at: float, reason: Reason | None = None,
              message: str | None = None) -> None:
        """The machine enters ``phase`` at ``at``: the one place its phase, reason, message
        and history change. :class:`Qualification` drives it; from outside, :meth:`stop`."""
        self.phase = phase
        # Messages quote what legs and stores said (a failure reason of any length): they
        # become status fields and Events, bounded there.
        message = None if message is None else clip(redact(message))
        if reason is not None:
            self.reason = reason
            self.message = message
        self.history.append(PhaseEvent(phase=phase.value, at=at, reason=reason,
                                       message=message))

    def stop(self, reason: Reason, message: str, at: float) -> None:
        """End the run as Failed from outside the machine (a controller refusing to go on
        with it), as :meth:`Qualification.fail` would; a run already done keeps its ending.
        Whoever stops it stops what the run started: there is no backend here."""
        if not self.done:
            self.enter(Phase.FAILED, at, reason, message)


MAIN_LEG = "preempted"


def failed_reason(status: QualificationStatus) -> str:
    """Why a run that ended without a comparison tested nothing: ``<Reason>: <message>``."""
    return f"{status.reason.value if status.reason else 'Failed'}: {status.message or ''}"


def failed_verdict(spec: QualificationSpec, status: QualificationStatus) -> Verdict:
    """The INVALID verdict of a run that ended without a comparison (a timeout, a failed
    leg)."""
    p = spec.preemption
    return Verdict(
        result=Result.INVALID,
        reason=failed_reason(status),
        cut=Cut(step=p.step, microstep=p.microstep, rank=p.rank, mode=p.mode, at=p.at),
        resumed_from=None,
        first_divergence=None,
        exact_through_step=0,
        checks=[ValidityCheck(name="qualification completed", ok=False,
                              detail=status.message or "no detail")],
    )


class Qualification:
    """Drives one qualification through its phases with a backend.

    Phases follow the main preempted leg; other cut legs (negative controls, scenarios)
    go through the same arm, kill and resume steps with the same timeouts.
    """

    def __init__(
        self,
        spec: QualificationSpec,
        backend: Backend,
        *,
        plan: Plan | None = None,
        status: QualificationStatus | None = None,
        side_by_side: bool = False,
        deliver_kill: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.backend = backend
        self.plan = plan or qualification_plan(spec)
        self.status = status or QualificationStatus()
        self.side_by_side = side_by_side
        self.kill_enabled = deliver_kill
        self.clock = clock
        for leg in self.plan.legs:
            self.status.legs.setdefault(leg.name, LegRun())
        if not self.status.history:
            self._enter(Phase.PENDING)

    # -- transitions --------------------------------------------------------------------

    def _enter(
        self, phase: Phase, reason: Reason | None = None, message: str | None = None
    ) -> None:
        s = self.status
        s.enter(phase, self.clock(), reason, message)
        log.info("phase %s%s", phase.value, f" ({reason.value}: {s.message})" if reason else "")

    def fail(self, reason: Reason, message: str) -> None:
        """End the qualification as Failed and stop everything the backend started."""
        if not self.status.done:
            self._enter(Phase.FAILED, reason, message)
        try:
            self.backend.cleanup()
        except (ClusterError, StoreError) as e:
            # The run has ended either way; what is left is owned by the run and goes with
            # it (owner references, the operator's sweep of finished runs).
            log.warning("cleanup after %s failed: %s", reason.value, e)

    def _main_enters(self, leg: LegPlan, phase: Phase, message: str | None = None) -> None:
        """Phases follow the lead leg: the main preempted leg, else the first cut leg."""
        lead = next((p for p in self.plan.legs if p.role == "main"), None)
        lead = lead or next(p for p in self.plan.legs if p.cut)
        if leg.name == lead.name:
            self._enter(phase, message=message)

    # -- one level-triggered step --------------------------------------------------------

    def tick(self) -> Phase:
        """Observe, act, and advance as far as the observations allow.

        Deadlines are judged from the machine's memory before the backend is asked
        anything, so an API or a store that does not answer cannot keep a run alive. An
        API or store error is raised for the caller to retry, until errors have lasted
        ``timeouts.backendErrorSeconds``: then the run fails with the last message.
        """
        s = self.status
        if s.done:
            return s.phase
        if s.phase == Phase.PENDING:
            self._enter(Phase.LEGS_RUNNING)
        try:
            self._check_deadlines()
            self._tick_legs()
            if all(s.legs[p.name].finished_at is not None for p in self.plan.legs):
                if s.phase != Phase.COMPARING:
                    self._enter(Phase.COMPARING)
                self._compare()
        except _Stop:
            return s.phase
        except (ClusterError, StoreError) as e:
            if self._persisting(e):
                return s.phase
            raise
        s.errors = None
        return s.phase

    def _persisting(self, error: Exception) -> bool:
        """Count one more failed tick; fail the run when errors have lasted too long."""
        s, now = self.status, self.clock()
        message = clip(redact(str(error) or type(error).__name__))
        if s.errors is None:
            s.errors = ErrorStreak(since=now, message=message)
        else:
            s.errors.attempts += 1
            s.errors.message = message
        limit = self.spec.timeouts.backend_error_seconds
        if now - s.errors.since < limit:
            return False
        self.fail(Reason.ERROR, f"{message} (failing for {now - s.errors.since:.0f}s, "
                  f"{s.errors.attempts} attempts; timeouts.backendErrorSeconds={limit:g})")
        return True

    def _check_deadlines(self) -> None:
        """Every timeout the machine can judge without asking the backend."""
        s, t = self.status, self.spec.timeouts
        now = self.clock()
        # The armed worker gives up on its own after the same timeout; judge the timeout
        # before the leg failure it causes, so the reason says what went wrong.
        for plan in self.plan.legs:
            run = s.legs[plan.name]
            if (run.armed_at is not None and run.killed_at is None and not self.kill_enabled
                    and now - run.armed_at > t.arm_seconds):
                assert run.beacon is not None
                self._stop(Reason.TIMEOUT, f"the armed worker of the {plan.name} leg (rank "
                           f"{run.beacon.rank}, pid {run.beacon.pid}) was not killed within "
                           f"timeouts.armSeconds={t.arm_seconds:g}")
        for plan in self.plan.legs:
            run = s.legs[plan.name]
            if run.launched_at is None or run.finished_at is not None:
                continue
            if (run.killed_at is not None and run.resumed_at is None
                    and now - run.killed_at > t.restart_seconds):
                self._stop(Reason.TIMEOUT, f"the {plan.name} leg did not resume within "
                           f"timeouts.restartSeconds={t.restart_seconds:g}")
            if now - run.launched_at > t.leg_seconds:
                self._stop(Reason.TIMEOUT, f"the {plan.name} leg did not finish within "
                           f"timeouts.legSeconds={t.leg_seconds:g}")
        since = self._entered(Phase.COMPARING) if s.phase == Phase.COMPARING else None
        if since is not None and now - since > t.leg_seconds:
            # A comparison is as long as a leg at most: it reads what the legs wrote.
            self._stop(Reason.TIMEOUT, "the comparison did not finish within "
                       f"timeouts.legSeconds={t.leg_seconds:g}")

    def _tick_legs(self) -> None:
        s = self.status
        now = self.clock()
        for plan in self.plan.legs:
            run = s.legs[plan.name]
            if run.launched_at is None or run.finished_at is not None:
                continue
            try:
                obs = self.backend.observe_leg(plan.name)
            except (InvalidBeacon, NotAuthentic) as e:  # a resize's grow beacon, while observing
                self._stop(Reason.ERROR, f"the {plan.name} leg's beacon is refused: {e}")
            run.steps, run.attempts = obs.steps_done, obs.attempts
            if obs.state == LegState.FAILED:
                self._stop(Reason.LEG_FAILED,
                           f"the {plan.name} leg failed: {obs.message or 'no detail'}")
            if plan.cut:
                self._drive_cut(plan, run, obs, now)
            if obs.state == LegState.SUCCEEDED:
                run.finished_at = now
        self._launch_next()

    def _drive_cut(self, plan: LegPlan, run: LegRun, obs: LegObservation, now: float) -> None:
        p = plan.spec.preemption
        if run.armed_at is None:
            try:
                beacon = self.backend.read_beacon(plan.name, p.rank)
            except (InvalidBeacon, NotAuthentic) as e:
                self._stop(Reason.ERROR, f"the {plan.name} leg's beacon is refused: {e}")
            if beacon is not None:
                run.beacon, run.armed_at = beacon, now
                self._main_enters(plan, Phase.ARMED)
            elif obs.state == LegState.SUCCEEDED:
                self._stop(Reason.INVALID,
                           f"the {plan.name} leg finished without reaching its cut")
        if run.armed_at is not None and run.killed_at is None and self.kill_enabled:
            assert run.beacon is not None
            self.backend.deliver_kill(plan.name, run.beacon, p)
            run.killed_at = self.clock()
            self._main_enters(plan, Phase.PREEMPTED,
                              f"{plan.name}: killed pid {run.beacon.pid} ({p.mode})")
        if run.killed_at is not None and run.resumed_at is None \
                and obs.resumed_at is not None:
            run.resumed_at = obs.resumed_at
            self._main_enters(plan, Phase.RESUMED)

    def _launch_next(self) -> None:
        s = self.status
        running = [p for p in self.plan.legs
                   if s.legs[p.name].launched_at is not None and s.legs[p.name].finished_at is None]
        limit = 2 if self.side_by_side else 1
        waiting = [p for p in self.plan.legs if s.legs[p.name].launched_at is None]
        starting = waiting[:max(limit - len(running), 0)]
        if not starting:
            return
        self.backend.launch_legs(starting)
        now = self.clock()
        for plan in starting:
            s.legs[plan.name].launched_at = now

    def _entered(self, phase: Phase) -> float | None:
        """When the machine last entered ``phase``, from its history."""
        return next((e.at for e in reversed(self.status.history) if e.phase == phase.value),
                    None)

    def _stop(self, reason: Reason, message: str) -> None:
        self.fail(reason, message)
        raise _Stop

    def _compare(self) -> None:
        verdict = self.backend.compare()
        if verdict is None:
            return  # still running; _check_deadlines bounds it
        self.status.verdict = verdict
        if verdict.result == Result.INVALID:
            self.fail(Reason.INVALID, verdict.reason)
        else:
            self._enter(Phase.SUCCEEDED, Reason.COMPLETED, f"{verdict.result}: {verdict.reason}")
            self.backend.cleanup()

    def run(
        self,
        poll_seconds: float = 0.2,
        on_tick: Callable[[QualificationStatus], None] | None = None,
    ) -> QualificationStatus:
        """Tick until done; any exception or Ctrl-C stops everything the backend started.

        An API or store error is retried on the next tick, as the operator retries its
        handler, until :meth:`tick` ends the run after ``timeouts.backendErrorSeconds``."""
        try:
            while not self.status.done:
                try:
                    self.tick()
                except (ClusterError, StoreError):
                    streak = self.status.errors
                    assert streak is not None  # tick re-raises only while it counts one
                    log.warning("tick failed (attempt %d, retrying until timeouts."
                                "backendErrorSeconds=%g): %s", streak.attempts,
                                self.spec.timeouts.backend_error_seconds, streak.message)
                if on_tick is not None:
                    on_tick(self.status)
                if not self.status.done:
                    time.sleep(poll_seconds)
        except KeyboardInterrupt:
            self.fail(Reason.INTERRUPTED, "interrupted by the user")
            raise
        except BaseException as e:
            self.fail(Reason.ERROR, f"{type(e).__name__}: {e}")
            raise
        return self.status


class _Stop(Exception):
    """The machine reached Failed inside a tick; unwinds to tick()."""
