"""The restore judged by what was restored: FAIL naming tensors, ranks, cause and fix when
the right checkpoint does not give a rank back its own state; INVALID only when the
checkpoint restored is not the one the plan names.

The synthetic run of ``test_compare`` (6 steps, a checkpoint every 2, a hard kill at step 4,
so the resumed attempt restores ``step-00000002``), with per-tensor digests: a linear
layer's weight, equal on both ranks, and a BatchNorm's running mean, which each rank
updates from its own batches.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from resumequal.compare import compare_run
from resumequal.compare.restore import restore_divergence
from resumequal.results.verdict import Result
from resumequal.trace.records import RestoreRecord, StepRecord, TensorDigests
from tests.unit.test_compare import RESUMED_FROM, WORLD, SyntheticRun

MEAN = "features.1.running_mean"
VAR = "features.1.running_var"
WEIGHT = "features.0.weight"
CALLS = "head.calls"


def _params(step: int, rank: int) -> dict[str, str]:
    return {WEIGHT: f"w{step}", MEAN: f"m{step}r{rank}", VAR: f"v{step}r{rank}",
            CALLS: f"c{step}"}


def _optim(step: int) -> dict[str, str]:
    return {WEIGHT: f"o{step}", "param_groups": "g"}


def _with_tensors(run: SyntheticRun, restored: dict[int, dict[str, str]],
                  unsaved: tuple[str, ...] = ()) -> SyntheticRun:
    """Per-tensor digests on every step record; each rank's restore gets ``restored``."""
    for leg in (run.control, run.preempted):
        for rank, records in leg.items():
            for i, r in enumerate(records):
                if isinstance(r, StepRecord):
                    records[i] = r.model_copy(update={"tensors": TensorDigests(
                        params=_params(r.step, rank), optimizer_state=_optim(r.step))})
                elif isinstance(r, RestoreRecord):
                    records[i] = r.model_copy(update={
                        "tensors": TensorDigests(params=restored[rank],
                                                 optimizer_state=_optim(r.step)),
                        "buffers": [MEAN, VAR, CALLS], "unsaved": list(unsaved),
                        "manifest": "d" * 64, "leg": "preempted"})
    return run


@pytest.fixture
def run(tmp_path: Path) -> SyntheticRun:
    return SyntheticRun(tmp_path / "run")


def test_every_rank_given_back_its_own_state_passes(run: SyntheticRun) -> None:
    v = compare_run(_with_tensors(run, {r: _params(2, r) for r in range(WORLD)}).written())
    assert v.result == Result.PASS, v.reason


def test_one_copy_of_a_per_rank_buffer_is_a_fail_naming_tensors_ranks_cause_and_fix(
        run: SyntheticRun) -> None:
    # DCP keeps one copy of what every rank saves under one name: rank 1's, for both.
    kept = _params(2, 1)
    v = compare_run(_with_tensors(run, {0: kept, 1: kept}).written())
    assert v.result == Result.FAIL, v.reason
    assert all(c.ok for c in v.checks)
    d = v.first_divergence
    assert d is not None and d.at_restore
    assert (d.step, d.boundary, d.rank) == (2, "params", 0)
    assert d.tensors is not None and d.tensors.differing == [MEAN, VAR]
    assert [(t.name, t.kind, t.ranks, t.cause, t.kept_rank) for t in d.restored] == [
        (MEAN, "buffer", [0], "per_rank", 1), (VAR, "buffer", [0], "per_rank", 1)]
    assert d.cause == (f"buffers {MEAN}, {VAR} differed between the ranks when "
                       f"{RESUMED_FROM} was saved; the checkpoint keeps one copy (rank 1's), "
                       "which every rank got back")
    assert d.fix is not None and "SyncBatchNorm" in d.fix and "before each save" in d.fix \
        and "per rank" in d.fix
    assert v.reason.startswith(
        f"the state restored from {RESUMED_FROM} is not the state the ranks saved: params "
        f"differ on rank 0 (2 of 4 tensors differ (first in parameter order: {MEAN})): "
        f"buffers {MEAN}, {VAR} differed between the ranks")
    assert v.exact_through_step == 2


def test_a_non_persistent_buffer_is_named_as_never_saved(run: SyntheticRun) -> None:
    restored = {r: {**_params(2, r), CALLS: "c0"} for r in range(WORLD)}
    v = compare_run(_with_tensors(run, restored, unsaved=(CALLS,)).written())
    assert v.result == Result.FAIL
    d = v.first_divergence
    assert d is not None and d.at_restore and d.rank == 0
    assert [(t.name, t.ranks, t.cause) for t in d.restored] == [(CALLS, [0, 1], "not_saved")]
    assert d.cause is not None and "not in the checkpoint (non-persistent" in d.cause
    assert d.fix is not None and "persistent=True" in d.fix
    assert "differ on ranks 0, 1" in v.reason


