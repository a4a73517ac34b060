"""The comparator on synthetic run directories: validity, the boundary walk, drift, verdicts.

Each test builds a small run directory the way workers leave one: ``run.json``, per-rank
trace segments written with the trace models, a beacon, and tiny real DCP checkpoints with
manifests. The spec trains 6 steps with a checkpoint every 2 and a hard kill at step 4
microbatch 1 on rank 1, so the resumed attempt restores ``step-00000002`` and redoes
steps 3..6.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from resumequal.compare import checkpoint_drift, compare_run, drift, expected_checkpoint
from resumequal.compare.drift import tensor_stats, values_equal
from resumequal.results.assembly import leg_summary
from resumequal.results.verdict import DriftSummary, Result, Verdict
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal
from resumequal.spec import QualificationSpec, SpecError
from resumequal.trace.records import (
    ArmRecord,
    AutotuneChoice,
    BucketRecord,
    CompiledRecord,
    InventoryRecord,
    LossScaleRecord,
    MicrostepRecord,
    RestoreRecord,
    StepRecord,
    TraceRecord,
    TraceWriter,
)
from testing.checkpoints import write_manifest

STEPS = 6
WORLD = 2
BASE_SPEC: dict[str, Any] = {
    "workload": {"name": "dropout-mlp"},
    "training": {"steps": STEPS, "accumulation_steps": 2},
    "checkpoint": {"every_steps": 2},
    "preemption": {"step": 4, "microstep": 1, "rank": 1, "mode": "hard"},
}
RESUMED_FROM = "step-00000002"

# dcp.save without a process group says so once per call.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def make_spec(**sections: dict[str, Any]) -> QualificationSpec:
    data = {k: dict(v) for k, v in BASE_SPEC.items()}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return QualificationSpec.model_validate(data)


# -------------------------------------------------------------------- synthetic runs


def _digest(tag: str, step: int, rank: int) -> str:
    return f"xxh3_128:{tag}{step:04d}{rank:02d}" + "0" * 20


def step_record(rank: int, attempt: int, step: int) -> StepRecord:
    """What both legs record when everything agrees: a pure function of (step, rank)."""
    return StepRecord(
        rank=rank,
        attempt=attempt,
        step=step,
        microsteps=[
            MicrostepRecord(index=m, sample_ids=[step * 100 + rank * 10 + m, 7],
                            loss=1.0 / step + 0.01 * m + 0.001 * rank)
            for m in range(2)
        ],
        rng={"python": _digest("py", step, rank), "torch": _digest("to", step, rank)},
        local_grads=_digest("lg", step, rank),
        bucket_layout=_digest("bl", 0, 0),
        buckets=[BucketRecord(index=0, params=["w", "b"], numel=11)],
        reduced_grads=_digest("rg", step, 0),
        clipped_grads=_digest("cg", step, 0),
        grad_norm=1.0 / step,
        lr=[0.1 / step],
        params=_digest("pa", step, 0),
        optimizer_state=_digest("op", step, 0),
        started_at=float(step),
        finished_at=float(step) + 0.5,
    )


def inventory(rank: int, attempt: int, **changes: Any) -> InventoryRecord:
    record = InventoryRecord(
        rank=rank, attempt=attempt, pid=1000 + 10 * attempt + rank, host="node-0",
        python="3.11.7", torch="2.13.0+cpu", cuda=None, cudnn=None, nccl=None, gloo=True,
        numpy="2.1.0", platform="Linux", num_threads=1, deterministic_algorithms=True,
        cudnn_deterministic=False, cudnn_benchmark=False, float32_matmul_precision="highest",
        cudnn_allow_tf32=True, env={"OMP_NUM_THREADS": "1"},
    )
    return record.model_copy(update=changes)


def final_state(delta: float = 0.0, lr: float = 0.01) -> dict[str, Any]:
    w = torch.arange(8, dtype=torch.float32) / 4
    if delta:
        w[3] += delta
    return {
        "model": {"w": w, "b": torch.zeros(3)},
        "optim": {
            "state": {"w": {"exp_avg": torch.full((8,), 0.5), "step": torch.tensor(6.0)}},
            "param_groups": [{"lr": lr, "betas": (0.9, 0.95), "params": ["w", "b"]}],
        },
        # Rank-local pending gradients: never part of the drift.
        "rank_0": {"pending_grads": {"w": torch.randn(8)}},
    }


def save_checkpoint(directory: Path, state: dict[str, Any], step: int = STEPS) -> Path:
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(directory / "dcp")), no_dist=True)
    for rank in range(WORLD):
        (directory / f"rank-{rank}.json").write_bytes(b"{}")
    # Filed as <leg>/checkpoints/<name>: the manifest names that leg, as a worker's does.
    write_manifest(directory, name=directory.name, step=step, microstep=0, world_size=WORLD,
                   attempt=0, info={"leg": directory.parent.parent.name})
    return directory


@dataclass
class SyntheticRun:
    """A run directory in the making: records per leg and rank, then ``write()``."""

    root: Path
    spec: QualificationSpec = field(default_factory=make_spec)
    control: dict[int, list[TraceRecord]] = field(default_factory=dict)
    preempted: dict[int, list[TraceRecord]] = field(default_factory=dict)
    control_final: dict[str, Any] = field(default_factory=final_state)
    preempted_final: dict[str, Any] = field(default_factory=final_state)
    beacon: bool = True

    def __post_init__(self) -> None:
        resumed = 2
        for rank in range(WORLD):
            ctrl: list[TraceRecord] = [inventory(rank, 0)]
            self.control[rank] = ctrl + [step_record(rank, 0, s) for s in range(1, STEPS + 1)]
            pre: list[TraceRecord] = [inventory(rank, 0)]
            pre += [step_record(rank, 0, s) for s in range(1, 4)]
            if rank == 1:
                pre.append(ArmRecord(rank=1, attempt=0, step=4, microstep=1, pid=1001,
                                     armed_at=10.0))
            pre += [
                inventory(rank, 1),
                RestoreRecord(rank=rank, attempt=1, checkpoint=RESUMED_FROM, step=resumed,
                              microstep=0, global_microstep=4, omitted=[], restored_at=11.0,
                              params=_digest("pa", resumed, 0),
                              optimizer_state=_digest("op", resumed, 0)),
            ]
            pre += [step_record(rank, 1, s) for s in range(resumed + 1, STEPS + 1)]
            self.preempted[rank] = pre

    def steps(self, leg: str, rank: int, attempt: int | None = None) -> list[StepRecord]:
        records = self.control if leg == "control" else self.preempted
        return [r for r in records[rank] if isinstance(r, StepRecord)
                and (attempt is None or r.attempt == attempt)]

    def change_step(self, leg: str, rank: int, step: int, attempt: int | None = None,
                    **changes: Any) -> None:
        """Replace the record(s) of one step (of one attempt) with changed fields."""
        records = self.control if leg == "control" else self.preempted
        hit = False
        for i, r in enumerate(records[rank]):
            if (isinstance(r, StepRecord) and r.step == step
                    and (attempt is None or r.attempt == attempt)):
                records[rank][i] = r.model_copy(update=changes)
                hit = True
        assert hit, (leg, rank, step, attempt)

    def drop(self, leg: str, rank: int, match: Callable[[TraceRecord], bool]) -> None:
        records = self.control if leg == "control" else self.preempted
        records[rank] = [r for r in records[rank] if not match(r)]

    def write(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        at(self.root).claim(self.spec)
        for leg, ranks in (("control", self.control), ("preempted", self.preempted)):
            for rank, records in ranks.items():
                # Each attempt's records in that attempt's segments, as workers write them.
                for attempt in sorted({r.attempt for r in records}):
                    with TraceWriter(at(self.root).trace_sink(leg, rank, attempt)) as w:
                        for record in records:
                            if record.attempt == attempt:
                                w.write(record)
        if self.beacon:
            key = at(self.root).leg("preempted").beacon_key(1, 0)
            at(self.root).store.put_bytes(key, RunSeal.from_env().seal_json(key, {"pid": 1001}))
        name = f"step-{STEPS:08d}"
        save_checkpoint(self.root / "control" / "checkpoints" / name, self.control_final)
        save_checkpoint(self.root / "preempted" / "checkpoints" / name, self.preempted_final)
        return self.root

    def written(self) -> RunLocation:
        """:meth:`write`, and the run location it wrote."""
        return at(self.write())


def at(root: Path) -> RunLocation:
    """The run location of a run folder, sealed as the test's legs are (see conftest)."""
    return RunLocation.open(str(root), seal=RunSeal.from_env())


