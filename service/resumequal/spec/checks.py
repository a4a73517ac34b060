"""Checks across the sections of a qualification: a cut that lands where the training,
its checkpoints and its world allow, settings of one parallelism not given to another, and
a resize the world, the data and the comparison can take.

Each check does arithmetic, never a walk over steps, and raises ValueError naming the
fields in camelCase (pydantic reports it against the spec as a whole).
"""

from __future__ import annotations

from resumequal.spec.sections import ResizeSpec, SpecSections
from resumequal.spec.training import DDPSpec


def check_qualification(spec: SpecSections) -> None:
    """ValueError naming the fields when sections of ``spec`` contradict each other."""
    _check_cut(spec)
    if spec.parallelism.kind == "fsdp2":
        _check_fsdp2(spec.ddp)
    if spec.preemption.resize is not None:
        _check_resize(spec, spec.preemption.resize)
    if spec.timeouts.arm_seconds >= spec.timeouts.process_group_seconds:
        raise ValueError(
            "timeouts.armSeconds must be < timeouts.processGroupSeconds: the other ranks "
            "wait in a collective while the armed rank holds"
        )


def _check_cut(spec: SpecSections) -> None:
    t, p = spec.training, spec.preemption
    if p.step > t.steps:
        raise ValueError(
            f"preemption.step={p.step} is after the last step (training.steps={t.steps})"
        )
    if p.microstep >= t.accumulation_steps:
        raise ValueError(
            f"preemption.microstep={p.microstep} must be < training.accumulationSteps="
            f"{t.accumulation_steps}"
        )
    if p.at == "checkpoint_commit":
        if p.microstep != 0:
            raise ValueError("preemption.microstep must be 0 with at: checkpoint_commit")
        if not spec.checkpoint.saves_after(p.step, t.steps):
            raise ValueError(
                f"preemption.at=checkpoint_commit: no checkpoint is saved after step "
                f"{p.step}; add it to checkpoint.atSteps"
            )
    if (
        spec.checkpoint.async_save
        and p.mode == "hard"
        and p.at == "microbatch"
        and p.step > 1
        and spec.checkpoint.saves_after(p.step - 1, t.steps)
    ):
        raise ValueError(
            f"preemption.step={p.step} with checkpoint.async: the checkpoint saved after "
            f"step {p.step - 1} is still being written in the background during step "
            f"{p.step}, so whether a hard kill there resumes from it depends on timing; "
            "cut at least two steps after a save"
        )
    if p.rank >= spec.world.world_size:
        raise ValueError(
            f"preemption.rank={p.rank} does not exist in a world of {spec.world.world_size}"
        )
    if p.mode == "hard" and spec.checkpoint.last_save_before(p.step, t.steps) is None:
        raise ValueError(
            f"preemption.step={p.step}: a hard kill there lands before the first committed "
            "checkpoint, so the restart would not be a resume; set checkpoint.everySteps "
            "or checkpoint.atSteps to a step before it"
        )


def _check_fsdp2(ddp: DDPSpec) -> None:
    defaults = DDPSpec()
    for name, field in DDPSpec.model_fields.items():
        if getattr(ddp, name) != getattr(defaults, name):
            raise ValueError(
                f"ddp.{field.alias} is set but parallelism.kind is fsdp2: it is a "
                "DistributedDataParallel setting (FSDP2 reduce-scatters per fully_shard "
                "block and has no buckets to size or reducer to prime); remove it")


def _check_resize(spec: SpecSections, resize: ResizeSpec) -> None:
    p, t, w = spec.preemption, spec.training, spec.world
    where = "preemption.resize"
    if p.target != "pod" or p.mode != "hard":
        raise ValueError(
            f"{where} needs preemption.target: pod and mode: hard (a lost node, which "
            "saves nothing: a graceful stop's emergency checkpoint would carry one rank's "
            "pending gradients, which no rank of a smaller world can take over)")
    if resize.to_nodes != w.nnodes - 1:
        raise ValueError(
            f"{where}.toNodes={resize.to_nodes}: a kill takes one node of "
            f"world.nnodes={w.nnodes}, so the leg continues on {w.nnodes - 1}")
    global_microbatches = t.accumulation_steps * w.world_size
    smaller = resize.to_nodes * w.nproc_per_node
    if global_microbatches % smaller:
        raise ValueError(
            f"{where}.toNodes={resize.to_nodes}: a step's {global_microbatches} "
            f"microbatches (training.accumulationSteps x world size) do not divide among "
            f"{smaller} ranks")
    grow = resize.grow_after_step
    if grow is not None:
        if not p.step <= grow < t.steps:
            raise ValueError(
                f"{where}.growAfterStep={grow} must be from preemption.step={p.step} "
                f"to training.steps-1={t.steps - 1}: a step of the smaller world first, "
                "then a step of the grown one")
        if not spec.checkpoint.saves_after(grow, t.steps):
            raise ValueError(
                f"{where}.growAfterStep={grow}: no checkpoint is saved after step {grow}, "
                "which the grown world resumes from; add it to checkpoint.atSteps")
    c = spec.comparison
    missing = [b for b in ("loss", "grad_norm", "params") if b not in c.tolerances]
    if c.mode != "tolerance" or missing:
        raise ValueError(
            f"{where} needs comparison.mode: tolerance with tolerances for loss, grad_norm "
            "and params: after a resize the reduction order differs, so those drift"
            + (f" (missing: {', '.join(missing)})" if c.mode == "tolerance" else ""))
    if spec.workload.loader is not None:
        raise ValueError(
            f"{where}: workload.loader shards its samples per rank; a resize needs the "
            "samples of each global step defined globally (remove workload.loader)")
    if spec.matrix.seeds:
        raise ValueError(f"{where}: a seed matrix runs other cuts and kill modes; remove "
                         "matrix.seeds")
