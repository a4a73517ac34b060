"""Synthetic run locations for any spec the schema accepts: the files every leg of its plan
leaves (traces, beacon, final checkpoint) when the stack resumes exactly, and differences
planted where a test asks.

Every value a leg records is a pure function of (step, rank) — of (step, global
microbatch) where data is global, under ``preemption.resize`` — so legs agree unless a
:class:`Plant` changes one. The resume follows the spec as the workers do: attempt 0 runs
up to the cut (the armed rank publishes its beacon), attempt 1 restores the checkpoint the
kill leaves (a graceful stop's emergency one, else the newest committed before the cut's
step) and finishes, on the smaller world after a resize, and a grown world (attempt 2)
resumes from the checkpoint after ``growAfterStep``. A negative control's leg differs from
the step after its restore on, from the boundary where its descriptor says leaving its
state out first shows (:data:`resumequal.spec.omissions.CONTROLS`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed.checkpoint as dcp

from resumequal.checkpoint.layout import Position
from resumequal.qualify.plan import LegPlan, qualification_plan
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal
from resumequal.spec import QualificationSpec
from resumequal.spec.boundaries import BOUNDARIES, BY_NAME, Boundary
from resumequal.spec.omissions import control
from resumequal.trace.records import (
    ArmRecord,
    BucketRecord,
    InventoryRecord,
    LossScaleRecord,
    MicrostepRecord,
    RestoreRecord,
    SavedRecord,
    StepRecord,
    TensorDigests,
    TraceRecord,
    TraceWriter,
)
from testing.checkpoints import write_manifest

TENSORS = ("block.weight", "block.bias")
# Far over any tolerance a test draws: a planted difference that must be seen.
OVER = 10.0


def digest(tag: str, *parts: int) -> str:
    """A digest as the trace spells one, distinct for each (tag, parts)."""
    body = f"{tag}/{'/'.join(map(str, parts))}".encode()
    return "xxh3_128:" + hashlib.blake2b(body, digest_size=16).hexdigest()


# --------------------------------------------------------------------------- plants


@dataclass(frozen=True)
class Plant:
    """A difference planted in a leg's records: ``boundary`` moved by ``delta`` (numbers),
    or to another value (anything else), at ``steps`` on ``ranks`` (None: every rank) of
    the resumed attempts, or of attempt 0 alone (``before_kill``)."""

    boundary: Boundary
    steps: frozenset[int]
    ranks: frozenset[int] | None = None
    before_kill: bool = False
    delta: float = OVER

    def hits(self, record: StepRecord) -> bool:
        return (record.step in self.steps and (record.attempt == 0) == self.before_kill
                and (self.ranks is None or record.rank in self.ranks))


def moved(record: StepRecord, boundary: Boundary, delta: float) -> StepRecord:
    """``record`` with its value at ``boundary`` changed (numbers by ``delta``)."""
    info = BY_NAME[boundary]
    if boundary == "inputs":
        micro = [m.model_copy(update={"sample_ids": [i + 10**6 for i in m.sample_ids]})
                 for m in record.microsteps]
        return record.model_copy(update={"microsteps": micro})
    if boundary == "loss":
        micro = [m.model_copy(update={"loss": m.loss + delta}) for m in record.microsteps]
        return record.model_copy(update={"microsteps": micro})
    if boundary == "grad_norm":
        return record.model_copy(update={"grad_norm": record.grad_norm + delta})
    if boundary == "lr":
        return record.model_copy(update={"lr": [x + delta for x in record.lr]})
    if boundary == "rng":
        return record.model_copy(update={"rng": {k: digest("planted", record.step)
                                                 for k in record.rng}})
    if boundary == "loss_scale":
        scale = record.loss_scale
        other = LossScaleRecord(scale=3.0 * (scale.scale if scale else 1.0), growth_tracker=7)
        return record.model_copy(update={"loss_scale": other})
    if boundary == "bucket_layout":
        return record.model_copy(update={"bucket_layout": digest("planted-bl", record.step)})
    assert info.kind == "tensors", boundary
    update: dict[str, Any] = {info.field: digest("planted", record.step, record.rank)}
    if record.tensors is not None:
        tensors = dict(getattr(record.tensors, boundary))
        tensors[TENSORS[0]] = digest("planted", record.step, record.rank, 0)
        update["tensors"] = record.tensors.model_copy(update={boundary: tensors})
    return record.model_copy(update=update)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Stack:
    """What the spec's stack records at each step: a pure function of where it is."""

    spec: QualificationSpec

    @property
    def world(self) -> int:
        return self.spec.world.world_size

    @property
    def global_data(self) -> bool:
        return self.spec.preemption.resize is not None

    def lr(self, step: int) -> float:
        base = self.spec.training.optimizer.lr
        return base if self.spec.training.schedule.kind == "constant" else base / step

    def microsteps(self, step: int, rank: int, world: int) -> list[MicrostepRecord]:
        t = self.spec.training
        if not self.global_data:
            return [MicrostepRecord(index=m, sample_ids=[step * 1000 + rank * 50 + m],
                                    loss=1.0 / step + 0.01 * m + 0.001 * rank)
                    for m in range(t.accumulation_steps)]
        per_rank = self.spec.global_microbatches // world
        return [MicrostepRecord(index=m, global_index=m * world + rank,
                                sample_ids=[step * 1000 + 2 * (m * world + rank)],
                                loss=1.0 / step + 0.01 * (m * world + rank))
                for m in range(per_rank)]

    def tensor_digests(self, step: int, rank: int) -> TensorDigests:
        def of(b: str, local: bool) -> dict[str, str]:
            return {n: digest(b, step, rank if local else 0, i) for i, n in enumerate(TENSORS)}
        return TensorDigests(local_grads=of("lg", True), reduced_grads=of("rg", False),
                             clipped_grads=of("cg", False), params=of("pa", False),
                             optimizer_state=of("op", False))

    def step(self, rank: int, attempt: int, step: int, world: int) -> StepRecord:
        t = self.spec.training
        ddp = self.spec.parallelism.kind == "ddp"
        scale = None
        if t.precision == "fp16":
            # Never the initial state: a fresh scaler always differs (no evidence for it).
            scale = LossScaleRecord(scale=t.grad_scaler.init_scale * 2.0**step,
                                    growth_tracker=1)
        handoff = None
        if self.global_data and self.spec.checkpoint.saves_after(step, t.steps):
            handoff = digest("ho", step)
        return StepRecord(
            rank=rank, attempt=attempt, step=step, microsteps=self.microsteps(step, rank, world),
            rng={"python": digest("py", step, rank), "torch": digest("to", step, rank)},
            loss_scale=scale, local_grads=digest("lg", step, rank),
            bucket_layout=digest("bl", 0) if ddp else None,
            buckets=[BucketRecord(index=0, params=list(TENSORS), numel=11)] if ddp else [],
            reduced_grads=digest("rg", step), grad_norm=1.0 / step,
            clipped_grads=digest("cg", step), lr=[self.lr(step)], params=digest("pa", step),
            optimizer_state=digest("op", step), started_at=float(step),
            finished_at=step + 0.5, world_size=world, handoff=handoff,
            tensors=self.tensor_digests(step, rank))

    def state_digests(self, step: int) -> dict[str, Any]:
        """What a restore of the state after ``step`` records (step 0: the initial state)."""
        return {"params": digest("pa", step), "optimizer_state": digest("op", step)}