@pytest.fixture
def run(tmp_path: Path) -> SyntheticRun:
    return SyntheticRun(tmp_path / "run")


def failed_check(verdict: Verdict) -> str:
    """The first failed check: the one the verdict's reason comes from."""
    return next(c.name for c in verdict.checks if not c.ok)


# -------------------------------------------------------------------- PASS


def test_identical_legs_pass_exactly(run: SyntheticRun) -> None:
    v = compare_run(run.written())
    assert v.result == Result.PASS, v.reason
    assert v.reason == ("exact: every boundary of 6 steps on 2 ranks equal; final model and "
                        "optimizer bitwise equal")
    assert v.exact_through_step == STEPS
    assert v.first_divergence is None
    assert v.resumed_from == RESUMED_FROM
    assert (v.steps_compared, v.ranks_compared) == (STEPS, WORLD)
    assert all(c.ok for c in v.checks) and len(v.checks) == 8
    assert [row.step for row in v.boundary_table] == list(range(1, STEPS + 1))
    assert [row.attempt for row in v.boundary_table] == [0, 0, 1, 1, 1, 1]
    assert all(set(row.status.values()) == {"equal"} for row in v.boundary_table)
    assert [d.group for d in v.drift] == ["model", "optimizer"]
    model, optim = v.drift
    assert (model.tensors, model.numel, model.max_abs_diff, model.mismatch_fraction) == (
        2, 11, 0.0, 0.0)
    assert (optim.tensors, optim.values, optim.values_differ) == (2, 3, [])
    assert [d.abs_diff for d in v.loss_deltas] == [0.0] * STEPS
    assert v.loss_deltas[0].control_loss == pytest.approx(1.0 + 0.005 + 0.0005)
    # The verdict survives its own JSON.
    assert Verdict.model_validate_json(v.model_dump_json()) == v


