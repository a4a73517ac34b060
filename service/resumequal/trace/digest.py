"""Exact digests of what a worker holds: tensors, named tensors, optimizer state, RNG states
and a bucket layout.

Digests are bitwise: they cover dtype, shape and the raw bytes of each tensor, so ``-0.0``
and ``0.0`` (or two NaN payloads) differ, while a non-contiguous view and its contiguous
copy agree. A sharded tensor (a ``DTensor``, as FSDP2 makes parameters, gradients and
optimizer state) is digested as what this rank holds: its local shard, plus what
identifies the sharding (global shape, placements, mesh shape and this rank's coordinate in
it), so the same bytes sharded differently never digest alike.

The hash is xxh3-128, chosen by measurement (``bench/trace_overhead.py --hashes``): it runs
at memory speed, so per-step digests of a whole model and optimizer cost little next to the
step itself, and each digest string names its algorithm.

This is the torch side of the trace, run inside workers: it imports torch and numpy, and
must not import ``train``, ``state`` or ``checkpoint`` (it only observes what they hand
it). The records these digests go into live in :mod:`resumequal.trace.records`.
"""

from __future__ import annotations

import functools
import random
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import torch
import xxhash
from torch.distributed.tensor import DTensor

from resumequal.trace.records import BucketRecord

DIGEST_ALGORITHM: Final = "xxh3_128"

__all__ = [
    "DIGEST_ALGORITHM",
    "NO_TENSOR",
    "Digests",
    "bucket_layout_digest",
    "combined_digest",
    "named_tensors_digest",
    "optimizer_digests",
    "optimizer_state_digest",
    "rng_digests",
    "sharding",
    "tensor_digest",
    "tensor_digests",
]

# Every item fed to the hasher is tagged and length-prefixed, so no two different
# sequences of (name, tensor, value) can produce the same byte stream.
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def _framed(tag: bytes, data: bytes) -> bytes:
    return tag + _U64.pack(len(data)) + data


def _feed_bytes(h: xxhash.xxh3_128, tag: bytes, data: bytes) -> None:
    h.update(_framed(tag, data))


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


def sharding(t: DTensor) -> str:
    """What identifies how ``t`` is sharded, as seen from this rank."""
    mesh = t.device_mesh
    return (f"global={tuple(t.shape)}|placements={t.placements}|mesh={tuple(mesh.shape)}"
            f"|coordinate={tuple(mesh.get_coordinate() or ())}")


def _feed_tensor(h: xxhash.xxh3_128, t: torch.Tensor) -> None:
    # Per-tensor Python overhead, not hashing, dominates for models of many small tensors,
    # so this path keeps the number of torch calls low.
    if isinstance(t, DTensor):
        _feed_bytes(h, b"S", sharding(t).encode())
        t = t.to_local().detach()
    if t.requires_grad:
        t = t.detach()
    # Lazy conjugate/negative views keep a flag instead of rewriting memory; resolve them
    # so the digest sees the values the tensor stands for.
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if not (t.is_cpu and t.is_contiguous()):
        t = t.contiguous().cpu()
    h.update(_tensor_prefix(t.dtype, t.shape, t.nbytes))
    # Zero-copy: the ndarray shares the tensor's memory and exports it as a buffer.
    if t.dtype in _NUMPY_DTYPES:
        h.update(t.numpy().data)
    else:
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)


# The fed order and bytes of a mapping's keys, by its keys in insertion order: each
# parameter's optimizer state has the same few keys, and sorting and encoding them again
# for every parameter costs more than hashing its tensors. Only all-str keys are kept (a
# str never equals another builtin type, so a tuple of them names one feed); bounded, so a
# caller digesting mappings of ever new keys cannot grow it without end.
_KEY_FEEDS: dict[tuple[object, ...], tuple[tuple[object, bytes], ...]] = {}
_KEY_FEEDS_MAX: Final = 1024


