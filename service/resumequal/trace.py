"""Per-step, per-rank trace records, exact digests, and the runtime inventory.

Every worker appends JSON lines to its own trace (a :class:`TraceSink`): one
``InventoryRecord`` when it starts, a ``RestoreRecord`` when it resumes, an ``ArmRecord``
when it reaches the cut, and one ``StepRecord`` per optimizer step holding a digest or
exact value for every boundary of ``resumequal.spec.BOUNDARIES``. The comparator reads
two legs' traces and walks the boundaries in order.

Digests are bitwise: they cover dtype, shape and the raw bytes of each tensor, so ``-0.0``
and ``0.0`` (or two NaN payloads) differ, while a non-contiguous view and its contiguous
copy agree. The hash is xxh3-128, chosen by measurement (``bench/trace_overhead.py
--hashes``): it runs at memory speed, so per-step digests of a whole model and optimizer
cost little next to the step itself, and each digest string names its algorithm.

This module runs inside workers but must not import ``train``, ``state`` or
``checkpoint``: it only observes what they hand it.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import random
import socket
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Annotated, Any, Final, Literal, Protocol

import numpy as np
import torch
import xxhash
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from resumequal.errors import TraceError
from resumequal.spec import BOUNDARIES, Omission

logger = logging.getLogger(__name__)

DIGEST_ALGORITHM: Final = "xxh3_128"

__all__ = [
    "BOUNDARY_FIELDS",
    "DIGEST_ALGORITHM",
    "ArmRecord",
    "BucketRecord",
    "InventoryRecord",
    "MicrostepRecord",
    "RestoreRecord",
    "StepRecord",
    "TraceRecord",
    "TraceSink",
    "TraceWriter",
    "boundary_value",
    "bucket_layout_digest",
    "collect_inventory",
    "effective_steps",
    "named_tensors_digest",
    "optimizer_state_digest",
    "read_trace",
    "relevant_env",
    "rng_digests",
    "tensor_digest",
]


# --------------------------------------------------------------------------- digests

# Every item fed to the hasher is tagged and length-prefixed, so no two different
# sequences of (name, tensor, value) can produce the same byte stream.
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _feed_bytes(h: xxhash.xxh3_128, tag: bytes, data: bytes) -> None:
    h.update(tag + _U64.pack(len(data)))
    h.update(data)


# dtypes whose tensors .numpy() can view directly; others are viewed as raw uint8 first.
_NUMPY_DTYPES: Final = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    }
)


@functools.lru_cache(maxsize=4096)
def _tensor_prefix(dtype: torch.dtype, shape: torch.Size, nbytes: int) -> bytes:
    header = f"{dtype}|{tuple(shape)}".encode()
    return b"T" + _U64.pack(len(header)) + header + b"B" + _U64.pack(nbytes)


def _feed_tensor(h: xxhash.xxh3_128, t: torch.Tensor) -> None:
    # Per-tensor Python overhead, not hashing, dominates for models of many small tensors,
    # so this path keeps the number of torch calls low.
    t = t.detach()
    # Lazy conjugate/negative views keep a flag instead of rewriting memory; resolve them
    # so the digest sees the values the tensor stands for.
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    t = t.contiguous().cpu()
    h.update(_tensor_prefix(t.dtype, t.shape, t.nbytes))
    # Zero-copy: the ndarray shares the tensor's memory and exports it as a buffer.
    if t.dtype in _NUMPY_DTYPES:
        h.update(t.numpy().data)
    else:
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)


def _feed_value(h: xxhash.xxh3_128, value: object) -> None:
    """Feed tensors by bytes, containers structurally, anything else by its repr."""
    if isinstance(value, torch.Tensor):
        _feed_tensor(h, value)
    elif isinstance(value, np.ndarray):
        _feed_bytes(h, b"A", f"{value.dtype.str}|{value.shape}|{value.nbytes}".encode())
        h.update(np.ascontiguousarray(value).data)
    elif isinstance(value, Mapping):
        h.update(b"D" + _U32.pack(len(value)))
        for key in sorted(value, key=repr):
            _feed_bytes(h, b"K", repr(key).encode())
            _feed_value(h, value[key])
    elif isinstance(value, list | tuple):
        h.update(b"L" + _U32.pack(len(value)))
        for item in value:
            _feed_value(h, item)
    else:
        # repr of a float is its shortest exact round-trip form, so this stays bitwise.
        _feed_bytes(h, b"R", repr(value).encode())


def _finish(h: xxhash.xxh3_128) -> str:
    return f"{DIGEST_ALGORITHM}:{h.hexdigest()}"


def tensor_digest(t: torch.Tensor) -> str:
    """Digest of one tensor's dtype, shape and raw bytes."""
    h = xxhash.xxh3_128()
    _feed_tensor(h, t)
    return _finish(h)


