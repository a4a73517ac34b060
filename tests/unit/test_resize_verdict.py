"""The resize verdict on synthetic run folders: exact before, handoff, data ledger, drift.

The spec trains 8 steps on 2 nodes of 1 rank, 2 microbatches per rank and step (4 global
microbatches), a checkpoint every 2 steps, and kills node 1 hard at step 4 microbatch 1.
The leg goes on at 1 rank from ``step-00000002`` (attempt 1, steps 3..6, 4 microbatches
each), and grows back to 2 ranks from ``step-00000006`` (attempt 2, steps 7..8). Records
are pure functions of (step, global microbatch) so that legs agree unless a test changes
one; the final checkpoints' drift is handed in instead of read from checkpoints.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from resumequal.checkpoint.layout import Position
from resumequal.compare import judge
from resumequal.compare.controls import mechanism
from resumequal.results.assembly import leg_summary
from resumequal.results.verdict import DriftSummary, Result, ValidityCheck, Verdict
from resumequal.run.location import RunLocation
from resumequal.spec import QualificationSpec
from resumequal.trace.records import (
    ArmRecord,
    MicrostepRecord,
    RestoreRecord,
    StepRecord,
    TraceRecord,
    TraceWriter,
)
from tests.unit.synthetic_runs import inventory

STEPS = 8
FULL, SMALL = 2, 1
ACCUMULATION = 2
GLOBAL = ACCUMULATION * FULL
RESIZED_FROM, GROWN_FROM = 2, 6
TOLERANCE = 1e-5
SPEC: dict[str, Any] = {
    "workload": {"name": "dropout-mlp"},
    "world": {"nnodes": 2, "nproc_per_node": 1},
    "training": {"steps": STEPS, "accumulation_steps": ACCUMULATION},
    "checkpoint": {"every_steps": 2},
    "preemption": {"step": 4, "microstep": 1, "rank": 1, "mode": "hard", "target": "pod",
                   "resize": {"to_nodes": 1, "grow_after_step": GROWN_FROM}},
    "comparison": {"mode": "tolerance",
                   "tolerances": {"loss": TOLERANCE, "grad_norm": TOLERANCE,
                                  "params": TOLERANCE}},
}


def _digest(tag: str, step: int, rank: int = 0) -> str:
    return f"xxh3_128:{tag}{step:04d}{rank:02d}" + "0" * 20


def samples(step: int, j: int) -> list[int]:
    return [step * 100 + 2 * j, step * 100 + 2 * j + 1]


def loss(step: int, j: int) -> float:
    return 1.0 / step + 0.01 * j


def step_record(rank: int, attempt: int, step: int, world: int,
                loss_delta: float = 0.0) -> StepRecord:
    """Rank ``rank`` of a world of ``world`` at ``step``: global microbatch m * world + rank
    at microstep m; the state after a saved step carries its handoff."""
    return StepRecord(
        rank=rank, attempt=attempt, step=step, world_size=world,
        microsteps=[MicrostepRecord(index=m, global_index=m * world + rank,
                                    sample_ids=samples(step, m * world + rank),
                                    loss=loss(step, m * world + rank) + loss_delta)
                    for m in range(GLOBAL // world)],
        rng={"torch": _digest("to", step, rank)}, local_grads=_digest("lg", step, rank),
        bucket_layout=_digest("bl", 0), reduced_grads=_digest("rg", step),
        grad_norm=1.0 / step, lr=[0.1], params=_digest("pa", step),
        optimizer_state=_digest("op", step), started_at=float(step),
        finished_at=step + 0.5, handoff=_digest("ho", step) if step % 2 == 0 else None,
    )


def restore(rank: int, attempt: int, step: int, world: int, saved_by: int) -> RestoreRecord:
    return RestoreRecord(
        rank=rank, attempt=attempt, checkpoint=Position(step).name, step=step, microstep=0,
        global_microstep=step * GLOBAL, omitted=[], restored_at=20.0 + attempt,
        params=_digest("pa", step), optimizer_state=_digest("op", step), world_size=world,
        saved_world_size=saved_by, handoff=_digest("ho", step))


def drift(model: float = 2e-7, optimizer: float = 3e-7) -> list[DriftSummary]:
    return [DriftSummary(group=g, tensors=2, numel=11, max_abs_diff=d, rel_l2=d,
                         mismatch_fraction=0.5 if d else 0.0, worst=[])
            for g, d in (("model", model), ("optimizer", optimizer))]


@dataclass
class ResizeRun:
    """A resize run folder in the making: 2 ranks, then 1 from step 3, then 2 from step 7."""

    root: Path
    control: dict[int, list[TraceRecord]] = field(default_factory=dict)
    preempted: dict[int, list[TraceRecord]] = field(default_factory=dict)
    final_drift: list[DriftSummary] = field(default_factory=drift)
    loss_delta: float = 1e-7  # what the smaller world's reduction order changes
    grow: bool = True

    def __post_init__(self) -> None:
        d = self.loss_delta
        shrunk_until = GROWN_FROM if self.grow else STEPS
        for rank in range(FULL):
            self.control[rank] = [inventory(rank, 0)] + [
                step_record(rank, 0, s, FULL) for s in range(1, STEPS + 1)]
            pre: list[TraceRecord] = [inventory(rank, 0)]
            pre += [step_record(rank, 0, s, FULL) for s in range(1, 4)]  # 3 before the kill
            if rank == 1:
                pre.append(ArmRecord(rank=1, attempt=0, step=4, microstep=1, pid=1001,
                                     armed_at=10.0))
            if rank < SMALL:
                pre += [inventory(rank, 1), restore(rank, 1, RESIZED_FROM, SMALL, FULL)]
                pre += [step_record(rank, 1, s, SMALL, d)
                        for s in range(RESIZED_FROM + 1, shrunk_until + 1)]
            if self.grow:
                pre += [inventory(rank, 2), restore(rank, 2, GROWN_FROM, FULL, SMALL)]
                pre += [step_record(rank, 2, s, FULL, d)
                        for s in range(GROWN_FROM + 1, STEPS + 1)]
            self.preempted[rank] = pre

    def change(self, rank: int, step: int, attempt: int,
               edit: Callable[[StepRecord], StepRecord]) -> None:
        records = self.preempted[rank]
        for i, r in enumerate(records):
            if isinstance(r, StepRecord) and (r.step, r.attempt) == (step, attempt):
                records[i] = edit(r)
                return
        raise AssertionError((rank, step, attempt))

    def spec(self) -> QualificationSpec:
        data = json.loads(json.dumps(SPEC))
        if not self.grow:
            del data["preemption"]["resize"]["grow_after_step"]
        return QualificationSpec.model_validate(data)

    def compare(self, monkeypatch: pytest.MonkeyPatch) -> Verdict:
        spec = self.spec()
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "run.json").write_text(json.dumps(
            {"spec_digest": spec.digest(), "spec": spec.model_dump(mode="json")}))
        location = RunLocation.open(str(self.root))
        for leg, ranks in (("control", self.control), ("preempted", self.preempted)):
            for rank, records in ranks.items():
                for attempt in sorted({r.attempt for r in records}):
                    with TraceWriter(location.trace_sink(leg, rank, attempt)) as w:
                        for record in records:
                            if record.attempt == attempt:
                                w.write(record)
        beacons = self.root / "preempted" / "beacons"
        beacons.mkdir(parents=True, exist_ok=True)
        (beacons / "attempt-0-rank-1.json").write_text(json.dumps({"pid": 1001}))

        def final(*_: object) -> tuple[ValidityCheck, list[DriftSummary]]:
            return ValidityCheck(name="final_checkpoints", ok=True, detail="verified"), \
                self.final_drift

        monkeypatch.setattr(judge, "_final_drift", final)
        return judge.compare_run(location, spec)


@pytest.fixture
def run(tmp_path: Path) -> ResizeRun:
    return ResizeRun(tmp_path / "run")


def part(v: Verdict, name: str) -> bool:
    assert v.resize is not None
    found = v.resize.part(name)  # type: ignore[arg-type]
    assert found is not None
    return found.ok


def test_a_resize_that_grows_back_passes_with_every_part_proven(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = run.compare(monkeypatch)
    assert v.result == Result.PASS, v.reason
    assert v.reason.startswith("resize: 2→1→2 ranks; exact through step 2 before the resize; "
                               "handoff exact (2 restores); ledger exact (8 steps, 64 samples "
                               "each once); drift within tolerance (loss ≤ 1e-07")
    r = v.resize
    assert r is not None
    assert (r.world_sizes, r.resize_step, r.grow_step) == ([2, 1, 2], 2, 6)
    assert all(p.ok for p in r.parts)
    assert [(s.step, s.world_size, s.attempt) for s in r.steps] == [
        (1, 2, 0), (2, 2, 0), (3, 1, 1), (4, 1, 1), (5, 1, 1), (6, 1, 1), (7, 2, 2), (8, 2, 2)]
    assert all(s.ledger_ok and s.within_tolerance for s in r.steps)
    assert [(h.attempt, h.checkpoint, h.saved_world_size, h.world_size, h.equal_to_saved,
             h.equal_to_control) for h in r.handoffs] == [
        (1, "step-00000002", 2, 1, True, True), (2, "step-00000006", 1, 2, True, None)]
    assert v.resumed_from == "step-00000002"
    assert v.exact_through_step == 2 and v.first_divergence is None
    assert [d.step for d in v.loss_deltas] == list(range(1, STEPS + 1))
    # Steps 1..2 walked on every boundary; after the resize only what a world change keeps.
    assert v.boundary_table[1].status["params"] == "equal"
    assert v.boundary_table[2].status == {**dict.fromkeys(v.boundary_table[2].status,
                                                          "not_compared"),
                                          "inputs": "equal", "loss": "within_tolerance",
                                          "grad_norm": "equal"}
    assert {c.name for c in v.checks} >= {"restored_checkpoint", "handoff_digests", "steps"}


def test_a_resize_that_finishes_on_the_smaller_world_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v = ResizeRun(tmp_path / "run", grow=False).compare(monkeypatch)
    assert v.result == Result.PASS, v.reason
    assert v.reason.startswith("resize: 2→1 ranks; exact through step 2 before the resize; "
                               "handoff exact (1 restore); ")
    assert v.resize is not None and v.resize.grow_step is None
    assert [s.world_size for s in v.resize.steps] == [2, 2, 1, 1, 1, 1, 1, 1]


def test_a_leg_that_grew_back_where_it_should_not_have_is_invalid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec has no grow, the traces do: step 7 ran on 2 ranks."""
    run = ResizeRun(tmp_path / "run")
    run.compare(monkeypatch)  # writes the run folder with a grow
    run.grow = False
    v = judge.compare_run(RunLocation.open(str(run.root)), run.spec())
    assert v.result == Result.INVALID
    assert "step 7 (attempt 2) has records of ranks [0, 1], expected one from each of 1 rank" \
        in v.reason


