"""Per-step, per-rank trace records, and reading and writing them as JSON lines.

Every worker appends JSON lines to its own trace (a :class:`TraceSink`): one
``InventoryRecord`` when it starts, a ``RestoreRecord`` when it resumes, an ``ArmRecord``
when it reaches the cut, a ``SavedRecord`` when it saves in the middle of a step, one
``StepRecord`` per optimizer step holding a digest or exact value for every boundary of
:data:`resumequal.spec.boundaries.TABLE`, and, under compile.enabled, a ``CompiledRecord`` after
each step during which something compiled. The comparator reads two legs' traces and walks
the boundaries in order.

This module is pure data and files: it imports no torch or numpy (the comparator's report
assembly and the operator read traces), and nothing of ours but the spec, the boundaries
and the errors. The digests are computed in :mod:`resumequal.trace.digest`, the inventory
collected in :mod:`resumequal.trace.inventory`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Final, Literal, Protocol, TypedDict

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from resumequal.built import BuiltOptimizer
from resumequal.errors import TraceError
from resumequal.spec import Omission
from resumequal.spec.boundaries import BOUNDARIES, BY_NAME, TABLE, Boundary
from resumequal.spec.sections import DigestAlgorithm

# What a trace that names no digest algorithm was digested with: every trace written before
# there was a choice.
DIGEST_ALGORITHM: Final[DigestAlgorithm] = "xxh3_128"

logger = logging.getLogger(__name__)

__all__ = [
    "BOUNDARY_FIELDS",
    "ArmRecord",
    "AutotuneChoice",
    "BucketRecord",
    "CompiledRecord",
    "InventoryRecord",
    "LossScaleRecord",
    "MicrostepPartial",
    "MicrostepRecord",
    "RestoreRecord",
    "SavedRecord",
    "StartupRecord",
    "StepPartial",
    "StepRecord",
    "TensorDigests",
    "TraceRecord",
    "TraceSink",
    "TraceWriter",
    "boundary_value",
    "effective_steps",
    "parse_records",
    "read_trace",
    "records_in",
]

# --------------------------------------------------------------------------- records


class _Record(BaseModel):
    # NaN/inf losses or norms are legitimate observations; "strings" keeps each line strict
    # JSON ("NaN", "Infinity") and validates back to the same float.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class MicrostepRecord(_Record):
    """One microbatch of an accumulation window."""

    index: int = Field(description="microbatch index within the accumulation window")
    # Resize runs only: which of the step's microbatches over all ranks this one was.
    global_index: int | None = Field(
        default=None, description="the microbatch's index within its global step")
    sample_ids: list[int]
    loss: float = Field(description="this microbatch's unscaled loss, exactly (loss.item())")


class LossScaleRecord(_Record):
    """The fp16 GradScaler's state an optimizer step ran with."""

    scale: float = Field(description="the factor this step's loss was multiplied by")
    growth_tracker: int = Field(description="finite steps in a row since the scale last "
                                "changed (the scale grows when it reaches growthInterval)")


class BucketRecord(_Record):
    """One gradient-reduction bucket, parameters in bucket order."""

    index: int
    params: list[str]
    numel: int




class MicrostepPartial(TypedDict):
    """A finished microbatch of a step in progress: a :class:`MicrostepRecord` as plain data."""

    index: int
    global_index: int | None
    sample_ids: list[int]
    loss: float


class StepPartial(TypedDict):
    """A step in progress: what its :class:`StepRecord` takes from before the optimizer step.

    Plain data, not a model: a checkpoint taken mid-step saves it with the rank state, and
    the resumed rank finishes the step and its record from it.
    """

    rng: dict[str, str]
    started_at: float
    microsteps: list[MicrostepPartial]


class TensorDigests(_Record):
    """Per-tensor digests of one step's tensor boundaries: tensor name -> digest (bare hex,
    ``none`` for a missing tensor), in the model's parameter order. The whole-boundary
    digests of the step record are derived from these."""

    local_grads: dict[str, str] = Field(
        default_factory=dict, description="by parameter (ddp) or reduce-scatter group (fsdp2)")
    reduced_grads: dict[str, str] = Field(default_factory=dict)
    clipped_grads: dict[str, str] = Field(default_factory=dict)
    params: dict[str, str] = Field(default_factory=dict, description="parameters and buffers")
    optimizer_state: dict[str, str] = Field(
        default_factory=dict, description="by parameter, and param_groups' hyperparameters")