def named_tensors_digest(items: Iterable[tuple[str, torch.Tensor | None]]) -> str:
    """Digest of named tensors in the given order; ``None`` (e.g. a param without grad) counts."""
    h = xxhash.xxh3_128()
    for name, t in items:
        _feed_bytes(h, b"N", name.encode())
        if t is None:
            h.update(b"0")
        else:
            _feed_tensor(h, t)
    return _finish(h)


_NOT_OPTIMIZER_STATE = frozenset({"params", "lr", "initial_lr"})


def optimizer_state_digest(optimizer: torch.optim.Optimizer) -> str:
    """Digest of the optimizer's per-parameter state and its param-group hyperparameters.

    The learning rate is left out: the scheduler rewrites it after every step, and it is a
    boundary of its own (the lr each update used), so a wrong schedule shows up as "lr".
    """
    sd = optimizer.state_dict()
    h = xxhash.xxh3_128()
    state: dict[int, dict[str, Any]] = sd["state"]
    h.update(b"S" + _U32.pack(len(state)))
    for index in sorted(state):
        _feed_bytes(h, b"P", str(index).encode())
        _feed_value(h, state[index])
    groups: list[dict[str, Any]] = sd["param_groups"]
    h.update(b"G" + _U32.pack(len(groups)))
    for group in groups:
        _feed_value(h, {k: v for k, v in group.items() if k not in _NOT_OPTIMIZER_STATE})
    return _finish(h)


def rng_digests() -> dict[str, str]:
    """Digests of the global RNG states: python, numpy, torch, and cuda:N once CUDA is up."""
    out: dict[str, str] = {}

    version, words, gauss_next = random.getstate()
    h = xxhash.xxh3_128()
    _feed_bytes(h, b"R", repr((version, gauss_next)).encode())
    _feed_bytes(h, b"W", struct.pack(f"<{len(words)}I", *words))
    out["python"] = _finish(h)

    h = xxhash.xxh3_128()
    _feed_value(h, np.random.get_state())
    out["numpy"] = _finish(h)

    out["torch"] = tensor_digest(torch.get_rng_state())

    # Asking for CUDA states before CUDA is initialised would initialise it; a worker that
    # never touched CUDA has no CUDA randomness to compare.
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        for device in range(torch.cuda.device_count()):
            out[f"cuda:{device}"] = tensor_digest(torch.cuda.get_rng_state(device))
    return out


# --------------------------------------------------------------------------- records


class _Record(BaseModel):
    # NaN/inf losses or norms are legitimate observations; "strings" keeps each line strict
    # JSON ("NaN", "Infinity") and validates back to the same float.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class MicrostepRecord(_Record):
    """One microbatch of an accumulation window."""

    index: int = Field(description="microbatch index within the accumulation window")
    sample_ids: list[int]
    loss: float = Field(description="this microbatch's unscaled loss, exactly (loss.item())")


class BucketRecord(_Record):
    """One gradient-reduction bucket, parameters in bucket order."""

    index: int
    params: list[str]
    numel: int


def bucket_layout_digest(buckets: Iterable[BucketRecord]) -> str:
    """Digest of an ordered bucket layout (bucket order, parameter order, sizes)."""
    h = xxhash.xxh3_128()
    for bucket in buckets:
        _feed_value(h, (bucket.index, bucket.numel, bucket.params))
    return _finish(h)


class StepRecord(_Record):
    """What one rank did in one optimizer step, boundary by boundary."""

    kind: Literal["step"] = "step"
    rank: int
    attempt: int = Field(description="TORCHELASTIC_RESTART_COUNT of the writing process")
    step: int = Field(ge=1, description="1-based optimizer step")
    microsteps: list[MicrostepRecord]
    rng: dict[str, str] = Field(description="rng_digests() at step start")
    local_grads: str = Field(description="rank-local accumulated gradients before reduction")
    bucket_layout: str
    buckets: list[BucketRecord]
    reduced_grads: str
    grad_norm: float = Field(description="total gradient norm before clipping")
    lr: list[float] = Field(description="lr of each param group used by this step's update")
    params: str = Field(description="parameters and buffers after the optimizer step")
    optimizer_state: str
    started_at: float
    finished_at: float


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

    def comparable(self) -> dict[str, Any]:
        """The fields two legs must agree on (drops pid, host, rank and attempt)."""
        return self.model_dump(exclude={"pid", "host", "rank", "attempt"})