def inventory(rank: int, attempt: int) -> InventoryRecord:
    return InventoryRecord(
        rank=rank, attempt=attempt, pid=1000 + 10 * attempt + rank, host=f"node-{rank}",
        python="3.11.7", torch="2.13.0+cpu", cuda=None, cudnn=None, nccl=None, gloo=True,
        numpy="2.1.0", platform="Linux", num_threads=1, deterministic_algorithms=True,
        cudnn_deterministic=False, cudnn_benchmark=False, float32_matmul_precision="highest",
        cudnn_allow_tf32=True, env={})


# --------------------------------------------------------------------------- the resume


@dataclass(frozen=True)
class Resume:
    """Where a cut leg of ``spec`` stops and picks up again."""

    spec: QualificationSpec

    @property
    def completed(self) -> int:
        """Steps attempt 0 completes before the kill."""
        p = self.spec.preemption
        return p.step if p.at == "checkpoint_commit" else p.step - 1

    @property
    def restored(self) -> Position:
        """The checkpoint attempt 1 restores."""
        p, t = self.spec.preemption, self.spec.training
        if p.mode == "graceful":
            return Position(p.step, 0) if p.at == "checkpoint_commit" \
                else Position(p.step - 1, p.microstep)
        saved = self.spec.checkpoint.last_save_before(p.step, t.steps)
        assert saved is not None  # the spec refuses a hard kill before any save
        return Position(saved)

    @property
    def small(self) -> int:
        """The ranks after the kill."""
        resize, w = self.spec.preemption.resize, self.spec.world
        return w.world_size if resize is None else resize.to_nodes * w.nproc_per_node

    def worlds(self) -> list[tuple[int, Position, int, int]]:
        """(attempt, checkpoint restored, world, steps through) of every resumed attempt."""
        t, resize = self.spec.training, self.spec.preemption.resize
        grow = resize.grow_after_step if resize is not None else None
        if grow is None:
            return [(1, self.restored, self.small, t.steps)]
        return [(1, self.restored, self.small, grow),
                (2, Position(grow), self.spec.world.world_size, t.steps)]

    @property
    def first_resumed(self) -> int:
        return self.restored.step + 1