def test_explicit_spec_is_used_instead_of_run_json(run: SyntheticRun) -> None:
    root = run.write()
    (root / "run.json").unlink()
    with pytest.raises(SpecError, match="not a run directory"):
        compare_run(at(root))
    assert compare_run(at(root), run.spec).result == Result.PASS


# -------------------------------------------------------------------- FAIL


def test_first_divergence_is_the_earliest_step_boundary_rank(run: SyntheticRun) -> None:
    # At step 5: params differ on rank 0, lr on rank 1; lr comes first in execution order.
    run.change_step("preempted", 0, 5, params="xxh3_128:" + "f" * 32)
    run.change_step("preempted", 1, 5, lr=[0.5])
    run.change_step("preempted", 0, 6, microsteps=[])  # later differences do not matter
    v = compare_run(run.written())
    assert v.result == Result.FAIL
    d = v.first_divergence
    assert d is not None
    assert (d.step, d.boundary, d.rank, d.before_cut) == (5, "lr", 1, False)
    assert (d.control, d.preempted) == ("[0.02]", "[0.5]")
    assert v.reason == ("first divergence at step 5, boundary lr, rank 1, after the resume "
                        "from step-00000002")
    assert v.exact_through_step == 4
    row5 = v.boundary_table[4].status
    assert (row5["grad_norm"], row5["lr"], row5["params"]) == ("equal", "differs", "differs")


def _compiled(rank: int, attempt: int, step: int, choice: str) -> CompiledRecord:
    return CompiledRecord(
        rank=rank, attempt=attempt, step=step, graphs=2, seconds=12.5, fx_cache_hits=0,
        fx_cache_misses=2, autograd_cache_hits=0, autograd_cache_misses=1,
        autotuned=[AutotuneChoice(op="mm", inputs=["[32, 64]", "[64, 256]"], choice=choice),
                   AutotuneChoice(op="addmm", inputs=["[256]", "[32, 64]", "[64, 256]"],
                                  choice="cpp_gemm_1")])


def _insert_after_first_step(records: list[TraceRecord], attempt: int,
                             record: TraceRecord) -> None:
    at_ = next(i for i, r in enumerate(records)
               if isinstance(r, StepRecord) and r.attempt == attempt)
    records.insert(at_ + 1, record)


def test_a_fail_names_the_kernels_a_fresh_process_autotuned_differently(
    run: SyntheticRun,
) -> None:
    for rank in range(WORLD):
        _insert_after_first_step(run.control[rank], 0, _compiled(rank, 0, 1, "cpp_gemm_0"))
        _insert_after_first_step(run.preempted[rank], 0, _compiled(rank, 0, 1, "cpp_gemm_0"))
        # The resumed process compiled cold and benchmarked ATen faster on rank 1.
        choice = "extern_mm" if rank == 1 else "cpp_gemm_0"
        _insert_after_first_step(run.preempted[rank], 1, _compiled(rank, 1, 3, choice))
    run.change_step("preempted", 1, 3, attempt=1, local_grads="xxh3_128:" + "e" * 32)
    v = compare_run(run.written())
    assert v.result == Result.FAIL
    assert v.reason == (
        "first divergence at step 3, boundary local_grads, rank 1, after the resume from "
        "step-00000002; inductor's autotuner chose different kernels in a fresh process: "
        "mm [32, 64] x [64, 256] on rank 1: cpp_gemm_0 in the control leg, extern_mm in "
        "attempt 1")


def test_equal_autotune_choices_add_nothing_and_the_legs_compile_times_are_reported(
    run: SyntheticRun,
) -> None:
    for rank in range(WORLD):
        _insert_after_first_step(run.control[rank], 0, _compiled(rank, 0, 1, "cpp_gemm_0"))
        warm = _compiled(rank, 1, 3, "cpp_gemm_0").model_copy(update={
            "seconds": 1.0 + rank, "fx_cache_hits": 2, "fx_cache_misses": 0, "autotuned": []})
        _insert_after_first_step(run.preempted[rank], 1, warm)
    run.change_step("preempted", 0, 5, params="xxh3_128:" + "f" * 32)
    location = run.written()
    v = compare_run(location)
    assert v.reason == ("first divergence at step 5, boundary params, rank 0, after the "
                        "resume from step-00000002")
    control, preempted = (leg_summary(location, leg, run.spec)
                          for leg in ("control", "preempted"))
    assert [c.model_dump() for c in control.compiled] == [
        {"attempt": 0, "seconds": 12.5, "fx_cache_hits": 0, "fx_cache_misses": 4,
         "autotuned": 4}]
    # The slowest rank's seconds; the attempt that compiled nothing has no entry.
    assert [c.model_dump() for c in preempted.compiled] == [
        {"attempt": 1, "seconds": 2.0, "fx_cache_hits": 4, "fx_cache_misses": 0,
         "autotuned": 0}]