def _key_feeds(value: Mapping[Any, object]) -> tuple[tuple[object, bytes], ...]:
    keys = tuple(value)
    feeds = _KEY_FEEDS.get(keys)
    if feeds is None:
        feeds = tuple((key, _framed(b"K", repr(key).encode()))
                      for key in sorted(keys, key=repr))
        if len(_KEY_FEEDS) < _KEY_FEEDS_MAX and all(type(k) is str for k in keys):
            _KEY_FEEDS[keys] = feeds
    return feeds


def _feed_value(h: xxhash.xxh3_128, value: object) -> None:
    """Feed tensors by bytes, containers structurally, anything else by its repr."""
    if isinstance(value, torch.Tensor):
        _feed_tensor(h, value)
    elif isinstance(value, np.ndarray):
        _feed_bytes(h, b"A", f"{value.dtype.str}|{value.shape}|{value.nbytes}".encode())
        h.update(np.ascontiguousarray(value).data)
    elif isinstance(value, Mapping):
        h.update(b"D" + _U32.pack(len(value)))
        for key, fed in _key_feeds(value):
            h.update(fed)
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


def value_digest(value: object) -> str:
    """Digest of nested mappings and sequences of tensors and plain values, structurally."""
    h = xxhash.xxh3_128()
    _feed_value(h, value)
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


# A named tensor that is not there (a parameter without a gradient yet).
NO_TENSOR: Final = "none"


@dataclass(frozen=True)
class Digests:
    """One boundary's digests: each tensor's (bare hex, by name, in the order digested) and
    the whole boundary's, derived from them (a hash of the names and their digests)."""

    whole: str
    tensors: dict[str, str]


def combined_digest(tensors: Mapping[str, str]) -> str:
    """The whole-boundary digest of per-tensor digests, in their order."""
    h = xxhash.xxh3_128()
    h.update(b"T" + _U32.pack(len(tensors)))
    for name, digest in tensors.items():
        _feed_bytes(h, b"N", name.encode())
        _feed_bytes(h, b"D", digest.encode())
    return _finish(h)


def tensor_digests(items: Iterable[tuple[str, torch.Tensor | None]]) -> Digests:
    """Each named tensor's digest (``NO_TENSOR`` for None), and the whole boundary's."""
    tensors: dict[str, str] = {}
    for name, t in items:
        if t is None:
            tensors[name] = NO_TENSOR
            continue
        h = xxhash.xxh3_128()
        _feed_tensor(h, t)
        tensors[name] = h.hexdigest()
    return Digests(combined_digest(tensors), tensors)


_NOT_OPTIMIZER_STATE = frozenset({"params", "lr", "initial_lr"})
# The per-tensor key of the param groups' hyperparameters in optimizer_digests.
PARAM_GROUPS: Final = "param_groups"


def optimizer_digests(optimizer: torch.optim.Optimizer, names: Mapping[int, str]) -> Digests:
    """The optimizer's state per parameter (keyed by ``names[id(param)]``) and its param
    groups' hyperparameters but the learning rate (see :func:`optimizer_state_digest`)."""
    # What state_dict() holds, read in place: building it costs more than the hashing.
    tensors: dict[str, str] = {}
    index = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param)
            if state:
                h = xxhash.xxh3_128()
                _feed_value(h, state)
                tensors[names.get(id(param)) or f"#{index}"] = h.hexdigest()
            index += 1
    h = xxhash.xxh3_128()
    for group in optimizer.param_groups:
        _feed_value(h, {k: v for k, v in group.items() if k not in _NOT_OPTIMIZER_STATE})
    tensors[PARAM_GROUPS] = h.hexdigest()
    return Digests(combined_digest(tensors), tensors)


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


def bucket_layout_digest(buckets: Iterable[BucketRecord]) -> str:
    """Digest of an ordered bucket layout (bucket order, parameter order, sizes)."""
    h = xxhash.xxh3_128()
    for bucket in buckets:
        _feed_value(h, (bucket.index, bucket.numel, bucket.params))
    return _finish(h)

