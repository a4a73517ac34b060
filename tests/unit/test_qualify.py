"""The qualification state machine against a scripted backend and a fake clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from resumequal.errors import ClusterError, StoreError
from resumequal.qualify.machine import (
    LegObservation,
    LegState,
    Phase,
    Qualification,
    QualificationStatus,
    Reason,
)
from resumequal.qualify.plan import LegPlan
from resumequal.results.verdict import Cut, Result, Verdict
from resumequal.run.beacons import Beacon, InvalidBeacon
from resumequal.spec import PreemptionSpec, QualificationSpec, parse_spec


def _verdict(result: Result) -> Verdict:
    return Verdict(result=result, reason=f"{result} for the test", resumed_from="step-00000004",
                   cut=Cut(step=6, microstep=1, rank=1, mode="hard"), first_divergence=None,
                   exact_through_step=12, checks=[])


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class ScriptedBackend:
    """Legs whose observations the test sets; records what the machine asked for."""

    clock: Clock
    legs: dict[str, LegObservation] = field(default_factory=dict)
    beacons: dict[str, Beacon] = field(default_factory=dict)
    launched: list[str] = field(default_factory=list)
    kills: list[tuple[int, str, float]] = field(default_factory=list)
    cleanups: int = 0
    result: Result = Result.PASS
    compare_pending: bool = False
    compares: int = 0
    refused: set[str] = field(default_factory=set)

    def launch_legs(self, plans: Sequence[LegPlan]) -> None:
        for plan in plans:
            self.launched.append(plan.name)
            self.legs[plan.name] = LegObservation(state=LegState.RUNNING)

    def observe_leg(self, leg: str) -> LegObservation:
        if leg in self.refused:
            raise InvalidBeacon(f"{leg}/beacons/attempt-1-rank-0.json: not a beacon: pid")
        return self.legs.get(leg, LegObservation(state=LegState.NOT_STARTED))

    def read_beacon(self, leg: str, rank: int) -> Beacon | None:
        return self.beacons.get(leg)

    @property
    def beacon(self) -> Beacon | None:
        return self.beacons.get("preempted")

    @beacon.setter
    def beacon(self, value: Beacon) -> None:
        self.beacons["preempted"] = value

    def deliver_kill(self, leg: str, beacon: Beacon, preemption: PreemptionSpec) -> None:
        self.kills.append((beacon.pid, preemption.mode, preemption.grace_seconds))

    def compare(self) -> Verdict | None:
        self.compares += 1
        return None if self.compare_pending else _verdict(self.result)

    def cleanup(self) -> None:
        self.cleanups += 1


def _beacon() -> Beacon:
    return Beacon(pid=4242, host="h", rank=1, attempt=0, step=6, microstep=1, armed_at=0.0)


NO_CONTROLS = {"controls": {"enabled": False}}


def _spec(**sections: dict[str, object]) -> QualificationSpec:
    return parse_spec({**NO_CONTROLS, **sections})


def _machine(spec: QualificationSpec | None = None, **kw: bool) -> tuple[
    Qualification, ScriptedBackend, Clock
]:
    clock = Clock()
    backend = ScriptedBackend(clock)
    q = Qualification(spec or _spec(), backend, clock=clock, **kw)
    return q, backend, clock


def _succeed(backend: ScriptedBackend, leg: str, **kw: object) -> None:
    backend.legs[leg] = LegObservation(state=LegState.SUCCEEDED, steps_done=12, **kw)  # type: ignore[arg-type]


def test_happy_path_walks_every_phase_in_order() -> None:
    q, b, clock = _machine()
    assert q.tick() == Phase.LEGS_RUNNING
    assert b.launched == ["control"]  # one after the other by default
    _succeed(b, "control")
    q.tick()
    assert b.launched == ["control", "preempted"]
    b.beacon = _beacon()
    clock.now += 5
    assert q.tick() == Phase.PREEMPTED
    assert b.kills == [(4242, "hard", 20.0)]
    b.legs["preempted"] = LegObservation(state=LegState.RUNNING, attempts=2,
                                         resumed_at=clock.now + 3)
    clock.now += 4
    assert q.tick() == Phase.RESUMED
    _succeed(b, "preempted", attempts=2, resumed_at=clock.now - 1)
    assert q.tick() == Phase.SUCCEEDED
    s = q.status
    assert [e.phase for e in s.history] == [
        "Pending", "LegsRunning", "Armed", "Preempted", "Resumed", "Comparing", "Succeeded"]
    assert s.verdict is not None and s.verdict.result == Result.PASS
    assert s.reason == Reason.COMPLETED
    assert b.cleanups == 1
    assert q.tick() == Phase.SUCCEEDED  # terminal phases stay put


def test_side_by_side_launches_both_legs_at_once() -> None:
    q, b, _ = _machine(side_by_side=True)
    q.tick()
    assert b.launched == ["control", "preempted"]


def test_graceful_mode_passes_the_grace_to_the_backend() -> None:
    spec = _spec(preemption={"mode": "graceful", "grace_seconds": 7})
    q, b, _ = _machine(spec, side_by_side=True)
    q.tick()
    b.beacon = _beacon()
    q.tick()
    assert b.kills == [(4242, "graceful", 7.0)]


def test_arm_timeout_when_the_kill_is_never_delivered() -> None:
    spec = _spec(timeouts={"arm_seconds": 10})
    q, b, clock = _machine(spec, side_by_side=True, deliver_kill=False)
    q.tick()
    b.beacon = _beacon()
    assert q.tick() == Phase.ARMED
    clock.now += 9
    assert q.tick() == Phase.ARMED
    # The worker gives up on its own too; the reason must still be the timeout.
    b.legs["preempted"] = LegObservation(state=LegState.FAILED, message="held too long")
    clock.now += 2
    assert q.tick() == Phase.FAILED
    assert q.status.reason == Reason.TIMEOUT
    assert "timeouts.armSeconds=10" in (q.status.message or "")
    assert b.kills == [] and b.cleanups == 1


def test_restart_timeout() -> None:
    spec = _spec(timeouts={"restart_seconds": 30})
    q, b, clock = _machine(spec, side_by_side=True)
    q.tick()
    b.beacon = _beacon()
    q.tick()
    clock.now += 31
    assert q.tick() == Phase.FAILED
    assert q.status.reason == Reason.TIMEOUT
    assert "restartSeconds=30" in (q.status.message or "")


def test_leg_timeout() -> None:
    spec = _spec(timeouts={"leg_seconds": 100})
    q, _b, clock = _machine(spec)
    q.tick()
    clock.now += 101
    assert q.tick() == Phase.FAILED
    assert "control leg did not finish" in (q.status.message or "")


def test_a_failed_leg_fails_the_run_with_its_message() -> None:
    q, b, _ = _machine()
    q.tick()
    b.legs["control"] = LegObservation(state=LegState.FAILED, message="torchrun exited 1")
    assert q.tick() == Phase.FAILED
    assert q.status.reason == Reason.LEG_FAILED
    assert "control leg failed: torchrun exited 1" in (q.status.message or "")


def test_preempted_leg_finishing_without_its_cut_is_invalid() -> None:
    q, b, _ = _machine(side_by_side=True)
    q.tick()
    _succeed(b, "preempted")
    assert q.tick() == Phase.FAILED
    assert q.status.reason == Reason.INVALID


def test_invalid_verdict_fails_the_run() -> None:
    q, b, _ = _machine(side_by_side=True)
    b.result = Result.INVALID
    q.tick()
    b.beacon = _beacon()
    q.tick()
    b.legs["preempted"] = LegObservation(state=LegState.RUNNING, resumed_at=1.0)
    q.tick()
    _succeed(b, "control")
    _succeed(b, "preempted", resumed_at=1.0)
    assert q.tick() == Phase.FAILED
    assert q.status.reason == Reason.INVALID


def _to_comparing(q: Qualification, b: ScriptedBackend, clock: Clock) -> None:
    q.tick()
    b.beacon = _beacon()
    q.tick()
    b.legs["preempted"] = LegObservation(state=LegState.RUNNING, resumed_at=clock.now)
    q.tick()
    _succeed(b, "control")
    _succeed(b, "preempted", resumed_at=clock.now)


def test_a_pending_comparison_keeps_the_machine_comparing_until_its_verdict() -> None:
    q, b, clock = _machine(side_by_side=True)
    b.compare_pending = True
    _to_comparing(q, b, clock)
    assert q.tick() == Phase.COMPARING
    clock.now += 30
    assert q.tick() == Phase.COMPARING
    assert q.status.verdict is None and b.cleanups == 0
    # A restarted controller continues the wait from the stored status.
    stored = QualificationStatus.model_validate_json(q.status.model_dump_json())
    q = Qualification(_spec(), b, status=stored, clock=clock, side_by_side=True)
    b.compare_pending = False
    assert q.tick() == Phase.SUCCEEDED
    assert q.status.verdict is not None and q.status.verdict.result == Result.PASS
    assert [e.phase for e in q.status.history].count("Comparing") == 1
    assert b.cleanups == 1


def test_a_comparison_that_never_finishes_times_out() -> None:
    spec = _spec(timeouts={"leg_seconds": 100})
    q, b, clock = _machine(spec, side_by_side=True)
    b.compare_pending = True
    _to_comparing(q, b, clock)
    assert q.tick() == Phase.COMPARING
    clock.now += 99
    assert q.tick() == Phase.COMPARING
    clock.now += 2
    assert q.tick() == Phase.FAILED
    assert q.status.reason == Reason.TIMEOUT
    assert "comparison did not finish within timeouts.legSeconds=100" in (q.status.message or "")
    assert b.cleanups == 1


def test_status_survives_a_round_trip_and_the_machine_continues() -> None:
    q, b, clock = _machine(side_by_side=True)
    q.tick()
    b.beacon = _beacon()
    q.tick()
    stored = QualificationStatus.model_validate_json(q.status.model_dump_json())
    again = Qualification(_spec(), b, status=stored, clock=clock)
    b.legs["preempted"] = LegObservation(state=LegState.RUNNING, resumed_at=clock.now)
    assert again.tick() == Phase.RESUMED
    assert len(b.kills) == 1  # the kill is not delivered twice


def test_a_run_stopped_from_outside_fails_as_the_machine_would_fail_it() -> None:
    """A controller that refuses to go on with a run (an allowlist narrowed under it) stops
    its stored machine; the machine then continues from Failed, and a finished run keeps
    its ending."""
    q, b, clock = _machine(side_by_side=True)
    q.tick()
    stored = QualificationStatus.model_validate_json(q.status.model_dump_json())
    long = "image x:1 is not allowed; aws_secret_access_key=SECRET " + "why " * 1000
    stored.stop(Reason.INVALID, long, at=2000.0)
    assert (stored.phase, stored.reason, stored.done) == (Phase.FAILED, Reason.INVALID, True)
    assert stored.message is not None and len(stored.message.encode()) <= 1024
    assert "SECRET" not in stored.message  # bounded and redacted, as the machine's own
    last = stored.history[-1]
    assert (last.phase, last.at, last.reason, last.message) == (
        Phase.FAILED.value, 2000.0, Reason.INVALID, stored.message)
    assert Qualification(_spec(), b, status=stored, clock=clock).tick() == Phase.FAILED
    assert b.cleanups == 0  # the caller stops what the run started: no backend here

    stored.stop(Reason.ERROR, "later", at=3000.0)
    assert (stored.reason, len(stored.history)) == (Reason.INVALID, len(q.status.history) + 1)


def test_interrupt_cleans_up_and_reraises() -> None:
    q, b, _ = _machine()

    def boom(_status: QualificationStatus) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        q.run(poll_seconds=0, on_tick=boom)
    assert q.status.phase == Phase.FAILED and q.status.reason == Reason.INTERRUPTED
    assert b.cleanups == 1


def test_negative_controls_run_after_the_main_leg_through_the_same_steps() -> None:
    q, b, clock = _machine(parse_spec({}))
    names = [p.name for p in q.plan.legs]
    assert names == ["control", "preempted", "nc-rng", "nc-data-cursor", "nc-scheduler",
                     "nc-optimizer", "nc-model-optimizer-only", "nc-pending-grads"]
    q.tick()
    for name in names:
        assert b.launched[-1] == name  # one leg at a time, in plan order
        if name != "control":
            b.beacons[name] = _beacon()
            q.tick()
            b.legs[name] = LegObservation(state=LegState.RUNNING, resumed_at=clock.now)
            q.tick()
        _succeed(b, name, resumed_at=clock.now)
        clock.now += 1
        q.tick()
    assert q.status.phase == Phase.SUCCEEDED
    # The pending-gradients control needs an emergency checkpoint: it is killed gracefully.
    assert [mode for _pid, mode, _grace in b.kills] == ["hard"] * 6 + ["graceful"]
    phases = [e.phase for e in q.status.history]
    assert phases.count("Armed") == 1 and phases.count("Preempted") == 1


def test_a_seed_matrix_with_a_failing_cell_fails_the_qualification() -> None:
    from resumequal.results.matrix import fold_matrix
    from resumequal.results.verdict import Matrix, MatrixCell, MatrixRow

    cells = [MatrixCell(scenario="mid-hard", seed=s, result=Result.PASS, reason="exact")
             for s in (1, 2)]
    cells.append(MatrixCell(scenario="mid-hard", seed=3, result=Result.FAIL,
                            first_divergent_step=7, first_divergent_boundary="lr",
                            reason="first divergence at step 7"))
    matrix = Matrix(seeds=[1, 2, 3], scenarios=["mid-hard"], cells=cells,
                    summary=[MatrixRow(scenario="mid-hard", exact=2, total=3)])
    folded = fold_matrix(_verdict(Result.PASS), matrix)
    assert folded.result == Result.FAIL
    assert "1 of 3 scenario runs not exact (mid-hard/seed 3)" in folded.reason
    assert "step 7, lr" in folded.reason
    clean = Matrix(seeds=[1, 2], scenarios=["mid-hard"], cells=cells[:2],
                   summary=[MatrixRow(scenario="mid-hard", exact=2, total=2)])
    assert fold_matrix(_verdict(Result.PASS), clean).result == Result.PASS


class _Unreachable(ScriptedBackend):
    """A backend whose API or store fails every request once ``down`` is set."""

    down: bool = False
    error: Exception = StoreError("s3://b/run/control/trace: endpoint unreachable")

    def observe_leg(self, leg: str) -> LegObservation:
        if self.down:
            raise self.error
        return super().observe_leg(leg)

    def launch_legs(self, plans: Sequence[LegPlan]) -> None:
        if self.down:
            raise self.error
        super().launch_legs(plans)


def _down_machine(**timeouts: float) -> tuple[Qualification, _Unreachable, Clock]:
    clock = Clock()
    backend = _Unreachable(clock)
    q = Qualification(_spec(timeouts=dict(timeouts)), backend, clock=clock)
    return q, backend, clock


def test_a_leg_times_out_even_while_the_store_does_not_answer() -> None:
    q, b, clock = _down_machine(leg_seconds=100, backend_error_seconds=10_000)
    q.tick()
    b.down = True
    clock.now += 50
    with pytest.raises(StoreError):
        q.tick()
    clock.now += 51
    assert q.tick() == Phase.FAILED  # judged before the store is asked
    assert q.status.reason == Reason.TIMEOUT
    assert "timeouts.legSeconds=100" in (q.status.message or "")


def test_persistent_store_errors_end_the_run_with_the_message() -> None:
    q, b, clock = _down_machine(backend_error_seconds=30)
    q.tick()
    b.down = True
    for _ in range(3):
        clock.now += 10
        with pytest.raises(StoreError):
            q.tick()
    assert q.status.errors is not None and q.status.errors.attempts == 3
    clock.now += 10
    assert q.tick() == Phase.FAILED
    assert q.status.reason == Reason.ERROR
    assert "endpoint unreachable" in (q.status.message or "")
    assert "4 attempts" in (q.status.message or "")
    assert b.cleanups == 1


def test_a_launch_that_keeps_failing_ends_the_run() -> None:
    q, b, clock = _down_machine(backend_error_seconds=60)
    b.down = True
    b.error = ClusterError("PyTorchJob quals/r-control: HTTP 404 NotFound: the server could "
                           "not find the requested resource", status=404, reason="NotFound")
    with pytest.raises(ClusterError):
        q.tick()
    clock.now += 61
    assert q.tick() == Phase.FAILED
    assert "HTTP 404" in (q.status.message or "")
    assert b.launched == []


def test_a_clean_tick_ends_an_error_streak() -> None:
    q, b, clock = _down_machine(backend_error_seconds=30)
    q.tick()
    b.down = True
    clock.now += 20
    with pytest.raises(StoreError):
        q.tick()
    b.down = False
    clock.now += 5
    q.tick()
    assert q.status.errors is None
    b.down = True
    clock.now += 20  # 45 s after the first error, but only 20 s into this streak
    with pytest.raises(StoreError):
        q.tick()
    assert q.status.phase != Phase.FAILED


def test_errors_that_are_not_the_api_or_the_store_are_not_retried_as_such() -> None:
    q, b, _ = _down_machine()
    b.down = True
    b.error = RuntimeError("a bug")
    with pytest.raises(RuntimeError):
        q.tick()
    assert q.status.errors is None


@dataclass
class _Outage:
    """An ``on_tick`` for ``run`` in which every tick takes 10 s: the store is down after
    the first tick, for ``ticks`` ticks (None: for good); once it is back, every launched
    leg finishes (the preempted one through its cut)."""

    b: _Unreachable
    clock: Clock
    ticks: int | None
    streaks: list[int] = field(default_factory=list)

    def __call__(self, status: QualificationStatus) -> None:
        self.streaks.append(0 if status.errors is None else status.errors.attempts)
        self.clock.now += 10
        self.b.down = self.ticks is None or len(self.streaks) <= self.ticks
        if not self.b.down:
            self.b.beacon = _beacon()
            for leg in self.b.legs:
                _succeed(self.b, leg, resumed_at=self.clock.now)


def test_run_rides_out_a_store_outage_shorter_than_backend_error_seconds() -> None:
    q, b, clock = _down_machine(backend_error_seconds=120)
    outage = _Outage(b, clock, ticks=3)
    status = q.run(poll_seconds=0, on_tick=outage)
    assert status.phase == Phase.SUCCEEDED, status.message
    assert outage.streaks[:5] == [0, 1, 2, 3, 0]  # three failed ticks retried, then clean
    assert b.kills and status.errors is None


def test_run_ends_when_the_store_stays_down_for_backend_error_seconds() -> None:
    q, b, clock = _down_machine(backend_error_seconds=120)
    status = q.run(poll_seconds=0, on_tick=_Outage(b, clock, ticks=None))
    assert status.phase == Phase.FAILED and status.reason == Reason.ERROR
    message = status.message or ""
    assert "endpoint unreachable" in message and "failing for 120s" in message
    assert "timeouts.backendErrorSeconds=120" in message
    assert b.cleanups == 1


def test_a_refused_beacon_met_while_observing_a_leg_ends_the_run_at_once() -> None:
    """A resize's grow beacon is read while the leg is observed: one that is not a beacon
    is written once and never gets better, so it ends the run rather than being retried."""
    q, b, _ = _machine()
    q.tick()
    b.refused.add("control")
    assert q.tick() == Phase.FAILED
    assert q.status.reason == Reason.ERROR
    assert "the control leg's beacon is refused" in (q.status.message or "")
    assert b.cleanups == 1