class RestoreRecord(_Record):
    """A resume: which checkpoint was loaded and where training picks up."""

    kind: Literal["restore"] = "restore"
    rank: int
    attempt: int
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


class ArmRecord(_Record):
    """The target rank reached the cut point and is waiting to be killed."""

    kind: Literal["arm"] = "arm"
    rank: int
    attempt: int
    step: int
    microstep: int
    pid: int
    armed_at: float


class StartupRecord(_Record):
    """When this worker process started and when it had joined its process group."""

    kind: Literal["startup"] = "startup"
    rank: int
    attempt: int
    pid: int
    process_started_at: float = Field(description="process creation time (from /proc)")
    group_joined_at: float
    built_at: float = Field(description="workload built and wrapped in DDP")


TraceRecord = Annotated[
    StepRecord | InventoryRecord | RestoreRecord | ArmRecord | StartupRecord,
    Field(discriminator="kind"),
]
_RECORD_ADAPTER: TypeAdapter[TraceRecord] = TypeAdapter(TraceRecord)


# --------------------------------------------------------------------------- boundaries

BOUNDARY_FIELDS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "inputs": "microsteps",
        "rng": "rng",
        "loss": "microsteps",
        "local_grads": "local_grads",
        "bucket_layout": "bucket_layout",
        "reduced_grads": "reduced_grads",
        "grad_norm": "grad_norm",
        "lr": "lr",
        "params": "params",
        "optimizer_state": "optimizer_state",
    }
)


def boundary_value(record: StepRecord, boundary: str) -> object:
    """What the comparator compares at ``boundary`` for one step record."""
    if boundary == "inputs":
        return [m.sample_ids for m in record.microsteps]
    if boundary == "loss":
        return [m.loss for m in record.microsteps]
    if boundary not in BOUNDARY_FIELDS:
        raise ValueError(f"unknown boundary {boundary!r}; allowed: {', '.join(BOUNDARIES)}")
    value: object = getattr(record, BOUNDARY_FIELDS[boundary])
    return value


# --------------------------------------------------------------------------- inventory

_ENV_NAMES: Final = frozenset(
    {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED"}
)
_ENV_PREFIXES: Final = ("NCCL_", "TORCH_", "GLOO_", "CUDA_")
_SECRET_MARKERS: Final = ("KEY", "SECRET", "TOKEN", "PASSWORD", "CREDENTIAL")


def relevant_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Env vars that can change numerics or communication, never secret-looking ones."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name in sorted(environ):
        upper = name.upper()
        if any(marker in upper for marker in _SECRET_MARKERS):
            continue
        if name in _ENV_NAMES or name.startswith(_ENV_PREFIXES):
            out[name] = environ[name]
    return out


def _nccl_version() -> str | None:
    if not (torch.cuda.is_available() and torch.distributed.is_nccl_available()):
        return None
    version: tuple[Any, ...] = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
    # (major, minor, patch) plus an optional build suffix such as "+cuda12.4".
    return ".".join(str(v) for v in version[:3]) + "".join(str(v) for v in version[3:])


def _cudnn_version() -> int | None:
    if not torch.backends.cudnn.is_available():  # type: ignore[no-untyped-call]
        return None
    version: int | None = torch.backends.cudnn.version()  # type: ignore[no-untyped-call]
    return version


def collect_inventory(rank: int, attempt: int) -> InventoryRecord:
    """The runtime inventory of this process."""
    return InventoryRecord(
        rank=rank,
        attempt=attempt,
        pid=os.getpid(),
        host=socket.gethostname(),
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cudnn=_cudnn_version(),
        nccl=_nccl_version(),
        gloo=torch.distributed.is_available() and torch.distributed.is_gloo_available(),
        numpy=np.__version__,
        platform=platform.platform(),
        num_threads=torch.get_num_threads(),
        deterministic_algorithms=torch.are_deterministic_algorithms_enabled(),
        cudnn_deterministic=bool(torch.backends.cudnn.deterministic),
        cudnn_benchmark=bool(torch.backends.cudnn.benchmark),
        float32_matmul_precision=torch.get_float32_matmul_precision(),
        cudnn_allow_tf32=bool(torch.backends.cudnn.allow_tf32),
        env=relevant_env(),
    )


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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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


def effective_steps(records: Iterable[TraceRecord], rank: int) -> dict[int, StepRecord]:
    """Step -> the last record of that step for ``rank``: what the leg finally did."""
    steps: dict[int, StepRecord] = {}
    for record in records:
        if isinstance(record, StepRecord) and record.rank == rank:
            steps[record.step] = record
    return dict(sorted(steps.items()))
