"""One training leg inside one worker process: build, resume, train, trace, checkpoint.

The loop is the same for the control and the preempted leg; only the cut point (and, for
negative controls, the omissions applied on resume) differ. The arithmetic of an update is
:mod:`resumequal.train.update`'s; what is digested of the model,
:mod:`resumequal.train.recording`'s.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from resumequal.checkpoint import CheckpointManager, CheckpointRoot, Position
from resumequal.checkpoint.manifest import CheckpointInfo, manifest_digest
from resumequal.errors import CheckpointError, TrainingError
from resumequal.run.legfiles import LegFiles
from resumequal.spec import REFERENCE_LEG, QualificationSpec, SpecError, check_leg_name
from resumequal.trace import digest
from resumequal.trace.digest import Digests, bucket_layout_digest, rng_digests
from resumequal.trace.inventory import collect_inventory
from resumequal.trace.records import (
    ArmRecord,
    CompileRecord,
    LossScaleRecord,
    MicrostepPartial,
    MicrostepRecord,
    RestoreRecord,
    SavedRecord,
    StartupRecord,
    StepPartial,
    StepRecord,
    TensorDigests,
    TraceSink,
    TraceWriter,
)
from resumequal.train.capture import StepCapture, named_optimizer_tensors
from resumequal.train.compiling import (
    CompileWatch,
    compile_blocks,
    compile_model,
    place_cache,
)
from resumequal.train.devices import check_trains_on
from resumequal.train.distributed import Placement, process_started_at
from resumequal.train.globaldata import GlobalData
from resumequal.train.handoff import handoff_digest
from resumequal.train.precision import Precision
from resumequal.train.preemption import (
    Arming,
    CutPoint,
    Preempted,
    StopFlag,
    hold_for_grow,
    mark_failed,
)
from resumequal.train.prime import prime_reducer
from resumequal.train.recording import (
    GradRecorder,
    grad_digests,
    local_digests,
    named_grads,
    named_state,
    optimizer_state_digests,
    param_digests,
    parameter_names,
    unsaved_buffers,
    unwrapped,
)
from resumequal.train.sharding import (
    ReduceScatterRecorder,
    rebind_optimizer,
    shard_model,
    shard_units,
)
from resumequal.train.startup import resume_gc, thaw_gc
from resumequal.train.state import (
    Counters,
    LiveState,
    RankState,
    pending_grads_template,
    rank_state,
    restore,
    seed_everything,
    tensor_state,
)
from resumequal.train.update import forward_backward, step_optimizer, unscale_and_clip
from resumequal.workloads import load_workload
from resumequal.workloads.base import PositionalDataset, WorkloadContext
from resumequal.workloads.optim import describe_built

log = logging.getLogger(__name__)


class Trainer:
    """Trains one leg in this process, from scratch or from the newest checkpoint."""

    def __init__(
        self,
        spec: QualificationSpec,
        leg: str,
        files: LegFiles,
        placement: Placement,
        *,
        checkpoint_root: CheckpointRoot,
        trace: TraceSink,
        scratch: Path,
        omit: frozenset[str] = frozenset(),
    ) -> None:
        """``files`` are the leg's beacons and markers; ``checkpoint_root`` and ``trace``
        say where its checkpoints and this rank's trace go; ``scratch`` is the local folder
        for what is not kept (inductor's cache under ``compile``)."""
        check_leg_name(leg)
        self.spec = spec
        self.leg = leg
        self.files = files
        self.p = placement
        self.omit = omit
        # Before anything is digested: every digest of this process, the inventory's name
        # for them included, comes from this algorithm.
        digest.use(spec.comparison.digest_on(placement.device.type))
        self.scratch = scratch
        self.compiled: CompileRecord | None = None
        self.compile_watch: CompileWatch | None = None
        # Set by a replay (resumequal zoom): the step whose tensors are captured whole.
        self.capture: StepCapture | None = None
        # Every attempt would meet these: fail the leg for good, not be restarted into it.
        with _failing_leg(files, placement.rank):
            self.precision = Precision.of(spec.training, placement.device,
                                          spec.parallelism.kind)
            # A resize run takes each step's microbatches by global position (train.globaldata).
            self.global_data = (GlobalData.of(spec, placement.rank, placement.world_size, omit)
                                if spec.preemption.resize is not None else None)
        self.stop = StopFlag()
        self.arming = Arming(_cut_point(spec, leg), rank=placement.rank,
                             attempt=placement.attempt, files=files, stop=self.stop,
                             on_arm=self._on_arm)
        self.ckpt = _checkpoint_manager(spec, checkpoint_root, placement,
                                        resizable=self.global_data is not None)
        self.trace = TraceWriter(trace)
        self.recorder: GradRecorder | ReduceScatterRecorder

    # -- setup --------------------------------------------------------------------------

    def _build(self) -> LiveState:
        t = self.spec.training
        torch.set_num_threads(self.spec.world.threads_per_rank)
        if t.deterministic_algorithms:
            torch.use_deterministic_algorithms(True)
        # Identical model initialisation on every rank, then per-rank streams.
        seed_everything(t.seed)
        ctx = WorkloadContext(
            params=dict(self.spec.workload.params),
            training=t,
            rank=self.p.rank,
            world_size=self.p.world_size,
            device=self.p.device,
        )
        workload = load_workload(self.spec.workload, ctx)
        if self.global_data is not None and not isinstance(workload.dataset, PositionalDataset):
            reason = (f"preemption.resize takes samples by global position, and the workload's "
                      f"dataset ({type(workload.dataset).__name__}) has no microbatch_at "
                      "(resumequal.workloads.base.PositionalDataset)")
            mark_failed(self.files, reason)
            raise TrainingError(reason)
        try:
            check_trains_on(workload.model, self.p.device, self.spec.workload.name)
        except SpecError as e:
            mark_failed(self.files, f"rank {self.p.rank}: {e}")  # every attempt would meet it
            raise TrainingError(str(e)) from e
        model = workload.model.to(self.p.device)
        if self.spec.compile.enabled:
            self.compiled = place_cache(self.spec.compile, self.scratch, self.p.rank)
            self.compile_watch = CompileWatch(self.p.rank, self.p.attempt)
        wrapped = self._wrap_fsdp2(workload.optimizer, model) \
            if self.spec.parallelism.kind == "fsdp2" else self._wrap_ddp(model)
        seed_everything(t.seed + 104729 * (self.p.rank + 1))
        return LiveState(workload=workload, model=wrapped, rank=self.p.rank,
                         world_size=self.p.world_size, scaler=self.precision.new_scaler())

    def _wrap_ddp(self, model: nn.Module) -> nn.Module:
        if self.spec.compile.enabled:
            compile_model(model, self.spec.compile)  # in place, inside DDP
        ddp = DDP(
            model,
            device_ids=[self.p.local_rank] if self.p.device.type == "cuda" else None,
            bucket_cap_mb=self.spec.ddp.bucket_cap_mb,
        )
        self.recorder = GradRecorder(parameter_names(model))
        # DDP inspects the hook's annotations, which postponed evaluation turns into strings.
        recorder = self.recorder
        ddp.register_comm_hook(None, lambda state, bucket: recorder.hook(state, bucket))
        return ddp

    def _wrap_fsdp2(self, optimizer: torch.optim.Optimizer, model: nn.Module) -> nn.Module:
        names = parameter_names(model)
        self.recorder = ReduceScatterRecorder()
        sharded = shard_model(model, self.p.device, self.p.world_size, self.recorder)
        rebind_optimizer(optimizer, names, sharded)
        if self.spec.compile.enabled:
            compile_blocks([unit for _, unit in shard_units(model)], self.spec.compile)
        return sharded

    def _resume(self, live: LiveState) -> None:
        removed = self.ckpt.collect_garbage()
        if removed:
            log.warning("rank 0 removed uncommitted checkpoints: %s", ", ".join(removed))
        name = self.ckpt.newest()
        if name is None:
            if self.p.attempt > 0:
                log.warning("attempt %d found no committed checkpoint; starting over",
                            self.p.attempt)
            return
        self._restore(live, name)

    def _restore(self, live: LiveState, name: str) -> None:
        """Load checkpoint ``name`` into ``live`` and record what was restored."""

        def template(ranks: RankState) -> dict[str, Any]:
            tensors = tensor_state(live, with_pending_grads=False)
            if ranks.pending_grads:
                tensors.update(pending_grads_template(live, ranks.pending_grads))
            return tensors

        loaded = self.ckpt.load(name, template, RankState)
        restore(live, loaded.tensors, loaded.rank_state, self.omit, source=name,
                global_data=self.global_data is not None)
        check_counters_agree(live.counters, self.p.device)
        handoff = handoff_digest(live) if self.global_data is not None else None
        c = live.counters
        params = param_digests(live.model)
        optim = optimizer_state_digests(live.model, live.workload.optimizer)
        manifest = loaded.manifest
        self.trace.write(
            RestoreRecord(
                rank=self.p.rank,
                attempt=self.p.attempt,
                checkpoint=name,
                step=c.step,
                microstep=c.microstep,
                global_microstep=c.global_microstep,
                omitted=sorted(self.omit),  # type: ignore[arg-type]
                restored_at=time.time(),
                params=params.whole,
                optimizer_state=optim.whole,
                world_size=self.p.world_size,
                saved_world_size=loaded.rank_state.world_size,
                handoff=handoff,
                run=manifest.run,
                leg=manifest.info.get("leg"),
                manifest=manifest_digest(manifest),
                tensors=TensorDigests(params=params.tensors, optimizer_state=optim.tensors),
                buffers=[n for n, _ in unwrapped(live.model).named_buffers()],
                unsaved=unsaved_buffers(unwrapped(live.model)),
            )
        )
        log.info("rank %d resumed from %s (saved by %d rank(s), restored by %d)", self.p.rank,
                 name, loaded.rank_state.world_size, self.p.world_size)

    # -- training -----------------------------------------------------------------------

    def run(self) -> None:
        """Train to the last step; raises Preempted after a graceful emergency checkpoint.

        Only graceful mode handles SIGTERM: in hard mode a SIGTERM (what a pod deletion
        sends first) ends the process like SIGKILL, and no emergency checkpoint is written.
        """
        if self.spec.preemption.mode == "graceful":
            self.stop.install()
        live = self._build()
        self.trace.write(
            StartupRecord(
                rank=self.p.rank,
                attempt=self.p.attempt,
                pid=os.getpid(),
                process_started_at=process_started_at(),
                group_joined_at=self.p.joined_at,
                built_at=time.time(),
            )
        )
        w = live.workload
        built = describe_built(w.optimizer, w.scheduler, self.spec.training)
        self.trace.write(collect_inventory(self.p.rank, self.p.attempt, self.compiled, built))
        self._resume(live)
        if self.spec.parallelism.kind == "ddp" and self.spec.ddp.reducer_prime:
            prime_reducer(live, self.precision)
            self.recorder.reset()
        resume_gc()  # start-up is over (resumequal.train.startup)
        t = self.spec.training
        for step in range(live.counters.step + 1, t.steps + 1):
            self._step(live, step)
            thaw_gc()  # the first step is done (resumequal.train.startup)
            if self.spec.checkpoint.saves_after(step, t.steps):
                self._save(live, hold_step=step)
        self.ckpt.poll(wait=True)  # the last background save, if any
        self.trace.close()
        # Only now is this rank done: a leg is finished when every rank has said so.
        self.files.mark_rank_done(self.p.rank, self.p.attempt, live.counters.step)

    def _step(self, live: LiveState, step: int) -> None:
        w = live.workload
        t = self.spec.training
        gd = self.global_data
        accum = t.accumulation_steps if gd is None else gd.microsteps
        if gd is not None and live.counters.microstep == 0:
            self._maybe_hold_for_grow(step)
        if live.counters.microstep == 0 or live.trace_partial is None:
            live.trace_partial = StepPartial(rng=rng_digests(), started_at=time.time(),
                                             microsteps=[])
        self.recorder.reset()
        cap = self.capture if self.capture is not None and self.capture.step == step else None
        if cap is not None:
            optimizer_names = parameter_names(unwrapped(live.model))
            cap.stage("params_before", named_state(live.model))
            cap.stage("optimizer_state_before",
                      named_optimizer_tensors(w.optimizer, optimizer_names).items())
            if isinstance(self.recorder, GradRecorder):
                self.recorder.keep = True
        with nullcontext() if cap is None else cap.hooks(unwrapped(live.model)):
            self._microsteps(live, step, accum, cap)

        params = [p for p in live.model.parameters() if p.grad is not None]
        reduced = grad_digests(live.model)
        if cap is not None:
            if isinstance(self.recorder, GradRecorder):
                cap.stage("local_grads", self.recorder.tensors.items())
            cap.stage("reduced_grads", named_grads(live.model))
        self._finish_step(live, step, params, reduced, cap)

    def _microsteps(self, live: LiveState, step: int, accum: int,
                    cap: StepCapture | None) -> None:
        w = live.workload
        gd = self.global_data
        partial = live.trace_partial
        assert partial is not None
        for m in range(live.counters.microstep, accum):
            if cap is not None:
                cap.microstep = m
            self._settle_background_save(step)
            self.arming.maybe_hold(step, m, "microbatch")
            if self.stop.agreed(self.p.device):
                self._save(live, hold_step=None)
                raise Preempted(f"stopped at step {step} microstep {m}")
            global_index = None
            if gd is None:
                mb = w.dataset.next_microbatch()
            else:
                slot = gd.slot(m)
                global_index = slot.index
                # Augmentation and dropout draw from the microbatch's own streams.
                seed_everything(gd.seed_of(step, slot.rng_index))
                assert isinstance(w.dataset, PositionalDataset)
                mb = w.dataset.microbatch_at(gd.position(step, slot.data_index),
                                             gd.microbatch_size)
            loss = forward_backward(live, self.precision, mb, accum, sync=m == accum - 1)
            partial["microsteps"].append(
                MicrostepPartial(index=m, global_index=global_index, sample_ids=list(mb.sample_ids),
                                 loss=loss.item())
            )
            live.counters.microstep = m + 1
            live.counters.global_microstep += 1

    def _finish_step(self, live: LiveState, step: int, params: list[nn.Parameter],
                     reduced: Digests, cap: StepCapture | None) -> None:
        """Unscale, clip, step the optimizer and the scheduler, and trace the step."""
        t = self.spec.training
        loss_scale, norm = unscale_and_clip(live, params, t.grad_clip_norm)
        # What the optimizer takes: unscaled (fp16) and clipped.
        clipped = reduced if t.grad_clip_norm is None and live.scaler is None \
            else grad_digests(live.model)
        if cap is not None:
            cap.stage("clipped_grads", named_grads(live.model))
        lrs = [float(g["lr"]) for g in live.workload.optimizer.param_groups]
        step_optimizer(live, cap)
        live.counters.step = step
        live.counters.microstep = 0
        self._trace_step(live, step, cap, loss_scale=loss_scale, norm=norm, reduced=reduced,
                         clipped=clipped, lrs=lrs)
        live.trace_partial = None
        if self.compile_watch is not None:
            compiled = self.compile_watch.after_step(step)
            if compiled is not None:
                self.trace.write(compiled)

    def _trace_step(self, live: LiveState, step: int, cap: StepCapture | None, *,
                    loss_scale: LossScaleRecord | None, norm: torch.Tensor, reduced: Digests,
                    clipped: Digests, lrs: list[float]) -> None:
        """Write the step's StepRecord: its microsteps, gradients, norm, rates and state."""
        w = live.workload
        # FSDP2 has no buckets: its reduce-scatter groups are fixed when the model is wrapped.
        layout = self.recorder.layout() if isinstance(self.recorder, GradRecorder) else None
        if cap is not None and layout is not None:
            cap.buckets = [b.model_dump() for b in layout]
        partial = live.trace_partial
        assert partial is not None
        handoff = None
        if self.global_data is not None and self.spec.checkpoint.saves_after(
                step, self.spec.training.steps):
            handoff = handoff_digest(live)
        params = param_digests(live.model)
        optim = optimizer_state_digests(live.model, w.optimizer)
        self.trace.write(
            StepRecord(
                rank=self.p.rank,
                attempt=self.p.attempt,
                step=step,
                microsteps=[MicrostepRecord(**m) for m in partial["microsteps"]],
                rng=partial["rng"],
                loss_scale=loss_scale,
                local_grads=self.recorder.local_digest(),
                bucket_layout=None if layout is None else bucket_layout_digest(layout),
                buckets=layout or [],
                reduced_grads=reduced.whole,
                grad_norm=float(norm.item()),
                clipped_grads=clipped.whole,
                lr=lrs,
                params=params.whole,
                optimizer_state=optim.whole,
                started_at=partial["started_at"],
                finished_at=time.time(),
                world_size=self.p.world_size,
                handoff=handoff,
                tensors=TensorDigests(
                    local_grads=local_digests(live.model, self.recorder.local),
                    reduced_grads=reduced.tensors, clipped_grads=clipped.tensors,
                    params=params.tensors, optimizer_state=optim.tensors),
            )
        )

    def _maybe_hold_for_grow(self, step: int) -> None:
        """In a world shrunk by a resize, wait at the first step after ``growAfterStep``
        (its checkpoint committed) for the grown world to restart this process."""
        resize = self.spec.preemption.resize
        if (resize is None or resize.grow_after_step != step - 1
                or self.p.world_size >= self.spec.world.world_size):
            return
        self.ckpt.poll(wait=True)
        hold_for_grow(self.files, self.p.rank, self.p.attempt, step,
                      self.spec.timeouts.arm_seconds)

    def _settle_background_save(self, step: int) -> None:
        """Commit a background save once every rank has written it (a collective, only
        while one is pending); once a whole step has run since it began, wait for it."""
        pending = self.ckpt.pending
        if pending is not None:
            self.ckpt.poll(wait=pending.step < step - 1)

    def _save(self, live: LiveState, hold_step: int | None) -> None:
        """A periodic checkpoint after ``hold_step``, or (None) the emergency checkpoint,
        which is always written synchronously."""
        c = live.counters
        position = Position(c.step, c.microstep)

        def before_commit() -> None:
            if hold_step is not None:
                self.arming.maybe_hold(hold_step, 0, "checkpoint_commit")

        tensors = tensor_state(live, with_pending_grads=c.microstep > 0)
        info = CheckpointInfo(leg=self.leg, global_microstep=c.global_microstep)
        # The emergency checkpoint is always synchronous: the process exits right after.
        name = self.ckpt.save(position, tensors, rank_state(live), info=info,
                              before_commit=before_commit,
                              background=self.spec.checkpoint.async_save
                              and hold_step is not None)
        if name is not None and c.microstep > 0:
            # No step record holds what this one saved: its window's forwards moved buffers.
            params = param_digests(live.model)
            optim = optimizer_state_digests(live.model, live.workload.optimizer)
            self.trace.write(SavedRecord(
                rank=self.p.rank, attempt=self.p.attempt, checkpoint=name,
                params=params.whole, optimizer_state=optim.whole,
                tensors=TensorDigests(params=params.tensors, optimizer_state=optim.tensors)))

    def _on_arm(self, step: int, microstep: int, where: str) -> None:
        self.trace.write(ArmRecord(rank=self.p.rank, attempt=self.p.attempt, step=step,
                                   microstep=microstep, pid=os.getpid(), armed_at=time.time()))


@contextmanager
def _failing_leg(files: LegFiles, rank: int) -> Iterator[None]:
    """A TrainingError raised inside marks the leg failed for good, then goes on."""
    try:
        yield
    except TrainingError as e:
        mark_failed(files, f"rank {rank}: {e}")
        raise


def _cut_point(spec: QualificationSpec, leg: str) -> CutPoint | None:
    """Where this leg is cut: every leg but the control is (the main preempted leg,
    scenarios, controls)."""
    if leg == REFERENCE_LEG:
        return None
    pre = spec.preemption
    return CutPoint(pre.step, pre.microstep, pre.rank, pre.at, spec.timeouts.arm_seconds)


def _checkpoint_manager(spec: QualificationSpec, root: CheckpointRoot, p: Placement, *,
                        resizable: bool) -> CheckpointManager:
    """This rank's checkpoints of the leg under ``root``, as the spec's checkpoint section
    says."""
    return CheckpointManager(
        root,
        rank=p.rank,
        world_size=p.world_size,
        attempt=p.attempt,
        keep_last=spec.checkpoint.keep_last,
        async_save=spec.checkpoint.async_save,
        resizable=resizable,
        group_timeout=timedelta(seconds=spec.timeouts.process_group_seconds),
    )


def check_counters_agree(counters: Counters, device: torch.device) -> None:
    """MIN/MAX all-reduce the restored counters; stop naming ranks and values if they differ."""
    values = torch.tensor(counters.as_tuple(), dtype=torch.int64, device=device)
    lo, hi = values.clone(), values.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    if torch.equal(lo, hi):
        return
    gathered = [torch.zeros_like(values) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, values)
    names = ("step", "microstep", "global_microstep")
    problems = []
    for i, name in enumerate(names):
        if lo[i] != hi[i]:
            per_rank = ", ".join(f"rank {r}={int(g[i])}" for r, g in enumerate(gathered))
            problems.append(f"{name}: {per_rank}")
    raise CheckpointError("ranks restored different counters: " + "; ".join(problems))