def test_optimizer_state_restored_unlike_saved_is_a_fail_at_optimizer_state(
        run: SyntheticRun) -> None:
    _with_tensors(run, {r: _params(2, r) for r in range(WORLD)})
    for i, r in enumerate(run.preempted[1]):
        if isinstance(r, RestoreRecord):
            assert r.tensors is not None
            run.preempted[1][i] = r.model_copy(update={"tensors": r.tensors.model_copy(
                update={"optimizer_state": {WEIGHT: "zz", "param_groups": "g"}})})
    v = compare_run(run.written())
    d = v.first_divergence
    assert v.result == Result.FAIL and d is not None and d.at_restore
    assert (d.boundary, d.rank) == ("optimizer_state", 1)
    assert [(t.name, t.kind, t.cause) for t in d.restored] == [
        (WEIGHT, "optimizer_state", "not_as_saved")]


def test_a_whole_digest_without_tensors_still_fails_at_the_restore(run: SyntheticRun) -> None:
    # Traces written before per-tensor restore digests: the whole digest says it.
    for i, r in enumerate(run.preempted[1]):
        if isinstance(r, RestoreRecord):
            run.preempted[1][i] = r.model_copy(update={"optimizer_state": "xxh3_128:" + "e" * 32})
    v = compare_run(run.written())
    d = v.first_divergence
    assert v.result == Result.FAIL and d is not None and d.at_restore
    assert (d.boundary, d.rank, d.tensors, d.restored) == ("optimizer_state", 1, None, [])


def test_another_steps_checkpoint_is_invalid_even_with_its_tensors_unlike_saved(
        run: SyntheticRun) -> None:
    # Planted: step 1's state under the name step-00000002. Its tensors differ from what the
    # ranks saved at step 2, yet that is the experiment's fault, not the stack's.
    _with_tensors(run, {r: _params(1, r) for r in range(WORLD)})
    for rank in range(WORLD):
        for i, r in enumerate(run.preempted[rank]):
            if isinstance(r, RestoreRecord):
                run.preempted[rank][i] = r.model_copy(update={"step": 1})
    v = compare_run(run.written())
    assert v.result == Result.INVALID
    assert v.reason.startswith("invalid: rank 0 restored a checkpoint named step-00000002 "
                               "that holds the state of step 1")
    assert v.first_divergence is None


def test_buffers_of_a_checkpoint_taken_mid_step_are_left_to_the_walk(run: SyntheticRun) -> None:
    # An emergency checkpoint in the middle of step 3: its parameters are step 2's, its
    # buffers moved with step 3's first forward, so they are not held to step 2's record.
    moved = {r: {**_params(2, r), MEAN: "moved", VAR: "moved"} for r in range(WORLD)}
    _with_tensors(run, moved)
    for rank in range(WORLD):
        for i, r in enumerate(run.preempted[rank]):
            if isinstance(r, RestoreRecord):
                run.preempted[rank][i] = r.model_copy(update={"microstep": 1,
                                                              "checkpoint": "step-00000002+1"})
    saved = {r: rec for r, rec in enumerate(
        next(x for x in run.preempted[r] if isinstance(x, StepRecord) and x.step == 2)
        for r in range(WORLD))}
    restores = {r: next(x for x in run.preempted[r] if isinstance(x, RestoreRecord))
                for r in range(WORLD)}
    assert restore_divergence(restores, saved) is None
    restores[0] = restores[0].model_copy(update={"tensors": TensorDigests(
        params={**moved[0], WEIGHT: "other"}, optimizer_state=_optim(2))})
    d = restore_divergence(restores, saved)
    assert d is not None and d.tensors is not None and d.tensors.differing == [WEIGHT]


def test_a_checkpoint_taken_mid_step_is_held_to_what_each_rank_recorded_saving(
        run: SyntheticRun) -> None:
    # A graceful stop in step 3: each rank records what it saved, buffers moved by step 3's
    # first forward included; rank 0 got rank 1's back.
    from resumequal.trace.records import SavedRecord

    saved = {r: {**_params(2, r), MEAN: f"moved{r}", VAR: f"movedv{r}"} for r in range(WORLD)}
    _with_tensors(run, {0: saved[1], 1: saved[1]})
    name = "step-00000002+1"
    for rank in range(WORLD):
        records = run.preempted[rank]
        for i, r in enumerate(records):
            if isinstance(r, RestoreRecord):
                records[i] = r.model_copy(update={"microstep": 1, "checkpoint": name})
        at = next(i for i, r in enumerate(records) if r.attempt == 1)
        records.insert(at, SavedRecord(
            rank=rank, attempt=0, checkpoint=name, params="p", optimizer_state="o",
            tensors=TensorDigests(params=saved[rank], optimizer_state=_optim(2))))
    from resumequal.compare.files import LegTrace
    from resumequal.compare.restore import saved_records

    control = LegTrace("control", WORLD, dict(run.control))
    preempted = LegTrace("preempted", WORLD, dict(run.preempted))
    restores = {r: next(x for x in run.preempted[r] if isinstance(x, RestoreRecord))
                for r in range(WORLD)}
    d = restore_divergence(restores, saved_records(control, preempted, restores))
    assert d is not None and d.rank == 0 and d.tensors is not None
    assert d.tensors.differing == [MEAN, VAR]
    assert [(t.cause, t.kept_rank) for t in d.restored] == [("per_rank", 1), ("per_rank", 1)]
