"""The qualification spec: one pydantic model per component, shared by the CLI and the CRD.

Every field has a default that runs on a 2-core CPU machine. Unknown fields are rejected;
errors name the field path and, where there is a closed set, the allowed values.

Field names are camelCase, as in every Kubernetes resource (``world.nprocPerNode``), and
spelt so wherever a spec is written: spec files, run directories (``spec.json``,
``run.json``), reports and the QualificationRun CRD. A spec read from YAML, JSON or
``--set`` may also use the snake_case Python names (``world.nproc_per_node``); error
messages name fields in camelCase whichever spelling was read.

Every number has an upper bound and floats are finite (a spec is read by an operator that
must not hang on ``training.steps: 1e14`` or overflow on a timeout of 1e300), and checks
across fields do arithmetic, never a walk over steps. The bounds are generous for a
qualification and appear in the CRD schema too.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from resumequal.boundaries import BOUNDARIES as BOUNDARIES
from resumequal.boundaries import Boundary as Boundary
from resumequal.boundaries import of_kind
from resumequal.errors import ResumequalError
from resumequal.launchers import DEFAULT_LAUNCHER, Launcher
from resumequal.redact import redact
from resumequal.store.gcssettings import GCSSettings
from resumequal.store.registry import store_class, supported
from resumequal.store.s3settings import S3Settings
from resumequal.store.settings import StoreSettings, settings_problem
from resumequal.yamlread import MAX_CHARS, YAMLInputError, load_yaml

BUILTIN_WORKLOADS: tuple[str, ...] = ("dropout-mlp", "tiny-gpt")

# The negative controls, each a resume that leaves one part of the training state out (or,
# under preemption.resize, a rank-keyed bug). What each leaves out, when it applies and
# how its absence is shown is its descriptor's (resumequal.omissions.CONTROLS).
Omission = Literal[
    "rng", "data_cursor", "scheduler", "optimizer", "model_optimizer_only", "pending_grads",
    "scaler", "loader_state", "rank_cursor", "rank_rng"
]
OMISSIONS: tuple[Omission, ...] = get_args(Omission)

# The numeric precision of forward and loss: fp32, or autocast to bf16 / fp16.
Precision = Literal["fp32", "bf16", "fp16"]


_TRAINING_SECTIONS = ("workload", "world", "training", "checkpoint", "ddp", "parallelism",
                      "compile")

# Upper bounds. A qualification is short: these leave room for any real one while keeping
# every number an int64 and every derived figure (deadlines, world size) far from overflow.
MAX_STEPS = 1_000_000
MAX_ACCUMULATION = 4096
MAX_MICROBATCH = 1 << 20
MAX_NODES = 1024
MAX_NPROC_PER_NODE = 256
# The largest integer every JSON reader keeps exact (float64's): the API server reads a
# QualificationRun's numbers, and its CRD's bounds, as float64, and refuses an integer
# bound it cannot hold (2**63 - 1 rounds up past int64). torch.manual_seed takes it.
MAX_SEED = 2**53 - 1
MAX_SECONDS = 7 * 24 * 3600.0  # any timeout or grace period: a week
MAX_BUCKET_MB = 65536.0
MAX_LIST = 1000  # checkpoint.atSteps and other lists
MAX_SEEDS = 64
MAX_PARAMS = 64  # workload.params entries
MAX_URI = 2048
# A pin labels metrics, the status and reports, and alert templates put it into PromQL:
# label-safe characters only, as image tags and versions are spelled (train:2026-11-29,
# train@sha256:0123abcd4567, pt-2.6-cu124, torch==2.13.0+cpu).
PIN_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+:@=-]{0,127}$"
_PIN = re.compile(PIN_PATTERN)


def check_pin(value: str) -> str:
    """``value`` if it can be a pin, else ValueError saying what a pin is (not echoing it:
    what is not label-safe is not printed either)."""
    if not _PIN.match(value):
        raise ValueError("a pin is 1-128 of letters, digits and . _ + : @ = -, starting "
                         "with a letter or digit (e.g. torch==2.13.0+cpu, train:2026-11-29)")
    return value


class SpecError(ResumequalError, ValueError):
    """A spec that cannot be loaded or does not validate; the message names the field.
    (A ValueError too, for code that validates values of any origin.)"""


# The reference leg runs uninterrupted; the others are compared against it. Its folder (and
# Kubernetes) name predates the word "reference" and is kept, as runs already stored use it.
REFERENCE_LEG = "control"
_LEG_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def check_leg_name(name: str) -> str:
    """Leg names become folder names (and Kubernetes names): keep them boring."""
    if not _LEG_NAME.match(name):
        raise SpecError(
            f"leg name {name!r}: use lowercase letters, digits, '-' or '_' (at most 63 "
            "characters, starting with a letter or digit)"
        )
    return name


# Every section: camelCase on the wire (read and written), snake_case names also read.
# Floats are finite: YAML's .inf and .nan are refused where they are read. Inputs stay out
# of pydantic's own messages (a misplaced secret must not be echoed).
SECTION_CONFIG = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel,
                            validate_by_name=True, validate_by_alias=True,
                            serialize_by_alias=True, allow_inf_nan=False,
                            hide_input_in_errors=True)


class _Section(BaseModel):
    model_config = SECTION_CONFIG


class LoaderSpec(_Section):
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


class WorkloadSpec(_Section):
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


class WorldSpec(_Section):
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


class OptimizerSpec(_Section):
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


class ScheduleSpec(_Section):
    """Learning-rate schedule, stepped once per optimizer step. The built-in workloads build
    it (``build_scheduler``); a factory is handed it as ``ctx.training.schedule``."""

    kind: Literal["constant", "step", "warmup-cosine"] = Field(
        default="warmup-cosine",
        description="constant: lr throughout; step: lr x gamma every stepSize steps; "
        "warmup-cosine: linear warmup over warmupSteps, then a cosine down to minLrRatio x lr "
        "at training.steps.",
    )
    step_size: int = Field(default=4, ge=1, le=MAX_STEPS,
                           description="step: decay every this many steps")
    gamma: float = Field(default=0.5, gt=0, description="step: multiplicative decay")
    warmup_steps: int = Field(default=3, ge=0, le=MAX_STEPS,
                              description="warmup-cosine: linear warmup")
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1, description="warmup-cosine: floor")


class GradScalerSpec(_Section):
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
    growth_interval: int = Field(default=2, ge=1, le=MAX_STEPS,
                                 description="consecutive finite steps before the scale grows")


class TrainingSpec(_Section):
    """How the workload trains: steps, batches, optimizer, schedule, numerics.

    ``precision`` is the numeric precision of forward and loss: ``fp32`` (no autocast),
    ``bf16`` or ``fp16`` (``torch.autocast`` to that dtype on the leg's device; parameters,
    gradients and optimizer state stay fp32). ``fp16`` also scales the loss with a
    ``torch.amp.GradScaler`` (``gradScaler``), whose state is checkpointed, traced (the
    ``loss_scale`` boundary) and covered by the ``scaler`` negative control. A device whose
    torch cannot autocast to the dtype is refused before training, naming this field.
    """

    steps: int = Field(default=12, ge=1, le=MAX_STEPS, description="optimizer steps per leg")
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

    def fp32_defaults(self) -> bool:
        """Whether precision is fp32 with the scaler's defaults (what every spec was before
        ``precision`` existed)."""
        return self.precision == "fp32" and self.grad_scaler == GradScalerSpec()


_URI_CHARS = re.compile(r"^[^\x00-\x20\x7f?#]*$")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]{0,15}$")


def store_uri(value: str) -> str:
    """A store URI of a registered scheme (``s3://bucket/prefix``, ``file:///abs/path``, ...)
    in one spelling (no trailing '/'), or ValueError saying why not. Segments are what
    object keys and folders are made of, so none may be empty, '.' or '..' (``s3://b/x/../y``
    names no one place). Credentials (``s3://key:secret@bucket``) are refused, and the value
    is echoed only redacted."""
    # The store registry is the one list of schemes; it loads the stores (and their SDKs)
    # on this first lookup, never when the spec is imported.
    shown = repr(redact(value))
    scheme, sep, rest = value.partition("://")
    found = store_class(scheme) if sep and _SCHEME.match(scheme) else None
    if found is None:
        named = f"scheme {scheme!r} is not supported; " if _SCHEME.match(scheme) else ""
        raise ValueError(f"{shown}: {named}use {supported()}")
    if not _URI_CHARS.match(value):
        raise ValueError(f"{shown}: no spaces, control characters, '?' or '#' in a store URI")
    authority, _, path = rest.partition("/")
    if "@" in authority:
        raise ValueError("holds user:password; credentials come from the store's own chain "
                         "(AWS's, Google's Application Default Credentials), never from the "
                         "store URI")
    problem = found.authority_problem(authority)
    if problem is not None:
        raise ValueError(f"{shown}: {problem}")
    segments = path.removesuffix("/").split("/") if path.removesuffix("/") else []
    bad = next((seg for seg in segments if seg in ("", ".", "..")), None)
    if bad is not None:
        what = "an empty segment ('//')" if bad == "" else f"a {bad!r} segment"
        raise ValueError(f"{shown}: {what}; write the path without it")
    # Without an authority the root keeps its '/' (``file:///``), as ``scheme://`` is no URI.
    return f"{scheme}://{authority}/" + "/".join(segments) if segments or not authority \
        else f"{scheme}://{authority}"


class CheckpointSpec(_Section):
    """When each leg commits a checkpoint, how many it keeps, and where they live."""

    # ``async`` is a Python keyword, so the field is ``async_save`` with the YAML key as its
    # explicit alias (which wins over the generated ``asyncSave``).

    every_steps: int | None = Field(
        default=4, ge=1, le=MAX_STEPS,
        description="Commit a checkpoint after every step that is a multiple of this; null: "
        "no periodic ones. The last step is always saved.",
    )
    at_steps: list[Annotated[int, Field(ge=1, le=MAX_STEPS)]] = Field(
        default_factory=list, max_length=MAX_LIST,
        description="More steps after which a checkpoint is committed (e.g. the one "
        "preemption.at: checkpoint_commit holds in).",
    )
    keep_last: int = Field(
        default=3, ge=1, le=MAX_LIST,
        description="Committed checkpoints a leg keeps: after each commit rank 0 deletes "
        "older ones.",
    )
    store: str | None = Field(
        default=None, max_length=MAX_URI,
        description="Where checkpoints live: a path, file:///abs/path, s3://bucket/prefix or "
        "gs://bucket/prefix (legs under <store>/<leg>/checkpoints/); default: the leg's run "
        "directory.",
    )
    # One section per store with settings, each its store's own model: at most the one of
    # checkpoint.store's scheme is set (store_settings). Unset sections stay out of dumps, so
    # a spec's digest is what it was before its store had a section.
    s3: S3Settings | None = Field(
        default=None, description="How to reach an s3:// store (endpoint, region, retries)."
    )
    gcs: GCSSettings | None = Field(
        default=None, exclude_if=lambda v: v is None,
        description="How to reach a gs:// store (endpoint, retries).",
    )
    async_save: bool = Field(
        default=False,
        alias="async",
        description="Write checkpoints in the background (DCP async_save) while training "
        "goes on; the commit waits until every rank's write has finished. A save is "
        "committed before the step after next begins.",
    )

    @field_validator("store")
    @classmethod
    def _store_scheme(cls, value: str | None) -> str | None:
        if value is None or "://" not in value:
            return value
        return store_uri(value)

    @model_validator(mode="after")
    def _settings_of_the_store(self) -> CheckpointSpec:
        # Each store's settings, checked against its scheme: not a branch on the medium.
        for name, value in self:
            problem = settings_problem(f"checkpoint.{name}", value, self.store)
            if problem is not None:
                raise ValueError(problem)
        return self

    @property
    def store_settings(self) -> StoreSettings | None:
        """How to reach ``store``: its scheme's settings section, if set."""
        return next((v for _, v in self if isinstance(v, StoreSettings)), None)

    def with_store(self, store: str, settings: StoreSettings | None) -> CheckpointSpec:
        """This section with checkpoints in ``store``, reached with ``settings`` (in the
        section of their model; the others unset)."""
        update: dict[str, Any] = {"store": store}
        for name, field in type(self).model_fields.items():
            kinds = get_args(field.annotation)
            if any(isinstance(k, type) and issubclass(k, StoreSettings) for k in kinds):
                update[name] = settings if type(settings) in kinds else None
        return self.model_copy(update=update)

    @field_validator("at_steps")
    @classmethod
    def _sorted(cls, value: list[int]) -> list[int]:
        return sorted(set(value))

    def saves_after(self, step: int, last_step: int) -> bool:
        """Whether a periodic checkpoint is committed once ``step`` has completed."""
        if step == last_step or step in self.at_steps:
            return True
        return self.every_steps is not None and step % self.every_steps == 0

    def last_save_before(self, step: int, last_step: int) -> int | None:
        """The last step before ``step`` after which a checkpoint is committed (None: no
        save before it). Arithmetic, not a walk: ``step`` may be large."""
        found = [s for s in (last_step, *self.at_steps) if s < step]
        if self.every_steps is not None and step > self.every_steps:
            found.append((step - 1) // self.every_steps * self.every_steps)
        return max(found, default=None)


class ResizeSpec(_Section):
    """An elastic resize: the killed node is not replaced, and the leg continues on
    ``toNodes`` nodes with new ranks and a smaller world, resumed by resharding the newest
    checkpoint; with ``growAfterStep`` a new node joins once the checkpoint after that step
    is committed, and the leg continues at the full world from it.

    Every leg of a resize run (the reference leg too) defines its data and randomness
    globally: global step ``s`` consumes the same ``accumulationSteps x world size``
    microbatches at any world size, each drawn from (seed, global position), and a rank
    runs more microbatches per step in a smaller world. Bitwise equality is not expected
    after the resize (the reduction order changes with the world): the steps before it must
    be exact, the handoff (the state restored, gathered) and the data ledger exact, and the
    drift within ``comparison.tolerances``.
    """

    to_nodes: int = Field(ge=1, le=MAX_NODES,
                          description="nodes the leg continues on after the kill")
    grow_after_step: int | None = Field(
        default=None, ge=1, le=MAX_STEPS,
        description="grow back to world.nnodes once the checkpoint after this step is "
        "committed (none: the leg finishes at toNodes)")


class PreemptionSpec(_Section):
    """The cut point: before microbatch ``microstep`` of optimizer step ``step`` on ``rank``.

    microstep 0 cuts at an optimizer-step boundary; microstep > 0 cuts mid-accumulation,
    after that many microbatches have run backward. With ``at: checkpoint_commit`` the
    rank instead holds inside the commit protocol of the checkpoint saved after ``step``:
    its shards are written (with ``checkpoint.async``: handed to the background writer,
    finished or not), the commit has not happened.

    ``mode`` says how the armed worker dies: ``hard``, at once and saving nothing (SIGKILL;
    a SIGTERM, which a pod deletion sends first, is not handled either); ``graceful``, by
    SIGTERM, on which every rank commits an emergency checkpoint, with SIGKILL after
    ``grace_seconds``. ``target`` says what is killed: ``process``, the armed worker
    process dies inside its pod and torchrun restarts the group in place; ``pod``, the pod
    is deleted like a lost node and recreated (locally: the armed rank's node, its torchrun
    agent with every worker, dies and a new agent takes its place).
    """

    at: Literal["microbatch", "checkpoint_commit"] = Field(
        default="microbatch",
        description="microbatch: the rank holds before microbatch microstep of step; "
        "checkpoint_commit: inside the commit of the checkpoint saved after step (shards "
        "written, not committed; microstep 0).",
    )

    step: int = Field(default=6, ge=1, le=MAX_STEPS,
                      description="Optimizer step the cut lands in (1 to training.steps).")
    microstep: int = Field(
        default=1, ge=0, le=MAX_ACCUMULATION,
        description="Microbatch of that step the cut lands before: 0 at the optimizer-step "
        "boundary, 1 or more mid-accumulation (below training.accumulationSteps).",
    )
    rank: int = Field(default=1, ge=0, le=MAX_NODES * MAX_NPROC_PER_NODE,
                      description="Global rank that arms at the cut and is killed.")
    mode: Literal["hard", "graceful"] = Field(
        default="hard",
        description="hard: SIGKILL, nothing saved (SIGTERM is not handled either); graceful: "
        "SIGTERM, every rank commits an emergency checkpoint with its pending gradients, "
        "SIGKILL after graceSeconds.",
    )
    target: Literal["process", "pod"] = Field(
        default="process",
        description="process: the armed worker dies and torchrun restarts the group in place; "
        "pod: the armed rank's node dies (its pod is deleted; locally its torchrun agent and "
        "workers) and a new one takes its place.",
    )
    grace_seconds: float = Field(
        default=20.0, gt=0, le=MAX_SECONDS,
        description="graceful: how long the killed worker, or the deleted pod, may take to "
        "stop before SIGKILL.",
    )
    resize: ResizeSpec | None = Field(
        default=None,
        description="the killed node is not replaced: the leg continues at a smaller world "
        "size, and may grow back (target: pod, mode: hard)")


class TimeoutSpec(_Section):
    """Time limits in seconds: the process group's, each phase's (past one the run fails
    with reason Timeout) and that of an error that persists."""

    process_group_seconds: float = Field(
        default=120.0, gt=0, le=MAX_SECONDS,
        description="Timeout of each worker's process group (store, collectives, checkpoint "
        "barriers) and, with restartSeconds, of torchrun's rendezvous. Above armSeconds: the "
        "other ranks wait in a collective while the armed rank holds.",
    )
    arm_seconds: float = Field(default=60.0, gt=0, le=MAX_SECONDS,
                               description="cut reached -> killed")
    restart_seconds: float = Field(default=120.0, gt=0, le=MAX_SECONDS,
                                   description="killed -> resumed")
    leg_seconds: float = Field(default=900.0, gt=0, le=MAX_SECONDS, description="whole leg")
    backend_error_seconds: float = Field(
        default=300.0, gt=0, le=MAX_SECONDS,
        description="an API or store error that persists this long ends the run (Error)")
    build_seconds: float = Field(
        default=120.0, gt=0, le=MAX_SECONDS,
        description="Limit of the trial build resumequal validate and run make before "
        "anything launches (the factory imported and called once, on the CPU, in a process of "
        "its own); past it the spec is refused. The operator makes none: it cannot import "
        "the training image.")


class DDPSpec(_Section):
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


class ParallelismSpec(_Section):
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


class CompileSpec(_Section):
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


# Held equal whatever the tolerances.
_EXACT = of_kind("exact")


class ComparisonSpec(_Section):
    """How the legs' traces and final checkpoints are compared."""

    mode: Literal["exact", "tolerance"] = Field(
        default="exact",
        description="exact: every compared boundary bitwise equal; tolerance: boundaries with "
        f"a declared tolerance may differ within it ({', '.join(_EXACT[:-1])} and {_EXACT[-1]} "
        "stay exact).",
    )
    tolerances: dict[Boundary, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict,
        description="tolerance mode: max abs difference per boundary (finite, >= 0)",
    )
    boundaries: list[Boundary] = Field(
        default_factory=lambda: list(BOUNDARIES), max_length=4 * len(BOUNDARIES),
        description="Boundaries the comparator looks at (all by default). Fewer boundaries "
        "make it blind to some faults; the negative controls show which.",
    )

    @field_validator("boundaries")
    @classmethod
    def _some(cls, value: list[Boundary]) -> list[Boundary]:
        if not value:
            raise ValueError("at least one boundary must be compared")
        return [b for b in BOUNDARIES if b in value]

    @model_validator(mode="after")
    def _tolerances_need_mode(self) -> ComparisonSpec:
        if self.tolerances and self.mode != "tolerance":
            raise ValueError("tolerances are only used with mode: tolerance")
        return self


Scenario = Literal["boundary-hard", "boundary-graceful", "mid-hard", "mid-graceful"]
SCENARIOS: tuple[Scenario, ...] = ("boundary-hard", "boundary-graceful", "mid-hard", "mid-graceful")


class ControlsSpec(_Section):
    """Negative controls: deliberately broken resumes the comparator must catch."""

    enabled: bool = Field(
        default=True,
        description="Run the negative controls after the main legs; each must be detected "
        "(or shown not applicable), or the qualification is INVALID.",
    )
    omissions: list[Omission] = Field(
        default_factory=lambda: list(OMISSIONS), max_length=4 * len(OMISSIONS),
        description="Which broken resumes to run; each is a real preempted-and-restarted leg.",
    )

    @field_validator("omissions")
    @classmethod
    def _once_each(cls, value: list[Omission]) -> list[Omission]:
        # Each control is one leg, its folder named after it: one named twice runs once.
        return list(dict.fromkeys(value))


class MatrixSpec(_Section):
    """Repeat positive scenarios across seeds (a seed matrix); empty seeds: no matrix."""

    seeds: list[Annotated[int, Field(ge=0, le=MAX_SEED)]] = Field(
        default_factory=list, max_length=MAX_SEEDS,
        description="Each seed runs the scenarios with a control leg of its own (folder "
        "seed-N); empty: no matrix. resumequal run only: a QualificationRun refuses it.",
    )
    scenarios: list[Scenario] = Field(
        default_factory=lambda: list(SCENARIOS), max_length=len(SCENARIOS),
        description="boundary-*: cut at microstep 0 of preemption.step; mid-*: at "
        "preemption.microstep (1 if that is 0); hard or graceful kill.",
    )

    @field_validator("seeds", "scenarios")
    @classmethod
    def _distinct(cls, value: list[Any]) -> list[Any]:
        # A scenario or seed twice would run its legs twice under one name (its folder).
        repeated = sorted({str(v) for v in value if value.count(v) > 1})
        if repeated:
            raise ValueError(f"must be distinct; repeated: {', '.join(repeated)}")
        return value


class SpecSections(_Section):
    """The sections of a qualification, spelled once: a spec file (:class:`QualificationSpec`)
    and a QualificationRun's spec (the operator's model) are both made of them."""

    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    world: WorldSpec = Field(default_factory=WorldSpec)
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    preemption: PreemptionSpec = Field(default_factory=PreemptionSpec)
    timeouts: TimeoutSpec = Field(default_factory=TimeoutSpec)
    ddp: DDPSpec = Field(default_factory=DDPSpec)
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    compile: CompileSpec = Field(default_factory=CompileSpec)
    comparison: ComparisonSpec = Field(default_factory=ComparisonSpec)
    controls: ControlsSpec = Field(default_factory=ControlsSpec)
    matrix: MatrixSpec = Field(default_factory=MatrixSpec)


class QualificationSpec(SpecSections):
    """A whole qualification: what trains, where it is cut, and how legs are compared."""

    zoom: Literal["never", "onFail"] = Field(
        default="never",
        description="onFail: when the verdict is FAIL, replay the first divergent step of "
        "both legs with every module hooked (resumequal zoom) and add zoom.json and a zoom "
        "section to the report",
    )

    @model_validator(mode="after")
    def _consistent(self) -> QualificationSpec:
        t, p = self.training, self.preemption
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
            if not self.checkpoint.saves_after(p.step, t.steps):
                raise ValueError(
                    f"preemption.at=checkpoint_commit: no checkpoint is saved after step "
                    f"{p.step}; add it to checkpoint.atSteps"
                )
        if (
            self.checkpoint.async_save
            and p.mode == "hard"
            and p.at == "microbatch"
            and p.step > 1
            and self.checkpoint.saves_after(p.step - 1, t.steps)
        ):
            raise ValueError(
                f"preemption.step={p.step} with checkpoint.async: the checkpoint saved after "
                f"step {p.step - 1} is still being written in the background during step "
                f"{p.step}, so whether a hard kill there resumes from it depends on timing; "
                "cut at least two steps after a save"
            )
        if p.rank >= self.world.world_size:
            raise ValueError(
                f"preemption.rank={p.rank} does not exist in a world of {self.world.world_size}"
            )
        if p.mode == "hard" and self.checkpoint.last_save_before(p.step, t.steps) is None:
            raise ValueError(
                f"preemption.step={p.step}: a hard kill there lands before the first committed "
                "checkpoint, so the restart would not be a resume; set checkpoint.everySteps "
                "or checkpoint.atSteps to a step before it"
            )
        if self.parallelism.kind == "fsdp2":
            self._check_fsdp2()
        if p.resize is not None:
            self._check_resize(p.resize)
        if self.timeouts.arm_seconds >= self.timeouts.process_group_seconds:
            raise ValueError(
                "timeouts.armSeconds must be < timeouts.processGroupSeconds: the other ranks "
                "wait in a collective while the armed rank holds"
            )
        return self

    def _check_fsdp2(self) -> None:
        defaults = DDPSpec()
        for name, field in DDPSpec.model_fields.items():
            if getattr(self.ddp, name) != getattr(defaults, name):
                raise ValueError(
                    f"ddp.{field.alias} is set but parallelism.kind is fsdp2: it is a "
                    "DistributedDataParallel setting (FSDP2 reduce-scatters per fully_shard "
                    "block and has no buckets to size or reducer to prime); remove it")

    def _check_resize(self, resize: ResizeSpec) -> None:
        p, t, w = self.preemption, self.training, self.world
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
            if not self.checkpoint.saves_after(grow, t.steps):
                raise ValueError(
                    f"{where}.growAfterStep={grow}: no checkpoint is saved after step {grow}, "
                    "which the grown world resumes from; add it to checkpoint.atSteps")
        c = self.comparison
        missing = [b for b in ("loss", "grad_norm", "params") if b not in c.tolerances]
        if c.mode != "tolerance" or missing:
            raise ValueError(
                f"{where} needs comparison.mode: tolerance with tolerances for loss, grad_norm "
                "and params: after a resize the reduction order differs, so those drift"
                + (f" (missing: {', '.join(missing)})" if c.mode == "tolerance" else ""))
        if self.workload.loader is not None:
            raise ValueError(
                f"{where}: workload.loader shards its samples per rank; a resize needs the "
                "samples of each global step defined globally (remove workload.loader)")
        if self.matrix.seeds:
            raise ValueError(f"{where}: a seed matrix runs other cuts and kill modes; remove "
                             "matrix.seeds")

    @property
    def global_microbatches(self) -> int:
        """Microbatches of one optimizer step over all ranks, whatever the world size."""
        return self.training.accumulation_steps * self.world.world_size

    def digest(self) -> str:
        """A stable sha256 of what decides the numerics of training, tying a run directory
        to one experiment. Where a leg is cut, how legs are compared, timeouts, controls and
        the matrix are left out: the legs of one run differ in exactly those."""
        data = self.model_dump(mode="json", include=set(_TRAINING_SECTIONS))
        if self.training.fp32_defaults():
            # Digests of fp32 specs stay what they were before precision was a field, so
            # run folders made then still belong to their spec.
            for key in ("precision", "gradScaler"):
                del data["training"][key]
        if self.parallelism == ParallelismSpec():
            del data["parallelism"]  # likewise for specs from before parallelism
        if self.compile == CompileSpec():
            del data["compile"]  # likewise for specs from before compile
        if data["workload"].get("loader") is None:
            del data["workload"]["loader"]  # likewise for specs from before workload.loader
        if self.world.launcher == DEFAULT_LAUNCHER:
            del data["world"]["launcher"]  # likewise for specs from before world.launcher
        if self.preemption.resize is not None:
            # Every leg of a resize run draws its data globally, the reference leg too.
            data["data"] = "global"
        canonical = json.dumps(data, sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def with_preemption(self, **changes: Any) -> QualificationSpec:
        """This spec with another cut (validated like any spec)."""
        data = self.model_dump(mode="json")
        data["preemption"].update(
            {PreemptionSpec.model_fields[k].alias or k: v for k, v in changes.items()})
        return parse_spec(data, source="scenario")


def _step(tp: Any, part: int | str) -> tuple[int | str, Any]:
    """One step down a model's type along an error or ``--set`` path: ``part`` as it is
    written (a field's camelCase alias, whichever spelling was read) and the type below it."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, UnionType):
        options = [a for a in get_args(tp) if a is not type(None)]
        tp = options[0] if len(options) == 1 else None
    if isinstance(tp, type) and issubclass(tp, BaseModel) and isinstance(part, str):
        for name, field in tp.model_fields.items():
            if part in (name, field.alias):
                return field.alias or name, field.annotation
        return part, None
    if get_origin(tp) in (list, tuple) and isinstance(part, int):
        return part, get_args(tp)[0]
    if get_origin(tp) is dict:
        return part, get_args(tp)[1]
    return part, None


def error_lines(err: ValidationError, model: type[BaseModel]) -> list[tuple[str, str]]:
    """(field path, message) for each error of validating ``model``. Paths name fields in
    camelCase whichever spelling was read; an unknown field's message lists the allowed ones."""
    out = []
    for e in err.errors():
        tp: Any = model
        parent: Any = model
        parts: list[str] = []
        for i, part in enumerate(e["loc"]):
            parent = tp
            key, tp = _step(tp, part)
            if e["type"] == "extra_forbidden" and i == len(e["loc"]) - 1:
                key = part  # the unknown key, as written
            parts.append(str(key))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = _unknown_field(parent, str(e["loc"][-1]) if e["loc"] else "")
        out.append((".".join(parts), msg))
    return out


def _unknown_field(parent: Any, key: str) -> str:
    if not (isinstance(parent, type) and issubclass(parent, BaseModel)):
        return "unknown field"
    field = parent.model_fields.get(key)
    if field is not None and field.alias and field.alias != key:
        # A Python name is read unless its alias is there too: the field came twice.
        return f"given twice, as {field.alias} and {key}"
    allowed = sorted(f.alias or name for name, f in parent.model_fields.items())
    return f"unknown field; allowed: {', '.join(allowed)}"


def format_validation_error(err: ValidationError, source: str,
                            model: type[BaseModel] | None = None) -> str:
    """Render pydantic errors of validating ``model`` (a QualificationSpec by default) as
    'source: field.path: message' lines."""
    return "\n".join(f"{source}: {path or '<top level>'}: {msg}"
                     for path, msg in error_lines(err, model or QualificationSpec))


def parse_spec(data: Any, source: str = "spec") -> QualificationSpec:
    """Validate a mapping into a spec, raising SpecError that names every bad field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the spec must be a mapping, got {type(data).__name__}")
    try:
        return QualificationSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from e


def load_spec(path: str | Path) -> QualificationSpec:
    """Load a spec from a YAML or JSON file (read through :mod:`resumequal.yamlread`)."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_CHARS + 1)
    except FileNotFoundError as e:
        raise SpecError(f"spec file not found: {p}") from e
    except OSError as e:
        raise SpecError(f"cannot read spec file {p}: {e.strerror}") from e
    return spec_from_text(raw, source=str(p))


def spec_from_text(raw: bytes | str, source: str = "spec") -> QualificationSpec:
    """Validate the YAML or JSON text of a spec; SpecError names the source and field."""
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
        data = load_yaml(text)
    except UnicodeDecodeError as e:
        raise SpecError(f"{source}: not valid YAML/JSON: {e}") from e
    except YAMLInputError as e:
        raise SpecError(f"{source}: {e}") from e
    return parse_spec(data, source=source)


def apply_overrides(
    spec: QualificationSpec, overrides: tuple[str, ...] | list[str]
) -> QualificationSpec:
    """Apply ``path.to.field=value`` overrides (values parsed as YAML) and revalidate."""
    data = spec.model_dump(mode="json")
    for item in overrides:
        path, sep, raw = item.partition("=")
        if not sep or not path:
            raise SpecError(f"--set {item!r}: expected PATH=VALUE, e.g. preemption.step=6")
        try:
            value = load_yaml(raw)
        except YAMLInputError as e:
            raise SpecError(f"--set {item!r}: {e}") from e
        node: Any = data
        tp: Any = QualificationSpec
        # Either spelling of a field sets the key the dump wrote (its camelCase alias).
        keys = []
        for part in path.split("."):
            key, tp = _step(tp, part)
            keys.append(str(key))
        for key in keys[:-1]:
            if not isinstance(node, dict):
                raise SpecError(f"--set {item!r}: {key!r} is not a section")
            if node.get(key) is None:  # an optional section not set yet (workload.loader)
                node[key] = {}
            node = node[key]
        if not isinstance(node, dict):
            raise SpecError(f"--set {item!r}: {keys[-2]!r} is not a section")
        node[keys[-1]] = value
    return parse_spec(data, source="--set")
