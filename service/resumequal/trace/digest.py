"""Exact digests of what a worker holds: tensors, named tensors, optimizer state, RNG states
and a bucket layout.

Digests are bitwise: they cover dtype, shape and the raw bytes of each tensor, so ``-0.0``
and ``0.0`` (or two NaN payloads) differ, while a non-contiguous view and its contiguous
copy agree. A sharded tensor (a ``DTensor``, as FSDP2 makes parameters, gradients and
optimizer state) is digested as what this rank holds: its local shard, plus what
identifies the sharding (global shape, placements, mesh shape and this rank's coordinate in
it), so the same bytes sharded differently never digest alike.

A process digests with one algorithm (:func:`use`, set before training starts; a run's
legs must agree on it, which the inventory records):

- ``xxh3_128``: each tensor's bytes are copied to the host (where they are not already) and
  hashed by xxh3-128, chosen by measurement (``bench/trace_overhead.py --hashes``): on a CPU
  it runs at memory speed, so per-step digests of a whole model and optimizer cost little
  next to the step itself.
- ``wsum128``: each tensor's bytes are read where they live by the order-aware fingerprint
  of :mod:`resumequal.trace.fingerprint`, a boundary's tensors at once, and only the 16
  bytes of each fingerprint cross to the host, to be hashed by xxh3-128 in place of the
  bytes. On a GPU, copying gigabytes of state to one host core every step would dominate it.

Both frame the same things (names, dtypes, shapes, byte lengths, structure) alike, and each
whole-boundary digest string names its algorithm.

This is the torch side of the trace, run inside workers: it imports torch and numpy, and
must not import ``train``, ``state`` or ``checkpoint`` (it only observes what they hand
it). The records these digests go into live in :mod:`resumequal.trace.records`.
"""

from __future__ import annotations

import contextlib
import functools
import random
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import torch
import xxhash
from torch.distributed.tensor import DTensor

from resumequal.spec.sections import DIGEST_ALGORITHMS as ALGORITHMS
from resumequal.spec.sections import DigestAlgorithm as Algorithm
from resumequal.trace import fingerprint
from resumequal.trace.records import DIGEST_ALGORITHM, BucketRecord

assert fingerprint.ALGORITHM in ALGORITHMS

__all__ = [
    "ALGORITHMS",
    "DIGEST_ALGORITHM",
    "NO_TENSOR",
    "Digests",
    "batched",
    "bucket_layout_digest",
    "combined_digest",
    "named_tensors_digest",
    "optimizer_digests",
    "optimizer_state_digest",
    "rng_digests",
    "sharding",
    "tensor_digest",
    "tensor_digests",
    "use",
    "used",
]


@dataclass
class _Use:
    algorithm: Algorithm = DIGEST_ALGORITHM
    # What each tensor feeds (framing and fingerprint), computed ahead for one digest call,
    # by id() of the tensor handed in (the objects are held by the caller throughout, so
    # no id is reused meanwhile).
    ready: dict[int, bytes] | None = None


_USE = _Use()


def use(algorithm: Algorithm) -> None:
    """Digest with ``algorithm`` from now on, in this process."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown digest algorithm {algorithm!r}; "
                         f"known: {', '.join(ALGORITHMS)}")
    _USE.algorithm = algorithm


def used() -> Algorithm:
    """The algorithm this process digests with."""
    return _USE.algorithm

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


def _plain(t: torch.Tensor) -> tuple[torch.Tensor, bytes | None]:
    """The dense tensor whose bytes stand for ``t`` (on its device, contiguous), and what
    identifies its sharding where it is a DTensor's local shard."""
    shard = None
    if isinstance(t, DTensor):
        shard = sharding(t).encode()
        t = t.to_local().detach()
    if t.requires_grad:
        t = t.detach()
    # Lazy conjugate/negative views keep a flag instead of rewriting memory; resolve them
    # so the digest sees the values the tensor stands for.
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return t, shard


def _framing(t: torch.Tensor, shard: bytes | None) -> bytes:
    """What is fed before a dense tensor's bytes (or fingerprint): its sharding, if any,
    dtype, shape and byte length."""
    prefix = _tensor_prefix(t.dtype, t.shape, t.nbytes)
    return prefix if shard is None else _framed(b"S", shard) + prefix


def _feed_tensor(h: xxhash.xxh3_128, t: torch.Tensor) -> None:
    # Per-tensor Python overhead, not hashing, dominates for models of many small tensors,
    # so this path keeps the number of torch calls low.
    fed = None if _USE.ready is None else _USE.ready.get(id(t))
    if fed is not None:  # framed and fingerprinted by the batch
        h.update(fed)
        return
    t, shard = _plain(t)
    h.update(_framing(t, shard))
    if _USE.algorithm == "wsum128":
        h.update(b"F" + fingerprint.fingerprints([t])[0])
        return
    if not t.is_cpu:
        t = t.cpu()
    # Zero-copy: the ndarray shares the tensor's memory and exports it as a buffer.
    if t.dtype in _NUMPY_DTYPES:
        h.update(t.numpy().data)
    else:
        h.update(t.reshape(-1).view(torch.uint8).numpy().data)


def _tensors_in(value: object) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors_in(item)


@contextlib.contextmanager
def batched(values: Iterable[object]) -> Iterator[None]:
    """Under wsum128, every tensor in ``values`` fingerprinted at once (one transfer to the
    host per device, not one per tensor) for the digests taken inside; nested, the
    outermost batch serves."""
    if _USE.algorithm != "wsum128" or _USE.ready is not None:
        yield
        return
    tensors = [t for value in values for t in _tensors_in(value)]
    plain = [_plain(t) for t in tensors]
    prints = fingerprint.fingerprints([dense for dense, _ in plain])
    # Each tensor's whole feed, so that a digest inside neither normalises it again (a
    # DTensor's local shard, a contiguous copy) nor frames it anew.
    _USE.ready = {id(t): _framing(dense, shard) + b"F" + p
                  for t, (dense, shard), p in zip(tensors, plain, prints, strict=True)}
    try:
        yield
    finally:
        _USE.ready = None


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
    return f"{_USE.algorithm}:{h.hexdigest()}"


def tensor_digest(t: torch.Tensor) -> str:
    """Digest of one tensor's dtype, shape and raw bytes."""
    h = xxhash.xxh3_128()
    _feed_tensor(h, t)
    return _finish(h)


def value_digest(value: object) -> str:
    """Digest of nested mappings and sequences of tensors and plain values, structurally."""
    h = xxhash.xxh3_128()
    with batched([value]):
        _feed_value(h, value)
    return _finish(h)


def named_tensors_digest(items: Iterable[tuple[str, torch.Tensor | None]]) -> str:
    """Digest of named tensors in the given order; ``None`` (e.g. a param without grad) counts."""
    h = xxhash.xxh3_128()
    items = list(items)
    with batched(t for _, t in items if t is not None):
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
    items = list(items)
    with batched(t for _, t in items if t is not None):
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
    states = [optimizer.state.get(param) for group in optimizer.param_groups
              for param in group["params"]]
    with batched(states):
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
    with batched([state]):
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