class _RankRecord(_Record):
    """A record one rank's worker writes: its kind (each record narrows it to its tag;
    declared here so that it stays first on every line), its rank and restart attempt."""

    kind: str
    rank: int
    attempt: int


class StepRecord(_RankRecord):
    """What one rank did in one optimizer step, boundary by boundary."""

    kind: Literal["step"] = "step"
    attempt: int = Field(description="TORCHELASTIC_RESTART_COUNT of the writing process")
    step: int = Field(ge=1, description="1-based optimizer step")
    microsteps: list[MicrostepRecord]
    rng: dict[str, str] = Field(description="rng_digests() at step start")
    # Optional: traces written before precision existed, and steps without a scaler, have none.
    loss_scale: LossScaleRecord | None = Field(
        default=None, description="the GradScaler's state at step start (precision fp16)")
    local_grads: str = Field(description="rank-local accumulated gradients before reduction")
    # None and empty where there are no buckets (parallelism fsdp2: fixed reduce-scatter
    # groups, no bucket layout); traces written before fsdp2 always have them.
    bucket_layout: str | None = Field(default=None, description="DDP's bucket layout")
    buckets: list[BucketRecord] = Field(default_factory=list)
    reduced_grads: str
    grad_norm: float = Field(description="total gradient norm before clipping")
    # None in traces written before the boundary existed.
    clipped_grads: str | None = Field(
        default=None, description="gradients after clipping, as the optimizer takes them")
    lr: list[float] = Field(description="lr of each param group used by this step's update")
    params: str = Field(description="parameters and buffers after the optimizer step")
    optimizer_state: str
    started_at: float
    finished_at: float
    # None in traces written before resizes existed.
    world_size: int | None = Field(default=None, description="ranks this step ran on")
    handoff: str | None = Field(
        default=None, description="resize runs, after a step whose checkpoint is saved: "
        "digest of the whole training state gathered over the ranks (world-size free)")
    tensors: TensorDigests | None = Field(
        default=None, description="per-tensor digests (None in older traces)")


class CompileRecord(_Record):
    """``torch.compile`` in a worker (compile.enabled): its settings and inductor's cache."""

    mode: str
    cache: str = Field(description="compile.cache: shared, per-rank or fresh")
    cache_dir: str = Field(description="TORCHINDUCTOR_CACHE_DIR of this process")
    warm: bool = Field(description="the cache folder held files when this process started")


class AutotuneChoice(_Record):
    """One kernel inductor's autotuner picked (max-autotune) for one op and its inputs."""

    op: str = Field(description="the op autotuned, as inductor names it (mm, addmm, ...)")
    inputs: list[str] = Field(description="the sizes of its inputs")
    choice: str = Field(description="the winning kernel")


class CompiledRecord(_RankRecord):
    """What ``torch.compile`` did in this process up to a step: time spent compiling, what
    came from inductor's caches and what its autotuner chose (where inductor exposes it)."""

    kind: Literal["compiled"] = "compiled"
    step: int = Field(description="the step that ended when this was collected: what "
                                  "compiled since the previous step (a reducer prime's too)")
    graphs: int = Field(description="forward and backward graphs compiled (or loaded)")
    seconds: float = Field(description="wall seconds dynamo, AOTAutograd and inductor took")
    fx_cache_hits: int
    fx_cache_misses: int
    autograd_cache_hits: int
    autograd_cache_misses: int
    autotuned: list[AutotuneChoice] = Field(
        default_factory=list,
        description="kernels chosen by benchmarking; none where nothing was autotuned, or "
                    "the graph came from the cache with its choices baked in")


