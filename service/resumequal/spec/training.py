"""The sections that say what trains and how: the workload, the world, the training's
numerics, and how the model is spread over the ranks and compiled."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from resumequal.spec.launchers import DEFAULT_LAUNCHER, Launcher
from resumequal.spec.section import (
    MAX_ACCUMULATION,
    MAX_BUCKET_MB,
    MAX_MICROBATCH,
    MAX_NODES,
    MAX_NPROC_PER_NODE,
    MAX_PARAMS,
    MAX_SEED,
    MAX_STEPS,
    Section,
    Steps,
)

BUILTIN_WORKLOADS: tuple[str, ...] = ("dropout-mlp", "tiny-gpt")


# The numeric precision of forward and loss: fp32, or autocast to bf16 / fp16.
Precision = Literal["fp32", "bf16", "fp16"]


class LoaderSpec(Section):
    """Feed the workload through torchdata's ``StatefulDataLoader`` (worker processes,
    prefetch), whose ``state_dict`` is checkpointed per rank.

    A built-in workload is wrapped in one with these settings. A factory is handed them as
    ``ctx.loader`` and must return a ``StatefulDataLoader`` built with them (checked when
    the workload is built), so the spec says what ran."""

    workers: int = Field(
        default=2, ge=0, le=64,
        description="DataLoader worker processes per rank; 0: load in the training process.",
    )
    prefetch_factor: int = Field(
        default=2, ge=1, le=64,
        description="Batches each worker loads ahead (with workers only).",
    )
    persistent_workers: bool = Field(
        default=True, description="Keep the workers across epochs (with workers only)."
    )


class WorkloadSpec(Section):
    """What trains: a built-in reference workload or a user factory ``module:function``."""

    name: str = Field(
        default="tiny-gpt", max_length=256,
        description="Built-in workload (dropout-mlp, tiny-gpt) or a factory 'module:function'.",
    )
    params: dict[str, Any] = Field(
        default_factory=dict, max_length=MAX_PARAMS,
        description="Workload parameters, validated by the workload.",
    )
    loader: LoaderSpec | None = Field(
        default=None,
        description="Set: the data source is a torchdata StatefulDataLoader (needs "
        "resumequal[data]); a built-in is wrapped in one, a factory must return one.",
    )

    @field_validator("name")
    @classmethod
    def _known(cls, value: str) -> str:
        if ":" in value:
            module, _, func = value.partition(":")
            if not module or not func.isidentifier():
                raise ValueError(f"factory must look like 'package.module:function', got {value!r}")
            return value
        if value not in BUILTIN_WORKLOADS:
            raise ValueError(
                f"unknown workload {value!r}; allowed: {', '.join(BUILTIN_WORKLOADS)} "
                "or a factory 'module:function'"
            )
        return value

    @property
    def is_factory(self) -> bool:
        return ":" in self.name


class WorldSpec(Section):
    """How many processes train and how they talk."""

    nnodes: int = Field(
        default=1, ge=1, le=MAX_NODES,
        description="Nodes of the world, one torchrun agent each: a pod on a cluster; locally, "
        "agents side by side on loopback. The world size is nnodes x nprocPerNode.",
    )
    nproc_per_node: int = Field(
        default=2, ge=1, le=MAX_NPROC_PER_NODE,
        description="Ranks (worker processes) per node: torchrun's --nproc-per-node.",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="auto: nccl when CUDA is available, else gloo."
    )
    threads_per_rank: int = Field(
        default=1, ge=1, le=1024,
        description="torch intra-op threads per rank (CPU oversubscription).",
    )
    max_restarts: int = Field(
        default=1, ge=1, le=100,
        description="Elastic restarts the launcher may make (the kill needs 1).",
    )
    launcher: Launcher = Field(
        default=DEFAULT_LAUNCHER,
        description="What starts each attempt's workers. torchrun (the default): stock "
        "torchrun, every worker a fresh interpreter, as a production restart. forked "
        "(opt-in, faster restarts): workers forked from one process that loaded their code "
        "once; they share its hash secret, memory layout and import-time state, so a resume "
        "that depends on those is not seen (the report says so).",
    )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node


class OptimizerSpec(Section):
    """The optimizer the built-in workloads build (``build_optimizer``). A workload factory is
    handed it as ``ctx.training.optimizer`` and builds its own optimizer, from it or not."""

    name: Literal["adamw", "adam", "sgd"] = Field(
        default="adamw",
        description="torch.optim.AdamW, Adam or SGD, on the single-tensor code path "
        "(foreach=False).",
    )
    lr: float = Field(default=3e-3, gt=0,
                      description="Base learning rate; the schedule multiplies it.")
    weight_decay: float = Field(
        default=0.01, ge=0,
        description="The optimizer's weight_decay (decoupled in AdamW, an L2 term in Adam "
        "and SGD).",
    )
    betas: tuple[float, float] = Field(
        default=(0.9, 0.95),
        description="adam, adamw: decay rates of the running means of the gradient and of "
        "its square.",
    )
    eps: float = Field(default=1e-8, gt=0,
                       description="adam, adamw: added to the denominator for stability.")
    momentum: float = Field(default=0.9, ge=0, description="sgd only")


class ScheduleSpec(Section):
    """Learning-rate schedule, stepped once per optimizer step. The built-in workloads build
    it (``build_scheduler``); a factory is handed it as ``ctx.training.schedule``."""

    kind: Literal["constant", "step", "warmup-cosine"] = Field(
        default="warmup-cosine",
        description="constant: lr throughout; step: lr x gamma every stepSize steps; "
        "warmup-cosine: linear warmup over warmupSteps, then a cosine down to minLrRatio x lr "
        "at training.steps.",
    )
    step_size: Steps = Field(default=4, description="step: decay every this many steps")
    gamma: float = Field(default=0.5, gt=0, description="step: multiplicative decay")
    warmup_steps: int = Field(default=3, ge=0, le=MAX_STEPS,
                              description="warmup-cosine: linear warmup")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="warmup-cosine: floor")


class GradScalerSpec(Section):
    """The loss scaler of ``precision: fp16`` (``torch.amp.GradScaler``): its settings.

    ``growthInterval`` defaults to 2, not torch's 2000: a qualification runs a dozen steps,
    in which torch's default would never grow the scale, so the scaler state a resume must
    carry would always be the initial one and its loss would go unseen. Every 2 steps the
    scale grows until fp16 gradients overflow, then backs off (skipping that update): both
    paths run before and after the cut.
    """

    # Bounded within int64: the API server checks a whole-number default against the
    # CRD's maximum as an int64 (2.0**64 would overflow it and refuse the CRD).
    init_scale: float = Field(default=65536.0, gt=0, le=2.0**62,
                              description="the scale of the first step")
    growth_factor: float = Field(default=2.0, gt=1, le=1024.0,
                                 description="scale *= this after growthInterval good steps")
    backoff_factor: float = Field(default=0.5, gt=0, lt=1,
                                  description="scale *= this after a step with inf/NaN grads")
    growth_interval: Steps = Field(default=2,
                                   description="consecutive finite steps before the scale grows")


class TrainingSpec(Section):
    """How the workload trains: steps, batches, optimizer, schedule, numerics.

    ``precision`` is the numeric precision of forward and loss: ``fp32`` (no autocast),
    ``bf16`` or ``fp16`` (``torch.autocast`` to that dtype on the leg's device; parameters,
    gradients and optimizer state stay fp32). ``fp16`` also scales the loss with a
    ``torch.amp.GradScaler`` (``gradScaler``), whose state is checkpointed, traced (the
    ``loss_scale`` boundary) and covered by the ``scaler`` negative control. A device whose
    torch cannot autocast to the dtype is refused before training, naming this field.
    """

    steps: Steps = Field(default=12, description="optimizer steps per leg")
    accumulation_steps: int = Field(default=3, ge=1, le=MAX_ACCUMULATION,
                                    description="microbatches per update")
    microbatch_size: int = Field(
        default=8, ge=1, le=MAX_MICROBATCH,
        description="Samples in one microbatch: one forward and backward on one rank.",
    )
    seed: int = Field(
        default=1234, ge=0, le=MAX_SEED,
        description="Seeds the Python, NumPy and torch RNGs before the workload is built "
        "(every rank builds the same model), then each rank's from it and its rank; the "
        "built-in workloads' sample order and augmentation derive from it.",
    )
    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    schedule: ScheduleSpec = Field(default_factory=ScheduleSpec)
    grad_clip_norm: float | None = Field(
        default=1.0, gt=0,
        description="Clip the gradients' total L2 norm to this before the optimizer step; "
        "null: no clipping (the norm is traced either way).",
    )
    deterministic_algorithms: bool = Field(
        default=True,
        description="torch.use_deterministic_algorithms(True) in every worker: an op without "
        "a deterministic implementation raises. false leaves torch's default.",
    )
    precision: Precision = Field(
        default="fp32",
        description="fp32, or autocast of forward and loss to bf16 or fp16 (with a GradScaler)",
    )
    grad_scaler: GradScalerSpec = Field(
        default_factory=GradScalerSpec, description="precision fp16 only: the loss scaler")

    @model_validator(mode="after")
    def _scaler_needs_fp16(self) -> TrainingSpec:
        if self.precision != "fp16" and self.grad_scaler != GradScalerSpec():
            raise ValueError(
                f"training.gradScaler is set but training.precision is {self.precision}: only "
                "fp16 scales the loss (bf16 has fp32's range and needs no scaler)")
        return self


class DDPSpec(Section):
    """DistributedDataParallel's settings: parallelism.kind ddp only (fsdp2 refuses any
    change)."""

    bucket_cap_mb: float = Field(
        default=25.0, gt=0, le=MAX_BUCKET_MB,
        description="DDP's bucket_cap_mb: the size of its gradient buckets, which decides the "
        "bucket layout the trace compares.",
    )
    reducer_prime: bool = Field(
        default=True,
        description="Rebuild DDP buckets with a synthetic backward in every fresh process.",
    )


class ParallelismSpec(Section):
    """How the model is spread over the ranks.

    ``ddp``: every rank holds the whole model; gradients are all-reduced in DDP's buckets
    (the ``ddp`` section). ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on each
    repeated block and on the root, over a device mesh of all ranks; parameters, gradients
    and optimizer state are sharded (dim 0), gradients are reduce-scattered per block.
    The ``ddp`` section is DDP's: under fsdp2 it must keep its defaults.
    """

    kind: Literal["ddp", "fsdp2"] = Field(
        default="ddp", description="ddp (replicated model) or fsdp2 (fully_shard per block)")


CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
CompileCache = Literal["shared", "per-rank", "fresh"]


class CompileSpec(Section):
    """``torch.compile`` of the model (inductor), and where its caches live.

    The model is compiled in place (``nn.Module.compile``: parameter names, checkpoints and
    digests are the eager model's) before DDP wraps it, or block by block once FSDP2 has
    sharded it. ``cache`` places inductor's on-disk caches (``TORCHINDUCTOR_CACHE_DIR``,
    ``TRITON_CACHE_DIR``), set in each process before it compiles: ``shared`` one folder
    under the run's scratch for every rank, leg and attempt (a resumed process starts warm
    from what the first one compiled); ``per-rank`` one such folder per rank; ``fresh`` a
    new empty folder per process (every process compiles cold, as on a new node).
    """

    enabled: bool = Field(default=False, description="compile the model with torch.compile")
    mode: CompileMode = Field(
        default="default", description="torch.compile's mode (enabled only)")
    cache: CompileCache = Field(
        default="shared",
        description="inductor's cache folder: shared by every process of the run, one per "
        "rank, or a fresh empty one per process (enabled only)")

    @model_validator(mode="after")
    def _settings_need_enabled(self) -> CompileSpec:
        if not self.enabled:
            for name, field in CompileSpec.model_fields.items():
                if name != "enabled" and getattr(self, name) != field.default:
                    raise ValueError(
                        f"compile.{field.alias} is set but compile.enabled is false: the "
                        "model would run eagerly; set compile.enabled=true or remove it")
        return self