def test_redone_step_that_differs_from_its_first_run_blames_the_resume(
    run: SyntheticRun,
) -> None:
    # Step 3 ran before the kill (equal to the control) and again after the resume.
    run.change_step("preempted", 1, 3, attempt=1,
                    rng={"python": _digest("py", 3, 1), "torch": "xxh3_128:" + "a" * 32})
    v = compare_run(run.written())
    assert v.result == Result.FAIL
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary, d.rank) == (3, "rng", 1)
    # Only the differing stream is shown, its digest shortened.
    assert d.control == "torch=xxh3_128:to0003010000…"
    assert d.preempted == "torch=xxh3_128:aaaaaaaaaaaa…"
    assert v.exact_through_step == 2


def test_digest_summaries_are_short(run: SyntheticRun) -> None:
    run.change_step("preempted", 0, 4, reduced_grads="sha256:" + "9" * 64)
    v = compare_run(run.written())
    d = v.first_divergence
    assert d is not None and d.boundary == "reduced_grads"
    assert d.preempted == "sha256:999999999999…"


def test_equal_boundaries_but_different_final_checkpoints_fail(run: SyntheticRun) -> None:
    run.preempted_final = final_state(delta=1e-3)
    v = compare_run(run.written())
    assert v.result == Result.FAIL
    assert "final checkpoints differ" in v.reason and "model max abs diff 0.001" in v.reason
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary) == (STEPS, "params")
    assert v.exact_through_step == STEPS


# -------------------------------------------------------------------- NONDETERMINISTIC


def test_difference_before_the_kill_is_nondeterminism(run: SyntheticRun) -> None:
    # The pre-kill run of step 3 differs; the redone step 3 (what the leg kept) does not.
    run.change_step("preempted", 1, 3, attempt=0,
                    microsteps=[MicrostepRecord(index=0, sample_ids=[310, 7], loss=9.0),
                                MicrostepRecord(index=1, sample_ids=[311, 7], loss=9.0)])
    run.change_step("preempted", 0, 5, lr=[0.5])  # a later difference is not blamed
    v = compare_run(run.written())
    assert v.result == Result.NONDETERMINISTIC
    d = v.first_divergence
    assert d is not None
    assert (d.step, d.boundary, d.rank, d.before_cut) == (3, "loss", 1, True)
    assert d.control.startswith("microbatch 0: 0.334") and d.preempted == "microbatch 0: 9.0"
    assert v.reason == ("not run-to-run deterministic: legs already differ at step 3 "
                        "(loss, rank 1) before the kill")
    assert v.exact_through_step == 2


def test_difference_in_a_step_kept_from_before_the_kill(run: SyntheticRun) -> None:
    # Step 1 is never redone, yet the legs disagree there; the restored state (step 2)
    # equals what the preempted leg saved, so the experiment itself is valid.
    for rank in range(WORLD):
        run.change_step("preempted", rank, 1, grad_norm=2.0)
    for step in (1, 2):
        run.change_step("preempted", 0, step, params=_digest("xx", step, 0))
        run.change_step("preempted", 1, step, params=_digest("xx", step, 0))
    for r in run.preempted.values():
        for i, rec in enumerate(r):
            if isinstance(rec, RestoreRecord):
                r[i] = rec.model_copy(update={"params": _digest("xx", 2, 0)})
    v = compare_run(run.written())
    assert v.result == Result.NONDETERMINISTIC, v.reason
    assert next(c for c in v.checks if c.name == "restored_checkpoint").ok
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary, d.rank) == (1, "grad_norm", 0)


# -------------------------------------------------------------------- INVALID


def _no_arm(run: SyntheticRun) -> None:
    run.drop("preempted", 1, lambda r: isinstance(r, ArmRecord))


def _armed_elsewhere(run: SyntheticRun) -> None:
    run.drop("preempted", 1, lambda r: isinstance(r, ArmRecord))
    run.preempted[1].insert(3, ArmRecord(rank=1, attempt=0, step=3, microstep=0, pid=1,
                                         armed_at=1.0))


def _no_beacon(run: SyntheticRun) -> None:
    run.beacon = False


def _no_restart(run: SyntheticRun) -> None:
    for rank in range(WORLD):
        run.preempted[rank] = [r for r in run.preempted[rank] if r.attempt == 0] + [
            step_record(rank, 0, s) for s in range(4, STEPS + 1)
        ]


def _restore(synthetic: SyntheticRun, rank: int, **changes: Any) -> None:
    records = synthetic.preempted[rank]
    for i, r in enumerate(records):
        if isinstance(r, RestoreRecord):
            records[i] = r.model_copy(update=changes)


def _wrong_checkpoint(run: SyntheticRun) -> None:
    for rank in range(WORLD):
        _restore(run, rank, checkpoint="step-00000004", step=4)


def _fresh_start(run: SyntheticRun) -> None:
    run.drop("preempted", 0, lambda r: isinstance(r, RestoreRecord))


def _another_steps_state(run: SyntheticRun) -> None:
    # The expected name, another step's state: a checkpoint planted under that name.
    _restore(run, 1, step=1)