class InventoryRecord(_Record):
    """The runtime a worker trains in: versions, numerics flags and relevant env vars."""

    kind: Literal["inventory"] = "inventory"
    rank: int
    attempt: int
    pid: int
    host: str
    python: str
    torch: str
    cuda: str | None
    cudnn: int | None
    nccl: str | None
    gloo: bool
    numpy: str
    platform: str
    num_threads: int
    deterministic_algorithms: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    # TF32 settings change matmul/conv numerics on CUDA without touching any checkpoint.
    float32_matmul_precision: str
    cudnn_allow_tf32: bool
    env: dict[str, str]
    # None where the model runs eagerly, and in traces written before compile existed.
    compile: CompileRecord | None = None
    # How this process was started: a fresh interpreter (torchrun) or forked from a warm
    # one (the forked launcher).
    launcher: Literal["torchrun", "forked"] = Field(
        default="torchrun", description="how this worker process was started")
    # Traces written before wsum128 existed name none: they were digested with xxh3_128.
    digest: DigestAlgorithm = Field(
        default=DIGEST_ALGORITHM, description="the algorithm every digest of this trace was "
        "made with; both legs must use the same")
    # None in traces written before it was recorded.
    built: BuiltOptimizer | None = Field(
        default=None, description="the optimizer and scheduler the workload built, before "
        "the first step or restore")

    def comparable(self) -> dict[str, Any]:
        """The fields two legs must agree on: drops pid, host, rank and attempt, where
        inductor's cache is and whether it was warm (a resumed process may find the folder
        the first one filled; a fresh cache differs in every process), and what the workload
        built (what the report shows; its numerics are the boundaries' to judge)."""
        return self.model_dump(exclude={"pid": True, "host": True, "rank": True,
                                        "attempt": True, "built": True,
                                        "compile": {"cache_dir", "warm"}})


class RestoreRecord(_RankRecord):
    """A resume: which checkpoint was loaded and where training picks up."""

    kind: Literal["restore"] = "restore"
    checkpoint: str
    step: int = Field(description="optimizer steps completed in the checkpoint")
    microstep: int = Field(description="microbatches of the next step already done")
    global_microstep: int
    omitted: list[Omission] = Field(description="state deliberately not restored")
    restored_at: float
    params: str | None = Field(
        default=None, description="digest of parameters and buffers right after the restore"
    )
    optimizer_state: str | None = Field(
        default=None, description="digest of the optimizer state right after the restore"
    )
    world_size: int | None = Field(default=None, description="ranks of the restoring world")
    saved_world_size: int | None = Field(
        default=None, description="ranks of the world that saved the checkpoint")
    handoff: str | None = Field(
        default=None, description="resize runs: digest of the whole training state "
        "restored, gathered over the ranks (as StepRecord.handoff)")
    # What names the checkpoint beyond its folder's name: a restore is judged by what its
    # authenticated manifest says it is. None in traces written before they were recorded.
    run: str | None = Field(default=None, description="the run its manifest names")
    leg: str | None = Field(default=None, description="the leg its manifest names")
    manifest: str | None = Field(
        default=None, description="sha256 of its authenticated manifest: the same on every "
        "rank that restored the same checkpoint")
    tensors: TensorDigests | None = Field(
        default=None, description="per-tensor digests right after the restore (params and "
        "optimizer_state only), as the step records keep them")
    buffers: list[str] = Field(
        default_factory=list, description="which names of tensors.params are buffers")
    unsaved: list[str] = Field(
        default_factory=list, description="buffers the model's state_dict leaves out "
        "(non-persistent): rebuilt by the workload, never restored")


class SavedRecord(_RankRecord):
    """What a rank put into a checkpoint taken in the middle of a step (a graceful stop's):
    the state a restore of it must give back. A checkpoint taken after a step holds what
    that step's record says."""

    kind: Literal["saved"] = "saved"
    checkpoint: str
    params: str = Field(description="digest of parameters and buffers as saved")
    optimizer_state: str
    tensors: TensorDigests = Field(description="per-tensor digests (params, optimizer_state)")


class ArmRecord(_RankRecord):
    """The target rank reached the cut point and is waiting to be killed."""

    kind: Literal["arm"] = "arm"
    step: int
    microstep: int
    pid: int
    armed_at: float


class StartupRecord(_RankRecord):
    """When this worker process started and when it had joined its process group."""

    kind: Literal["startup"] = "startup"
    pid: int
    process_started_at: float = Field(description="process creation time (from /proc)")
    group_joined_at: float
    built_at: float = Field(description="workload built and wrapped in DDP")


