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
from collections.abc import Callable
from enum import StrEnum
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from resumequal.spec import QualificationSpec
from resumequal.verdict import PhaseEvent, Result, Verdict

log = logging.getLogger(__name__)

LegName = Literal["control", "preempted"]


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


class Beacon(BaseModel):
    """What an armed worker publishes: who to kill and where it stands."""

    model_config = ConfigDict(extra="ignore")
    pid: int
    host: str
    pod: str | None = None
    rank: int
    attempt: int
    step: int
    microstep: int
    at: str = "microbatch"
    armed_at: float


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

    def launch_leg(self, leg: LegName) -> None:
        """Start a leg; must be idempotent for a leg that is already running."""

    def observe_leg(self, leg: LegName) -> LegObservation:
        """The leg's current state, progress and attempts."""
        ...

    def read_beacon(self, leg: LegName) -> Beacon | None:
        """The armed worker's beacon of attempt 0, once it exists."""
        ...

    def deliver_kill(self, beacon: Beacon, mode: str, grace_seconds: float) -> None:
        """Kill the armed worker: hard, or SIGTERM then SIGKILL after the grace period."""

    def compare(self) -> Verdict:
        """Compare the finished legs."""
        ...

    def cleanup(self) -> None:
        """Stop everything this backend started; safe to call more than once."""


class QualificationStatus(BaseModel):
    """The machine's whole memory; what a controller would keep in a resource's status."""

    phase: Phase = Phase.PENDING
    reason: Reason | None = None
    message: str | None = None
    history: list[PhaseEvent] = Field(default_factory=list)
    launched: dict[str, float] = Field(default_factory=dict)
    armed_at: float | None = None
    beacon: Beacon | None = None
    killed_at: float | None = None
    resumed_at: float | None = None
    verdict: Verdict | None = None
    steps: dict[str, int] = Field(default_factory=dict)
    attempts: dict[str, int] = Field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.phase in TERMINAL


class Qualification:
    """Drives one qualification through its phases with a backend."""

    def __init__(
        self,
        spec: QualificationSpec,
        backend: Backend,
        *,
        status: QualificationStatus | None = None,
        side_by_side: bool = False,
        deliver_kill: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.spec = spec
        self.backend = backend
        self.status = status or QualificationStatus()
        self.side_by_side = side_by_side
        self.kill_enabled = deliver_kill
        self.clock = clock
        if not self.status.history:
            self._enter(Phase.PENDING)

    # -- transitions --------------------------------------------------------------------

    def _enter(
        self, phase: Phase, reason: Reason | None = None, message: str | None = None
    ) -> None:
        s = self.status
        s.phase = phase
        if reason is not None:
            s.reason = reason
            s.message = message
        s.history.append(PhaseEvent(phase=phase.value, at=self.clock(), reason=reason,
                                    message=message))
        log.info("phase %s%s", phase.value, f" ({reason.value}: {message})" if reason else "")

    def fail(self, reason: Reason, message: str) -> None:
        """End the qualification as Failed and stop everything the backend started."""
        if not self.status.done:
            self._enter(Phase.FAILED, reason, message)
        self.backend.cleanup()

    # -- one level-triggered step --------------------------------------------------------

    def tick(self) -> Phase:
        """Observe, act, and advance as far as the observations allow."""
        s = self.status
        if s.done:
            return s.phase
        now = self.clock()
        t = self.spec.timeouts
        if s.phase == Phase.PENDING:
            self._launch("control")
            if self.side_by_side:
                self._launch("preempted")
            self._enter(Phase.LEGS_RUNNING)

        # The armed worker gives up on its own after the same timeout; judge the timeout
        # before the leg failure it causes, so the reason says what went wrong.
        if (
            s.phase == Phase.ARMED
            and not self.kill_enabled
            and s.armed_at is not None
            and now - s.armed_at > t.arm_seconds
        ):
            assert s.beacon is not None
            self.fail(Reason.TIMEOUT, f"the armed worker (rank {s.beacon.rank}, pid "
                      f"{s.beacon.pid}) was not killed within timeouts.arm_seconds="
                      f"{t.arm_seconds:g}")
            return s.phase

        obs = {leg: self.backend.observe_leg(leg) for leg in ("control", "preempted")
               if leg in s.launched}
        for leg, o in obs.items():
            s.steps[leg] = o.steps_done
            s.attempts[leg] = o.attempts
            if o.state == LegState.FAILED:
                self.fail(Reason.LEG_FAILED, f"the {leg} leg failed: {o.message or 'no detail'}")
                return s.phase
            if o.state == LegState.RUNNING and now - s.launched[leg] > t.leg_seconds:
                self.fail(Reason.TIMEOUT, f"the {leg} leg did not finish within "
                          f"timeouts.leg_seconds={t.leg_seconds:g}")
                return s.phase

        if "preempted" not in s.launched:
            if obs["control"].state == LegState.SUCCEEDED:
                self._launch("preempted")
            return s.phase

        pre = obs.get("preempted")
        if s.phase == Phase.LEGS_RUNNING:
            beacon = self.backend.read_beacon("preempted")
            if beacon is not None:
                s.beacon = beacon
                s.armed_at = now
                self._enter(Phase.ARMED)
            elif pre is not None and pre.state == LegState.SUCCEEDED:
                self.fail(Reason.INVALID, "the preempted leg finished without reaching its cut")
                return s.phase
        if s.phase == Phase.ARMED:
            assert s.beacon is not None and s.armed_at is not None
            if self.kill_enabled:
                p = self.spec.preemption
                self.backend.deliver_kill(s.beacon, p.mode, p.grace_seconds)
                s.killed_at = self.clock()
                self._enter(Phase.PREEMPTED, message=f"killed pid {s.beacon.pid} ({p.mode})")
        if s.phase == Phase.PREEMPTED:
            assert s.killed_at is not None
            if pre is not None and pre.resumed_at is not None:
                s.resumed_at = pre.resumed_at
                self._enter(Phase.RESUMED)
            elif now - s.killed_at > t.restart_seconds:
                self.fail(Reason.TIMEOUT, "the preempted leg did not resume within "
                          f"timeouts.restart_seconds={t.restart_seconds:g}")
                return s.phase
        if s.phase == Phase.RESUMED and all(
            o.state == LegState.SUCCEEDED for o in obs.values()
        ) and len(obs) == 2:
            self._enter(Phase.COMPARING)
        if s.phase == Phase.COMPARING:
            self._compare()
        return s.phase

    def _launch(self, leg: LegName) -> None:
        self.backend.launch_leg(leg)
        self.status.launched[leg] = self.clock()

    def _compare(self) -> None:
        verdict = self.backend.compare()
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
        """Tick until done; any exception or Ctrl-C stops everything the backend started."""
        try:
            while not self.status.done:
                self.tick()
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