# --------------------------------------------------------------------------- legs


def reference_records(stack: Stack) -> dict[int, list[TraceRecord]]:
    """The uninterrupted leg: attempt 0 runs every step on the full world."""
    steps = stack.spec.training.steps
    return {r: [inventory(r, 0), *(stack.step(r, 0, s, stack.world)
                                   for s in range(1, steps + 1))]
            for r in range(stack.world)}


def cut_records(stack: Stack, leg: LegPlan) -> dict[int, list[TraceRecord]]:
    """A cut leg as its workers write it: up to the kill, then each resumed attempt."""
    spec = leg.spec
    p = spec.preemption
    resume = Resume(spec)
    full = stack.world
    out: dict[int, list[TraceRecord]] = {}
    for r in range(full):
        records: list[TraceRecord] = [inventory(r, 0)]
        records += [stack.step(r, 0, s, full) for s in range(1, resume.completed + 1)]
        if r == p.rank:
            records.append(ArmRecord(rank=r, attempt=0, step=p.step, microstep=p.microstep,
                                     pid=1000 + r, armed_at=100.0))
        restored = resume.restored
        if p.mode == "graceful" and restored.microstep:
            state = stack.state_digests(restored.step)
            records.append(SavedRecord(
                rank=r, attempt=0, checkpoint=restored.name, **state,
                tensors=TensorDigests(params=stack.tensor_digests(restored.step, r).params,
                                      optimizer_state=stack.tensor_digests(
                                          restored.step, r).optimizer_state)))
        out[r] = records
    for attempt, position, world, through in resume.worlds():
        saved_by = full if attempt == 1 else resume.small
        for r in range(world):
            out[r] += [inventory(r, attempt), RestoreRecord(
                rank=r, attempt=attempt, checkpoint=position.name, step=position.step,
                microstep=position.microstep, global_microstep=0, omitted=list(leg.omit),
                restored_at=200.0 + attempt, **stack.state_digests(position.step),
                world_size=world if stack.global_data else None,
                saved_world_size=saved_by if stack.global_data else None,
                handoff=digest("ho", position.step) if stack.global_data else None)]
            out[r] += [stack.step(r, attempt, s, world)
                       for s in range(position.step + 1, through + 1)]
    return out


def control_plants(stack: Stack, leg: LegPlan) -> list[Plant]:
    """How a negative control's leg differs: from where leaving its state out first shows,
    every later boundary a number or tensors feeds, from the step after its restore on."""
    (omission,) = leg.omit
    shows = effect(stack.spec, omission)
    if shows is None:
        return []
    start = BOUNDARIES.index(shows)
    moved_ = [b for b in BOUNDARIES[start:]
              if b == shows or BY_NAME[b].kind in ("numeric", "tensors")]
    steps = frozenset(range(Resume(leg.spec).first_resumed, stack.spec.training.steps + 1))
    return [Plant(b, steps) for b in moved_]


def effect(spec: QualificationSpec, omission: str) -> Boundary | None:
    """Where leaving ``omission``'s state out shows in this synthetic stack; None where the
    stack never uses it (its learning rate is constant: a dropped scheduler changes
    nothing)."""
    if omission == "scheduler" and spec.training.schedule.kind == "constant":
        return None
    return control(omission).shows_at


def planted(records: dict[int, list[TraceRecord]], plants: Iterable[Plant]
            ) -> dict[int, list[TraceRecord]]:
    """``records`` with ``plants`` applied to the step records they hit."""
    plants = list(plants)
    out: dict[int, list[TraceRecord]] = {}
    for rank, recs in records.items():
        changed: list[TraceRecord] = []
        for rec in recs:
            if isinstance(rec, StepRecord):
                for plant in plants:
                    if plant.hits(rec):
                        rec = moved(rec, plant.boundary, plant.delta)
            changed.append(rec)
        out[rank] = changed
    return out