TraceRecord = Annotated[
    StepRecord | InventoryRecord | RestoreRecord | ArmRecord | StartupRecord
    | CompiledRecord | SavedRecord,
    Field(discriminator="kind"),
]
_RECORD_ADAPTER: TypeAdapter[TraceRecord] = TypeAdapter(TraceRecord)


# --------------------------------------------------------------------------- boundaries

# Boundary -> the StepRecord field its value is read from.
BOUNDARY_FIELDS: Final[Mapping[Boundary, str]] = MappingProxyType(
    {b.name: b.field for b in TABLE})


def boundary_value(record: StepRecord, boundary: Boundary) -> object:
    """What the comparator compares at ``boundary`` for one step record."""
    info = BY_NAME.get(boundary)
    if info is None:
        raise ValueError(f"unknown boundary {boundary!r}; allowed: {', '.join(BOUNDARIES)}")
    value: object = getattr(record, info.field)
    if info.item is not None:
        assert isinstance(value, list)
        return [getattr(m, info.item) for m in value]
    if isinstance(value, BaseModel):
        return value.model_dump()
    return value


# --------------------------------------------------------------------------- files


class TraceSink(Protocol):
    """Where a trace's lines go (see :mod:`resumequal.store.log`): a file or segment objects."""

    def append(self, line: bytes) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class TraceWriter:
    """Writes trace records, one JSON object per line, to a :class:`TraceSink`."""

    def __init__(self, sink: TraceSink) -> None:
        self._sink = sink

    def write(self, record: TraceRecord) -> None:
        """Append one record and hand it to the sink before returning."""
        self._sink.append(record.model_dump_json().encode() + b"\n")
        # What the backend acts on (arming, a restore) must be visible at once, even when
        # the sink groups step records.
        if not isinstance(record, StepRecord):
            self._sink.flush()

    def close(self) -> None:
        """Flush and close the sink; further writes raise ValueError."""
        self._sink.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"])
    return f"{loc}: {e['msg']}" if loc else e["msg"]


def _lines(data: bytes) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, line, terminated) for each line of ``data``."""
    lines = data.split(b"\n")
    tail = lines.pop()  # empty when the file ends with a newline
    for number, line in enumerate(lines, start=1):
        yield number, line, True
    if tail:
        yield len(lines) + 1, tail, False


def read_trace(path: str | os.PathLike[str]) -> list[TraceRecord]:
    """All records of a trace file; a partial last line (writer killed mid-line) is dropped."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise TraceError(f"cannot read trace {p}: {e.strerror}") from e
    records: list[TraceRecord] = []
    for number, line, terminated in _lines(data):
        try:
            records.append(_RECORD_ADAPTER.validate_json(line))
        except ValidationError as e:
            if not terminated:
                # A line cut off mid-write never parses (the closing brace comes last).
                logger.warning("%s:%d: dropping a partial last line", p, number)
                break
            raise TraceError(f"{p}:{number}: not a trace record: {_first_error(e)}") from e
    return records


def parse_records(lines: Iterable[bytes], where: str) -> list[TraceRecord]:
    """The records of whole trace lines (a verified trace read from its run location);
    TraceError naming ``where`` and the line for one that is not a trace record."""
    records: list[TraceRecord] = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(_RECORD_ADAPTER.validate_json(line))
        except ValidationError as e:
            raise TraceError(f"{where}:{number}: not a trace record: {_first_error(e)}") from e
    return records


def records_in(lines: Iterable[bytes]) -> list[TraceRecord]:
    """The lines that are trace records, in order, leaving out any other (what a poller of
    a trace still being written takes; the comparator reads strictly: :func:`parse_records`)."""
    records: list[TraceRecord] = []
    for line in lines:
        try:
            records.append(_RECORD_ADAPTER.validate_json(line))
        except ValidationError:
            continue
    return records


def effective_steps(records: Iterable[TraceRecord], rank: int) -> dict[int, StepRecord]:
    """Step -> the last record of that step for ``rank``: what the leg finally did."""
    steps: dict[int, StepRecord] = {}
    for record in records:
        if isinstance(record, StepRecord) and record.rank == rank:
            steps[record.step] = record
    return dict(sorted(steps.items()))