def _another_run(run: SyntheticRun) -> None:
    _restore(run, 0, run="run-elsewhere")


def _another_leg(run: SyntheticRun) -> None:
    _restore(run, 0, leg="control")


def _two_manifests(run: SyntheticRun) -> None:
    _restore(run, 0, manifest="a" * 64)
    _restore(run, 1, manifest="b" * 64)


def _inventory(run: SyntheticRun) -> None:
    records = run.preempted[1]
    for i, r in enumerate(records):
        if isinstance(r, InventoryRecord) and r.attempt == 1:
            records[i] = inventory(1, 1, num_threads=4, env={"OMP_NUM_THREADS": "4"})


def _missing_rank_trace(run: SyntheticRun) -> None:
    del run.preempted[1]


def _control_restarted(run: SyntheticRun) -> None:
    # A control worker that died after step 3 and was started again by its launcher.
    for records in run.control.values():
        for i, r in enumerate(records):
            if getattr(r, "step", 0) > 3:
                records[i] = r.model_copy(update={"attempt": 1})


def _missing_step(run: SyntheticRun) -> None:
    run.drop("control", 0, lambda r: isinstance(r, StepRecord) and r.step == 5)


INVALID_CASES = {
    "no arm record": (_no_arm, "armed", "the preempted leg was never armed"),
    "armed at another cut": (_armed_elsewhere, "armed",
                             "armed at step 3 microstep 0, expected step 4 microstep 1"),
    "no beacon": (_no_beacon, "armed", "left no beacon"),
    "control restarted": (_control_restarted, "control_uninterrupted",
                          "the control leg restarted (attempts [0, 1]), so it is not an "
                          "uninterrupted run"),
    "no attempt 1": (_no_restart, "restarted", "the preempted leg never restarted"),
    "wrong checkpoint": (_wrong_checkpoint, "restored_checkpoint",
                         "the resumed attempt restored step-00000004 (rank 0), expected "
                         "step-00000002"),
    "another step's state": (_another_steps_state, "restored_checkpoint",
                             "rank 1 restored a checkpoint named step-00000002 that holds the "
                             "state of step 1 microbatch 0"),
    "another run's": (_another_run, "restored_checkpoint",
                      "rank 0 restored a step-00000002 of run run-elsewhere"),
    "another leg's": (_another_leg, "restored_checkpoint",
                      "rank 0 restored the control leg's step-00000002, not the preempted"),
    "ranks restored different manifests": (
        _two_manifests, "restored_checkpoint", "the ranks of attempt 1 restored different "
        "checkpoints named step-00000002 (manifests aaaaaaaaaaaa… on rank 0, bbbbbbbbbbbb… on "
        "rank 1)"),
    "started from scratch": (_fresh_start, "restored_checkpoint",
                             "rank 0 of the resumed attempt 1 restored no checkpoint"),
    "inventory": (_inventory, "inventory", "preempted rank 1 attempt 1: env.OMP_NUM_THREADS "
                                           "('1' vs '4'), num_threads (1 vs 4)"),
    "missing rank trace": (_missing_rank_trace, "traces",
                           "the preempted leg has no trace of rank 1"),
    "missing step": (_missing_step, "steps", "the control leg has no record of step(s) 5 on "
                                             "rank 0"),
}


@pytest.mark.parametrize("case", sorted(INVALID_CASES))
def test_invalid_experiments(case: str, run: SyntheticRun) -> None:
    mutate, check, words = INVALID_CASES[case]
    mutate(run)
    v = compare_run(run.written())
    assert v.result == Result.INVALID
    assert failed_check(v) == check
    assert v.reason.startswith("invalid: ")
    assert words in v.reason
    assert v.first_divergence is None and v.drift == []


def test_wrong_checkpoint_reason_reads_as_one_sentence(run: SyntheticRun) -> None:
    _wrong_checkpoint(run)
    assert compare_run(run.written()).reason == (
        "invalid: the resumed attempt restored step-00000004 (rank 0), expected step-00000002"
    )