# --------------------------------------------------------------------------- the files


def final_state(model_delta: float = 0.0, optimizer_delta: float = 0.0) -> dict[str, Any]:
    """A final checkpoint's tensors (float64: a delta is what the drift measures)."""
    w = torch.arange(8, dtype=torch.float64) / 4
    w[3] += model_delta
    avg = torch.full((8,), 0.5, dtype=torch.float64)
    avg[0] += optimizer_delta
    return {"model": {TENSORS[0]: w, TENSORS[1]: torch.zeros(3, dtype=torch.float64)},
            "optim": {"state": {TENSORS[0]: {"exp_avg": avg}},
                      "param_groups": [{"lr": 0.01, "params": list(TENSORS)}]}}


def save_final(root: Path, leg: str, spec: QualificationSpec, state: dict[str, Any],
               world: int) -> None:
    name = Position(spec.training.steps).name
    directory = root / leg / "checkpoints" / name
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(directory / "dcp")), no_dist=True)
    for rank in range(world):
        (directory / f"rank-{rank}.json").write_bytes(b"{}")
    write_manifest(directory, name=name, step=spec.training.steps, microstep=0,
                   world_size=world, attempt=0, info={"leg": leg})


@dataclass
class Case:
    """What a run's legs do beyond resuming exactly: plants in the main leg, its final
    checkpoint's drift, and a restore that does not give back what was saved."""

    plants: list[Plant] = field(default_factory=list)
    model_delta: float = 0.0
    optimizer_delta: float = 0.0
    restore_rank: int | None = None  # this rank restores other parameters than it saved


def write_run(root: Path, spec: QualificationSpec, case: Case) -> RunLocation:
    """A finished run location of ``spec``: every leg of its plan, as :class:`Case` says."""
    seal = RunSeal.from_env()
    location = RunLocation.open(str(root), seal=seal)
    location.claim(spec)
    stack = Stack(spec)
    for leg in qualification_plan(spec).legs:
        final_world = leg.final_world_size
        if leg.role == "reference":
            records = reference_records(stack)
            state = final_state()
        elif leg.role == "main":
            records = planted(cut_records(stack, leg), case.plants)
            if case.restore_rank is not None:
                records = _bad_restore(records, case.restore_rank)
            state = final_state(case.model_delta, case.optimizer_delta)
        else:
            plants = control_plants(stack, leg)
            records = planted(cut_records(stack, leg), plants)
            state = final_state(OVER, OVER) if plants else final_state()
        _write_traces(location, leg.name, records)
        if leg.cut:  # the armed rank's beacon: who to kill
            p = leg.spec.preemption
            location.leg(leg.name).write_beacon(p.rank, 0, p.step, p.microstep, p.at)
        save_final(root, leg.name, spec, state, final_world)
    return location


def _bad_restore(records: dict[int, list[TraceRecord]], rank: int
                 ) -> dict[int, list[TraceRecord]]:
    out = dict(records)
    out[rank] = [r.model_copy(update={"params": digest("restored-wrong", r.step)})
                 if isinstance(r, RestoreRecord) and r.attempt == 1 else r
                 for r in records[rank]]
    return out


def _write_traces(location: RunLocation, leg: str,
                  records: dict[int, list[TraceRecord]]) -> None:
    for rank, recs in records.items():
        for attempt in sorted({r.attempt for r in recs}):
            with TraceWriter(location.trace_sink(leg, rank, attempt)) as w:
                for record in recs:
                    if record.attempt == attempt:
                        w.write(record)


# --------------------------------------------------------------------------- expectations

Status = Literal["detected", "not_applicable", "blind"]


def expected_control(spec: QualificationSpec, leg: LegPlan) -> Status:
    """What the comparator must conclude of a control leg :func:`control_plants` wrote."""
    (omission,) = leg.omit
    shows = effect(spec, omission)
    if shows is None:
        # Its leg resumed exactly; the reference shows why, given two steps to show it.
        return "not_applicable" if spec.training.steps >= 2 else "blind"
    moved_ = {p.boundary for p in control_plants(Stack(spec), leg)}
    compared = set(spec.comparison.boundaries)
    if spec.preemption.resize is not None:
        # After a resize: the data ledger, the loss and gradient norm within tolerance,
        # the final drift of what is compared.
        seen = moved_ & {"inputs", "loss", "grad_norm"} or \
            moved_ & {"params", "optimizer_state"} & compared
        return "detected" if seen else "blind"
    return "detected" if moved_ & compared else "blind"


