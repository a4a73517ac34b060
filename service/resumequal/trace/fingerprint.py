"""wsum128: an order-aware 128-bit fingerprint of a tensor's bytes, computed on the device
the tensor lives on, so that only 16 bytes per tensor cross to the host.

The bytes are read as 32-bit words ``w_i`` (the last one zero-padded; the tensor's byte
length is framed beside the fingerprint by :mod:`resumequal.trace.digest`, so padding never
aliases). Each lane ``l`` of the two is

    F_l = sum_i  w_i * m_l(i)   (mod 2**64),   m_l(i) = A_l[i mod C] * B_l[i div C]

with ``A_l`` and ``B_l`` fixed tables of odd 64-bit multipliers drawn from splitmix64 (so
``m_l(i)`` is odd too), the two lanes' tables independent of each other.

Why this is sensitive:

- **One changed word always changes both lanes.** A word is below 2**32, so a change
  ``d = w' - w`` is a nonzero integer of absolute value below 2**32; ``d * m`` with ``m``
  odd is ``0 mod 2**64`` only when ``2**64`` divides ``d``, which it cannot. Every single-bit
  flip, a sign (``-0.0`` against ``0.0``) or a NaN payload is such a change.
- **Several changes** cancel in a lane only if ``sum_i d_i * m(i) = 0 mod 2**64``. With the
  multipliers taken as random odd numbers, the term of lowest 2-adic valuation ``v`` (at most
  31, as ``|d_i| < 2**32``) fixes its multiplier modulo ``2**(64 - v)``: a chance of at most
  about 2**-32 in one lane, 2**-64 in both, for changes unrelated to the tables. A swap of
  two different words (a permutation) is such a pair of changes with different multipliers.
  Words are 32 bits, not 64, precisely so that no change sits in bits a multiplier cannot
  reach: with 64-bit words two flipped top bits would cancel in every lane.
- It is **not** a cryptographic hash: whoever knows the tables can build collisions. It
  tells apart what training computed in two legs; what is read from a store is
  authenticated elsewhere, by BLAKE3 under a key (:mod:`resumequal.checkpoint.manifest`).

The sum reads every byte once and needs no order between words, so it is one reduction:
``torch.compile`` fuses it into a single kernel where a compiler is at hand (on a GPU, a
Triton kernel); elsewhere it runs as a few plain torch operations, block by block, so its
scratch memory stays bounded. Both give the same bits (integer arithmetic mod 2**64 has no
rounding), which the tests check against a pure-Python reference.

Imports torch and numpy; must not import ``train``, ``state`` or ``checkpoint``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
import torch

log = logging.getLogger(__name__)

ALGORITHM: Final = "wsum128"
__all__ = ["ALGORITHM", "fingerprints", "reference"]

# Words per row: the position inside a row picks A, the row picks B.
ROW_WORDS: Final = 1024
# Rows reduced at once by the plain torch path, one lane at a time: on a CPU a block's
# scratch (8 bytes per word: 1 MiB) stays in cache, which measured 2.7 GB/s on one thread
# against 0.4 GB/s for blocks of 16 MiB; on a GPU fewer, larger launches matter more. Either
# way a multi-GB tensor needs no multi-GB temporaries.
_BLOCK_ROWS: Final = {"cpu": 128}
_BLOCK_ROWS_ELSEWHERE: Final = 16384
_MASK32: Final = 0xFFFFFFFF
# splitmix64's constants (Steele, Lea, Flood 2014); the seeds name each table.
_GAMMA: Final = np.uint64(0x9E3779B97F4A7C15)
_SEEDS: Final = ((0x7773756D31323801, 0x7773756D31323802),
                 (0x7773756D31323803, 0x7773756D31323804))
# Compile the reduction (one fused kernel) where the tensor is on a GPU, or wherever this
# says so; "0" keeps the plain path everywhere.
COMPILE_ENV: Final = "RESUMEQUAL_WSUM_COMPILE"


def _splitmix_odd(seed: int, start: int, count: int) -> np.ndarray:
    """``count`` odd 64-bit multipliers from splitmix64's stream ``seed``, from ``start``."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + _GAMMA * np.arange(start + 1, start + count + 1, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z | np.uint64(1)


def _as_int64(values: np.ndarray) -> torch.Tensor:
    # The same 64 bits: torch has no uint64 arithmetic, but int64's wraps identically.
    return torch.from_numpy(np.ascontiguousarray(values).view(np.int64))


@functools.lru_cache(maxsize=16)
def _row_table(device: torch.device) -> torch.Tensor:
    """A: ``[2, ROW_WORDS]``, one row per lane."""
    table = np.stack([_splitmix_odd(seeds[0], 0, ROW_WORDS) for seeds in _SEEDS])
    return _as_int64(table).to(device)


_ROWS: dict[torch.device, torch.Tensor] = {}


def _rows_table(device: torch.device, rows: int) -> torch.Tensor:
    """B: ``[2, >= rows]``, grown by doubling as larger tensors come."""
    table = _ROWS.get(device)
    if table is None or table.shape[1] < rows:
        size = max(rows, 2 * (0 if table is None else table.shape[1]), 64)
        table = _as_int64(np.stack([_splitmix_odd(seeds[1], 0, size)
                                    for seeds in _SEEDS])).to(device)
        _ROWS[device] = table
    return table