def test_tampered_final_checkpoint_is_invalid(run: SyntheticRun) -> None:
    root = run.write()
    shard = next((root / "preempted" / "checkpoints" / "step-00000006" / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    v = compare_run(at(root))
    assert v.result == Result.INVALID
    assert failed_check(v) == "final_checkpoints"
    assert "preempted leg's final checkpoint fails verification" in v.reason
    assert "fails its BLAKE3 check at chunk 0" in v.reason


def test_missing_final_checkpoint_is_invalid(run: SyntheticRun) -> None:
    root = run.write()
    (root / "control" / "checkpoints" / "step-00000006").rename(root / "elsewhere")
    v = compare_run(at(root))
    assert v.result == Result.INVALID
    assert v.reason == "invalid: the control leg has no final checkpoint step-00000006"


# -------------------------------------------------------------------- expected checkpoint


@pytest.mark.parametrize(
    ("preemption", "checkpoint", "expected"),
    [
        ({"mode": "hard", "step": 6, "microstep": 1}, {}, "step-00000004"),
        ({"mode": "hard", "step": 5, "microstep": 0}, {}, "step-00000004"),
        ({"mode": "hard", "step": 4, "microstep": 0}, {"at_steps": [3]}, "step-00000003"),
        ({"mode": "hard", "step": 8, "microstep": 0, "at": "checkpoint_commit"}, {},
         "step-00000004"),
        ({"mode": "graceful", "step": 6, "microstep": 1}, {}, "step-00000005+1"),
        ({"mode": "graceful", "step": 6, "microstep": 0}, {}, "step-00000005"),
        ({"mode": "graceful", "step": 8, "microstep": 0, "at": "checkpoint_commit"}, {},
         "step-00000008"),
    ],
)
def test_expected_checkpoint(
    preemption: dict[str, Any], checkpoint: dict[str, Any], expected: str
) -> None:
    spec = QualificationSpec.model_validate({
        "training": {"steps": 12, "accumulation_steps": 3},
        "checkpoint": {"every_steps": 4, **checkpoint},
        "preemption": preemption,
    })
    assert expected_checkpoint(spec) == expected


# -------------------------------------------------------------------- tolerance mode


def _tolerance_spec(**tolerances: float) -> QualificationSpec:
    return make_spec(comparison={"mode": "tolerance", "tolerances": tolerances})


def _drift_after_resume(run: SyntheticRun, loss_delta: float, final_delta: float) -> None:
    """After the resume: losses move by ``loss_delta``, params digests change, and the
    final model moves by ``final_delta`` in one element."""
    for rank in range(WORLD):
        for rec in run.steps("preempted", rank, attempt=1):
            run.change_step(
                "preempted", rank, rec.step, attempt=1,
                microsteps=[m.model_copy(update={"loss": m.loss + loss_delta})
                            for m in rec.microsteps],
                params=_digest("px", rec.step, 0),
            )
    run.preempted_final = final_state(delta=final_delta)


def test_tolerance_mode_within_tolerance_passes(run: SyntheticRun) -> None:
    run.spec = _tolerance_spec(loss=1e-3, params=1e-2)
    _drift_after_resume(run, loss_delta=1e-4, final_delta=1e-3)
    v = compare_run(run.written())
    assert v.result == Result.PASS, v.reason
    assert v.exact_through_step == 2
    row = v.boundary_table[2].status
    assert (row["loss"], row["params"], row["inputs"]) == (
        "within_tolerance", "within_tolerance", "equal")
    assert v.reason.startswith("within tolerance: 6 steps on 2 ranks, exact through step 2; "
                               "loss, params within the declared tolerances")
    assert v.loss_deltas[3].abs_diff == pytest.approx(1e-4)


def test_tolerance_mode_numeric_boundary_beyond_tolerance_fails(run: SyntheticRun) -> None:
    run.spec = _tolerance_spec(loss=1e-3, params=1e-2)
    _drift_after_resume(run, loss_delta=1e-2, final_delta=1e-3)
    v = compare_run(run.written())
    assert v.result == Result.FAIL
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary, d.rank) == (3, "loss", 0)


def test_tolerance_mode_digest_follows_final_drift(run: SyntheticRun) -> None:
    run.spec = _tolerance_spec(loss=1e-3, params=1e-2)
    _drift_after_resume(run, loss_delta=1e-4, final_delta=0.5)
    v = compare_run(run.written())
    assert v.result == Result.FAIL
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary) == (3, "params")


def test_tolerance_mode_digest_without_a_tolerance_is_exact(run: SyntheticRun) -> None:
    run.spec = _tolerance_spec(loss=1e-3)
    _drift_after_resume(run, loss_delta=1e-4, final_delta=1e-3)
    v = compare_run(run.written())
    assert v.result == Result.FAIL
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary) == (3, "params")


def test_tolerance_mode_grads_follow_the_params_tolerance(run: SyntheticRun) -> None:
    run.spec = _tolerance_spec(params=1e-2)
    for rank in range(WORLD):
        run.change_step("preempted", rank, 4, reduced_grads="sha256:" + "1" * 64,
                        params=_digest("px", 4, 0))
    run.preempted_final = final_state(delta=1e-3)
    v = compare_run(run.written())
    assert v.result == Result.PASS, v.reason
    assert v.boundary_table[3].status["reduced_grads"] == "within_tolerance"


def test_tolerance_never_relaxes_inputs(run: SyntheticRun) -> None:
    run.spec = _tolerance_spec(inputs=100.0, loss=1.0)
    run.change_step("preempted", 0, 4, microsteps=[
        MicrostepRecord(index=0, sample_ids=[1, 2], loss=0.25),
        MicrostepRecord(index=1, sample_ids=[401, 7], loss=0.26),
    ])
    v = compare_run(run.written())
    assert v.result == Result.FAIL
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary) == (4, "inputs")
    assert (d.control, d.preempted) == ("microbatch 0: [400, 7]", "microbatch 0: [1, 2]")


# -------------------------------------------------------------------- drift