def test_a_duplicated_and_a_missing_sample_fail_the_ledger(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    def duplicate(r: StepRecord) -> StepRecord:
        ms = list(r.microsteps)
        ms[1] = ms[1].model_copy(update={"sample_ids": [ms[0].sample_ids[0],
                                                        ms[1].sample_ids[1]]})
        return r.model_copy(update={"microsteps": ms})

    run.change(0, 5, 1, duplicate)
    v = run.compare(monkeypatch)
    assert v.result == Result.FAIL
    assert not part(v, "data_ledger") and part(v, "handoff")
    assert "data ledger not exact: step 5: 1 sample id missing (e.g. 502)" in v.reason
    assert "1 consumed once too often (e.g. 500)" in v.reason
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary) == (5, "inputs")
    assert v.resize is not None
    assert [s.step for s in v.resize.steps if not s.ledger_ok] == [5]
    assert mechanism(v).startswith("data ledger: step 5: ")


def test_a_global_microbatch_run_twice_fails_the_ledger(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank cursor taken as if the world had not shrunk: microstep 1 runs index 2 again."""
    def as_full(r: StepRecord) -> StepRecord:
        ms = [m.model_copy(update={"sample_ids": samples(r.step, m.index * FULL % GLOBAL)})
              for m in r.microsteps]
        return r.model_copy(update={"microsteps": ms})

    run.change(0, 3, 1, as_full)
    v = run.compare(monkeypatch)
    assert v.result == Result.FAIL and not part(v, "data_ledger")
    assert "with other samples than the control's at the same index" in v.reason


def test_a_handoff_other_than_the_saved_one_fails(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.preempted[0] = [r.model_copy(update={"handoff": _digest("xx", 6)})
                        if isinstance(r, RestoreRecord) and r.attempt == 2 else r
                        for r in run.preempted[0]]
    v = run.compare(monkeypatch)
    assert v.result == Result.FAIL
    assert not part(v, "handoff") and part(v, "data_ledger") and part(v, "drift")
    assert "the ranks of attempt 2 restored different handoffs from step-00000006" in v.reason
    assert v.resize is not None and not v.resize.handoffs[1].equal_to_saved
    assert mechanism(v).startswith("handoff: ")


def test_a_grown_world_restoring_another_handoff_than_saved_fails(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    for rank in range(FULL):
        run.preempted[rank] = [r.model_copy(update={"handoff": _digest("xx", 6)})
                               if isinstance(r, RestoreRecord) and r.attempt == 2 else r
                               for r in run.preempted[rank]]
    v = run.compare(monkeypatch)
    assert v.result == Result.FAIL
    assert "attempt 2 restored a handoff from step-00000006 other than the one saved after " \
           "step 6" in v.reason
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary) == (6, "params")


def test_a_resize_handoff_other_than_the_controls_fails(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Saved and restored alike by the preempted leg, but not the control's state."""
    run.preempted[0] = [r.model_copy(update={"handoff": _digest("xx", 2)})
                        if (isinstance(r, RestoreRecord) and r.attempt == 1)
                        or (isinstance(r, StepRecord) and r.step == 2) else r
                        for r in run.preempted[0]]
    run.preempted[1] = [r.model_copy(update={"handoff": _digest("xx", 2)})
                        if isinstance(r, StepRecord) and r.step == 2 else r
                        for r in run.preempted[1]]
    v = run.compare(monkeypatch)
    # The saved step's handoff is no boundary: the walk before the resize stays exact.
    assert v.result == Result.FAIL, v.reason
    assert "other than the control's after step 2" in v.reason
    assert v.resize is not None
    assert (v.resize.handoffs[0].equal_to_saved, v.resize.handoffs[0].equal_to_control) == (
        True, False)


def test_loss_drift_over_the_tolerance_fails_at_its_step(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    def drifted(r: StepRecord) -> StepRecord:
        ms = list(r.microsteps)
        ms[3] = ms[3].model_copy(update={"loss": ms[3].loss + 1e-3})
        return r.model_copy(update={"microsteps": ms})

    run.change(0, 4, 1, drifted)
    v = run.compare(monkeypatch)
    assert v.result == Result.FAIL
    assert not part(v, "drift") and part(v, "data_ledger") and part(v, "handoff")
    assert "drift over tolerance: step 4 (1 rank): loss |Δ| 0.001 over the tolerance 1e-05" \
        in v.reason
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary, d.rank) == (4, "loss", 0)
    assert "global microbatch 3" in d.preempted
    assert v.resize is not None
    assert [s.step for s in v.resize.steps if not s.within_tolerance] == [4]
    assert mechanism(v).startswith("drift: step 4")


def test_final_parameter_drift_over_the_tolerance_fails(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.final_drift = drift(model=1e-3)
    v = run.compare(monkeypatch)
    assert v.result == Result.FAIL and not part(v, "drift")
    assert "final model max abs diff 0.001 over the tolerance 1e-05" in v.reason
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary) == (STEPS, "params")


def test_the_optimizer_is_held_to_the_params_tolerance_without_its_own(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.final_drift = drift(optimizer=2 * TOLERANCE)
    assert run.compare(monkeypatch).result == Result.FAIL


def test_a_difference_before_the_resize_is_nondeterminism(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.change(1, 3, 0, lambda r: r.model_copy(update={"grad_norm": r.grad_norm + 1e-9}))
    v = run.compare(monkeypatch)
    assert v.result == Result.NONDETERMINISTIC
    assert not part(v, "before_resize")
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary, d.rank, d.before_cut) == (
        3, "grad_norm", 1, True)
    # Within the loss tolerance, but not exact: before the resize nothing is relaxed.
    assert v.exact_through_step == 2


def test_a_missing_handoff_digest_is_invalid(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.preempted[0] = [r.model_copy(update={"handoff": None})
                        if isinstance(r, RestoreRecord) and r.attempt == 1 else r
                        for r in run.preempted[0]]
    v = run.compare(monkeypatch)
    assert v.result == Result.INVALID
    assert v.reason == ("invalid: the restore of step-00000002 by attempt 1 carries no "
                        "handoff digest (rank 0), so nothing shows the smaller world took "
                        "over the state saved")
    assert v.resize is None


def test_a_control_without_a_handoff_at_the_resize_step_is_invalid(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.control[0] = [r.model_copy(update={"handoff": None})
                      if isinstance(r, StepRecord) and r.step == RESIZED_FROM else r
                      for r in run.control[0]]
    v = run.compare(monkeypatch)
    assert v.result == Result.INVALID
    assert "the control's record of step 2 carries no handoff digest" in v.reason


def test_a_step_the_smaller_world_did_not_redo_is_not_taken_from_before_the_kill(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempt 0 ran step 3 on both ranks; attempt 1 (one rank) must have run it again."""
    run.preempted[0] = [r for r in run.preempted[0]
                        if not (isinstance(r, StepRecord) and (r.step, r.attempt) == (3, 1))]
    v = run.compare(monkeypatch)
    assert v.result == Result.INVALID
    assert v.reason == "invalid: no resumed attempt ran step 3, so nothing resumed from " \
                       "step-00000002"


def test_a_stale_rank_record_does_not_complete_a_step_of_the_grown_world(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 of attempt 2 lost step 8: rank 1's step 8 of no earlier attempt stands in."""
    run.preempted[1] = [r for r in run.preempted[1]
                        if not (isinstance(r, StepRecord) and (r.step, r.attempt) == (8, 2))]
    run.preempted[1].append(step_record(1, 0, 8, FULL))  # a stale record of attempt 0
    v = run.compare(monkeypatch)
    assert v.result == Result.INVALID
    assert "step 8 (attempt 2) has records of ranks [0], expected one from each of 2 ranks" \
        in v.reason


def test_a_leg_that_never_shrank_is_invalid(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.preempted[0] = [r.model_copy(update={"world_size": FULL})
                        if isinstance(r, RestoreRecord) and r.attempt == 1 else r
                        for r in run.preempted[0]]
    v = run.compare(monkeypatch)
    assert v.result == Result.INVALID
    assert "in a world of 2 saved by 2, expected 1 saved by 2" in v.reason


def test_microbatches_without_a_global_index_are_invalid(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    run.change(0, 8, 2, lambda r: r.model_copy(update={"microsteps": [
        m.model_copy(update={"global_index": None}) for m in r.microsteps]}))
    v = run.compare(monkeypatch)
    assert v.result == Result.INVALID
    assert "step 8 (attempt 2) has microbatches without a global index" in v.reason


def test_the_leg_summary_takes_each_step_from_the_attempt_that_ran_it_last(
    run: ResizeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 3: attempt 1's four microbatches on one rank, not attempt 0's rank 1 with them."""
    run.loss_delta = 0.0
    run.__post_init__()
    run.change(0, 3, 1, lambda r: r.model_copy(update={"microsteps": [
        m.model_copy(update={"loss": 5.0}) for m in r.microsteps]}))
    run.compare(monkeypatch)
    spec = QualificationSpec.model_validate(SPEC)
    losses = leg_summary(RunLocation.open(str(run.root)), "preempted", spec).losses
    assert len(losses) == STEPS and losses[2] == 5.0
    assert losses[6] == pytest.approx(sum(loss(7, j) for j in range(GLOBAL)) / GLOBAL)