def _row_sums_plain(words: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Each row's sum of ``words`` (int32 ``[R, C]``) times row table ``a`` ``[2, C]``, per
    lane: int64 ``[2, R]``."""
    out = torch.empty(2, words.shape[0], dtype=torch.int64, device=words.device)
    step = _BLOCK_ROWS.get(words.device.type, _BLOCK_ROWS_ELSEWHERE)
    for start in range(0, words.shape[0], step):
        block = words[start:start + step].to(torch.int64).bitwise_and_(_MASK32)
        for lane in range(2):
            torch.sum(torch.mul(block, a[lane]), dim=1, out=out[lane, start:start + block.shape[0]])
    return out


def _row_sums_fused(words: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    w = words.to(torch.int64) & _MASK32
    return (w.unsqueeze(0) * a.unsqueeze(1)).sum(dim=2)


_RowSums = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@functools.lru_cache(maxsize=1)
def _compiled() -> _RowSums:
    fn: _RowSums = torch.compile(_row_sums_fused, dynamic=True, fullgraph=True)
    return fn


# Devices on which compiling failed once: they stay on the plain path, which gives the same
# bits, so a run never mixes results of the two.
_NOT_COMPILING: set[str] = set()


def _compiles(device: torch.device) -> bool:
    if device.type in _NOT_COMPILING:
        return False
    wanted = os.environ.get(COMPILE_ENV)
    if wanted is not None:
        return wanted == "1"
    return device.type == "cuda"


def _row_sums(words: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    if _compiles(words.device):
        try:
            return _compiled()(words, a)
        # Any failure of the compiler leaves the plain path, which gives the same bits.
        except Exception as e:
            _NOT_COMPILING.add(words.device.type)
            log.warning("wsum128 is not compiled on %s (%s: %s); it runs as plain torch "
                        "operations, with the same results", words.device.type,
                        type(e).__name__, e)
    return _row_sums_plain(words, a)


def _raw(t: torch.Tensor) -> torch.Tensor:
    raw = t.reshape(-1).view(torch.uint8)
    # Viewing bytes as int32 needs them 4-aligned.
    return raw.clone() if raw.storage_offset() % 4 else raw


@functools.lru_cache(maxsize=256)
def _packing(segments: tuple[tuple[int, int, int], ...],
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For packed segments ``(owner, first row, rows)``: each packed row's owner and its row
    index within the owner's tensor, on ``device``. A boundary packs the same shapes every
    step, so this is built once."""
    owner = np.concatenate([np.full(rows, k, dtype=np.int64) for k, _, rows in segments])
    local = np.concatenate([np.arange(first, first + rows, dtype=np.int64)
                            for _, first, rows in segments])
    return torch.from_numpy(owner).to(device), torch.from_numpy(local).to(device)


# A tensor of fewer bytes than this is packed with the others into one buffer (copied,
# zero-padded to whole rows), so that a boundary of many small tensors costs a few kernels
# in all, not a few per tensor; a larger one is read in place.
PACK_BYTES: Final = 1 << 20


def _device_lanes(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Both lanes of each tensor (all on one device, contiguous): int64 ``[2, n]``."""
    device = tensors[0].device
    row_bytes = 4 * ROW_WORDS
    a = _row_table(device)
    out = torch.zeros(2, len(tensors), dtype=torch.int64, device=device)
    pieces: list[torch.Tensor] = []
    segments: list[tuple[int, int, int]] = []
    pad = torch.zeros(row_bytes, dtype=torch.uint8, device=device)
    longest = 1
    for k, t in enumerate(tensors):
        raw = _raw(t)
        full = 0 if raw.numel() < PACK_BYTES else raw.numel() // row_bytes * row_bytes
        if full:
            rows = raw[:full].view(torch.int32).view(-1, ROW_WORDS)
            b = _rows_table(device, rows.shape[0] + 1)
            out[:, k] = (_row_sums(rows, a) * b[:, :rows.shape[0]]).sum(dim=1)
        rest = raw[full:]
        if rest.numel():
            # The rest are more rows of this tensor's, the last zero-padded (zeros add
            # nothing to a sum, and the byte length is framed beside the fingerprint).
            count = -(-rest.numel() // row_bytes)
            pieces += [rest, pad[:count * row_bytes - rest.numel()]]
            segments.append((k, full // row_bytes, count))
            longest = max(longest, full // row_bytes + count)
    if segments:
        words = torch.cat(pieces).view(torch.int32).view(-1, ROW_WORDS)
        owner, local = _packing(tuple(segments), device)
        b = _rows_table(device, longest)
        out.index_add_(1, owner, _row_sums(words, a) * b[:, local])
    return out


def fingerprints(tensors: Sequence[torch.Tensor]) -> list[bytes]:
    """Each tensor's 16-byte fingerprint (two little-endian 64-bit lanes), computed on its
    device; one transfer to the host per device. Tensors must be contiguous."""
    out: list[bytes] = [b""] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for indices in by_device.values():
        lanes = _device_lanes([tensors[i] for i in indices]).cpu().numpy()
        for j, i in enumerate(indices):
            out[i] = lanes[:, j].astype("<i8").tobytes()
    return out

def reference(data: bytes) -> bytes:
    """The fingerprint of ``data`` in plain Python integers: slow, for the tests."""
    padded = data + bytes(-len(data) % 4)
    words = np.frombuffer(padded, dtype="<u4").astype(object)
    rows = (len(words) + ROW_WORDS - 1) // ROW_WORDS
    out = b""
    for seeds in _SEEDS:
        a = [int(x) for x in _splitmix_odd(seeds[0], 0, ROW_WORDS)]
        b = [int(x) for x in _splitmix_odd(seeds[1], 0, max(rows, 1))]
        total = sum(int(w) * a[i % ROW_WORDS] * b[i // ROW_WORDS]
                    for i, w in enumerate(words))
        out += (total % 2**64).to_bytes(8, "little")
    return out