def test_drift_figures_for_a_known_difference(tmp_path: Path) -> None:
    a = save_checkpoint(tmp_path / "a", final_state())
    b = save_checkpoint(tmp_path / "b", final_state(delta=1e-3, lr=0.02))
    model, optim = checkpoint_drift(a, b)
    (w,) = model.worst
    assert w.name == "model.w" and w.numel == 8
    assert w.max_abs_diff == pytest.approx(1e-3, rel=1e-4)
    assert w.mismatch_fraction == 1 / 8
    norm = float(torch.linalg.vector_norm(final_state()["model"]["w"]))
    assert w.rel_l2 == pytest.approx(1e-3 / norm, rel=1e-3)
    assert (model.tensors, model.numel) == (2, 11)
    assert model.mismatch_fraction == 1 / 11
    assert model.max_abs_diff == w.max_abs_diff and model.rel_l2 == pytest.approx(w.rel_l2)
    # The optimizer tensors are equal; its learning rate (a non-tensor item) is not.
    assert (optim.max_abs_diff, optim.mismatch_fraction, optim.worst) == (0.0, 0.0, [])
    assert optim.values_differ == ["optim.param_groups.0.lr"] and optim.values == 3
    assert not model.unmatched and not optim.unmatched


def test_drift_counts_bits_not_values() -> None:
    a = torch.tensor([0.0, 1.0, math.nan, 2.0])
    b = torch.tensor([-0.0, 1.0, math.nan, 2.0])
    stats = tensor_stats(a, b)
    assert (stats.mismatched, stats.max_abs_diff) == (1, 0.0)  # -0.0 vs 0.0: bits differ
    assert tensor_stats(a, a.clone()).mismatched == 0  # same NaN payload: equal
    nan_vs_number = tensor_stats(a, torch.tensor([0.0, 1.0, 3.0, 2.0]))
    assert nan_vs_number.mismatched == 1 and math.isnan(nan_vs_number.max_abs_diff)


def test_drift_in_chunks_equals_drift_in_one_go() -> None:
    a = torch.randn(1000, dtype=torch.float64)
    b = a.clone()
    b[::7] += torch.linspace(0, 1, len(b[::7]), dtype=torch.float64)
    one = tensor_stats(a, b, chunk=10_000)
    chunked = tensor_stats(a, b, chunk=33)
    assert chunked.mismatched == one.mismatched == len(b[::7]) - 1
    assert chunked.max_abs_diff == one.max_abs_diff == pytest.approx(1.0)
    assert chunked.rel_l2 == pytest.approx(one.rel_l2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.bool,
                                   torch.complex64])
def test_drift_handles_other_dtypes(dtype: torch.dtype) -> None:
    a = torch.ones(6, dtype=dtype)
    b = a.clone()
    b[2] = 0
    stats = tensor_stats(a, b)
    assert stats.mismatched >= 1 and stats.max_abs_diff == 1.0


def test_drift_reports_keys_of_one_checkpoint_only(tmp_path: Path) -> None:
    state = final_state()
    other = final_state()
    other["model"]["extra"] = torch.ones(2)
    other["model"]["b"] = torch.zeros(4)  # another shape
    model, _ = checkpoint_drift(save_checkpoint(tmp_path / "a", state),
                                save_checkpoint(tmp_path / "b", other))
    assert model.unmatched == ["model.b", "model.extra"]
    assert model.tensors == 1


def test_drift_streams_one_tensor_pair_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a batch of one byte, each load holds one tensor, and every earlier pair is
    gone before the next is loaded: peak memory is two tensors, not two checkpoints."""
    state = final_state()
    state["model"].update({f"layer{i}": torch.randn(64) for i in range(6)})
    a = save_checkpoint(tmp_path / "a", state)
    b = save_checkpoint(tmp_path / "b", state)
    alive: list[weakref.ref[torch.Tensor]] = []
    sizes: list[int] = []
    original = drift._Checkpoint.load

    def spy(self: Any, keys: Any) -> dict[str, Any]:
        out = original(self, keys)
        tensors = [v for v in out.values() if isinstance(v, torch.Tensor)]
        if tensors:
            # Besides the counterpart just loaded from the other checkpoint, nothing else.
            assert sum(r() is not None for r in alive) <= 1
            sizes.append(len(tensors))
            alive.extend(weakref.ref(t) for t in tensors)
        return out

    monkeypatch.setattr(drift._Checkpoint, "load", spy)
    model, optim = checkpoint_drift(a, b, batch_bytes=1)
    assert model.tensors == 8 and optim.tensors == 2
    assert sizes == [1] * 20


def test_small_tensors_are_batched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = save_checkpoint(tmp_path / "a", final_state())
    calls: list[int] = []
    original = drift._Checkpoint.load

    def spy(self: Any, keys: Any) -> dict[str, Any]:
        keys = list(keys)
        calls.append(len(keys))
        return original(self, keys)

    monkeypatch.setattr(drift._Checkpoint, "load", spy)
    checkpoint_drift(a, a)
    assert calls == [4, 4, 3, 3]  # tensors of each checkpoint, then values of each


def test_values_equal_is_bitwise() -> None:
    assert values_equal([0.1, (1, "a")], [0.1, (1, "a")])
    assert not values_equal(0.0, -0.0)
    assert values_equal(math.nan, math.nan)
    assert not values_equal((1, 2), [1, 2])
    assert not values_equal(1, 1.0)


def test_nan_and_inf_drift_survive_json() -> None:
    d = DriftSummary(group="model", tensors=1, numel=1, max_abs_diff=math.nan,
                     rel_l2=math.inf, mismatch_fraction=1.0, worst=[])
    back = DriftSummary.model_validate_json(d.model_dump_json())
    assert math.isnan(back.max_abs_diff) and back.rel_l2 == math.inf


# -------------------------------------------------------------------- verdict precedence


@pytest.mark.parametrize("controls", [
    {"enabled": False},
    {"enabled": True, "omissions": ["rng", "scheduler", "pending_grads"]},
], ids=["without-controls", "with-controls"])
def test_a_nondeterministic_stack_is_nondeterministic_with_or_without_controls(
    tmp_path: Path, controls: dict[str, Any],
) -> None:
    # A stack that is not run-to-run reproducible: the legs differ at step 1, before the
    # kill. Its controls are moot (their legs would differ anyway), and were they judged,
    # one that "did not run as planned" would turn the answer into INVALID.
    from resumequal.compare.controls import compare_qualification

    run = SyntheticRun(tmp_path / "run", spec=make_spec(controls=controls))
    run.change_step("preempted", 0, 1, attempt=0, grad_norm=2.0)
    v = compare_qualification(run.written(), run.spec)
    assert v.result == Result.NONDETERMINISTIC, v.reason
    assert v.reason.startswith("not run-to-run deterministic")
    if controls["enabled"]:
        assert {c.omission: c.status for c in v.controls} == {
            "rng": "not_judged", "scheduler": "not_judged", "pending_grads": "not_judged"}
        assert (v.controls_detected, v.controls_total, v.controls_not_judged) == (0, 0, 3)
    else:
        assert v.controls == []


# -------------------------------------------------------------------- the loss scale (fp16)


def _scaled(run: SyntheticRun, state: Callable[[int], tuple[float, int]]) -> None:
    """Give every step of both legs the scaler state ``state(step)``."""
    for leg in ("control", "preempted"):
        for rank in range(WORLD):
            for r in run.steps(leg, rank):
                scale, tracker = state(r.step)
                run.change_step(leg, rank, r.step, attempt=r.attempt,
                                loss_scale=LossScaleRecord(scale=scale, growth_tracker=tracker))


def _growing(step: int) -> tuple[float, int]:
    """A scale of 2**16 that doubles every 2 steps: growthInterval 2."""
    return 2.0 ** (16 + (step - 1) // 2), (step - 1) % 2


def test_an_equal_loss_scale_passes_and_an_absent_one_is_equal(run: SyntheticRun) -> None:
    _scaled(run, _growing)
    v = compare_run(run.written())
    assert v.result == Result.PASS, v.reason
    assert all(row.status["loss_scale"] == "equal" for row in v.boundary_table)


def test_a_dropped_scaler_diverges_at_the_loss_scale_before_the_gradients(
    run: SyntheticRun,
) -> None:
    _scaled(run, _growing)
    # Resumed after step 2 with a fresh scaler: step 3 runs at the initial scale.
    run.spec = _tolerance_spec(loss=1.0, params=1.0)
    for rank in range(WORLD):
        run.change_step("preempted", rank, 3, attempt=1,
                        loss_scale=LossScaleRecord(scale=2.0**16, growth_tracker=0))
    v = compare_run(run.written())
    assert v.result == Result.FAIL  # never relaxed by a tolerance
    d = v.first_divergence
    assert d is not None and (d.step, d.boundary, d.rank) == (3, "loss_scale", 0)
    assert (d.control, d.preempted) == ("{'scale': 131072.0, 'growth_tracker': 0}",
                                        "{'scale': 65536.0, 'growth_tracker': 0}")


def test_scaler_evidence_only_when_the_resume_found_the_initial_scaler(tmp_path: Path) -> None:
    from resumequal.compare.controls import not_applicable_evidence
    from resumequal.qualify.plan import LegPlan

    spec = make_spec(training={"precision": "fp16", "gradScaler": {"growthInterval": 5}})
    nc = LegPlan("preempted", "negative_control", spec, ("scaler",))
    # The resume picks up at step 3, after two finite steps: the growth tracker is 2, which
    # a fresh scaler would not have, though the scale has not grown yet.
    counting = SyntheticRun(tmp_path / "counting", spec=spec)
    _scaled(counting, lambda step: (2.0**16, (step - 1) % 5))
    assert not_applicable_evidence(counting.written(), nc, "scaler") is None

    # A trace whose scaler is still the initial one at step 3 (as after overflows that
    # backed off to the initial scale): a fresh scaler is the same there.
    initial = SyntheticRun(tmp_path / "initial", spec=spec)
    _scaled(initial, lambda step: (2.0**16, 0) if step <= 3 else (2.0**16, step - 3))
    evidence = not_applicable_evidence(initial.written(), nc, "scaler")
    assert evidence == ("at step 3, where the resume picked up, the reference's loss scaler "
                        "was still in its initial state (scale 65536, growth tracker 0) on "
                        "every rank: a fresh scaler is the same")
