"""Drift between two DCP checkpoints, streamed tensor by tensor with bounded memory.

For every tensor key both checkpoints hold, the tensor is loaded from each (nothing else
is), compared, and dropped before the next: the maximum absolute difference, the relative
L2 difference ``||a-b|| / ||a||`` and the fraction of elements whose bits differ (so
``-0.0`` against ``0.0`` counts, and two NaNs with the same payload do not). Small tensors
are loaded in batches of up to ``batch_bytes`` to save per-load overhead; each comparison
runs over chunks of ``chunk_elements`` so its temporaries stay small. Peak memory is
therefore about two batches (or two copies of the largest tensor) plus DCP's own read
buffer for the tensor being loaded.

Keys under ``model.`` form the "model" group, keys under ``optim.`` the "optimizer" group;
rank-local keys (``rank_*``: pending gradients) are skipped. Non-tensor items (optimizer
hyperparameters) are compared for equality. Complex tensors are compared as their real and
imaginary parts.
"""

from __future__ import annotations

import inspect
import logging
import math
import struct
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

from resumequal.checkpoint.layout import DCP_DIR
from resumequal.checkpoint.manager import DCP_ERRORS
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.errors import CheckpointError
from resumequal.results.verdict import DriftSummary, TensorDrift

log = logging.getLogger(__name__)

Group = Literal["model", "optimizer"]
GROUP_PREFIXES: Final[dict[str, Group]] = {"model.": "model", "optim.": "optimizer"}
TOP_TENSORS: Final = 5
BATCH_BYTES: Final = 64 << 20
CHUNK_ELEMENTS: Final = 1 << 18  # 1 MB of float32: the passes over a chunk stay in cache

_BITS: Final = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def group_of(key: str) -> Group | None:
    for prefix, group in GROUP_PREFIXES.items():
        if key.startswith(prefix):
            return group
    return None


# --------------------------------------------------------------------------- one tensor


@dataclass
class TensorStats:
    """Sums behind one tensor's drift, kept so that groups can be totalled exactly."""

    numel: int = 0
    mismatched: int = 0
    max_abs_diff: float = 0.0
    sq_diff: float = 0.0
    sq_ref: float = 0.0

    def add(self, other: TensorStats) -> None:
        self.numel += other.numel
        self.mismatched += other.mismatched
        self.max_abs_diff = _nanmax(self.max_abs_diff, other.max_abs_diff)
        self.sq_diff += other.sq_diff
        self.sq_ref += other.sq_ref

    @property
    def rel_l2(self) -> float:
        if self.sq_ref > 0:
            return math.sqrt(self.sq_diff) / math.sqrt(self.sq_ref)
        return 0.0 if self.sq_diff == 0 else math.inf

    @property
    def mismatch_fraction(self) -> float:
        return self.mismatched / self.numel if self.numel else 0.0

    def drift(self, name: str) -> TensorDrift:
        return TensorDrift(name=name, numel=self.numel, max_abs_diff=self.max_abs_diff,
                           rel_l2=self.rel_l2, mismatch_fraction=self.mismatch_fraction)


def _nanmax(a: float, b: float) -> float:
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


def _flat(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.reshape(-1)


def _sumsq(x: torch.Tensor) -> float:
    if x.numel() == 0:
        return 0.0
    if x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float64 if not x.is_floating_point() else torch.float32)
    return float(torch.linalg.vector_norm(x)) ** 2


def _abs_diff(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if x.dtype in (torch.float32, torch.float64):
        return (x - y).abs()
    wide = torch.float32 if x.is_floating_point() else torch.float64
    return (x.to(wide) - y.to(wide)).abs()


def tensor_stats(a: torch.Tensor, b: torch.Tensor, chunk: int = CHUNK_ELEMENTS) -> TensorStats:
    """Compare two tensors of the same dtype and shape, ``chunk`` elements at a time."""
    x, y = _flat(a), _flat(b)
    bits = _BITS[x.element_size()]
    stats = TensorStats(numel=x.numel())
    for start in range(0, x.numel(), chunk):
        xs, ys = x[start:start + chunk], y[start:start + chunk]
        stats.sq_ref += _sumsq(xs)
        xb, yb = xs.view(bits), ys.view(bits)
        if torch.equal(xb, yb):  # the common case, and the cheapest test
            continue
        differs = xb != yb
        count = int(torch.count_nonzero(differs))
        stats.mismatched += count
        if 4 * count < xs.numel():
            # Few differ: gather just those (cheaper than a chunk-sized difference).
            index = differs.nonzero().squeeze(1)
            d = _abs_diff(xs.index_select(0, index), ys.index_select(0, index))
        else:
            d = _abs_diff(xs, ys)
        worst = float(d.max())
        if math.isnan(worst) and d.numel() == xs.numel():
            # Equal bits differ by nothing, even where NaN - NaN or inf - inf says NaN.
            d.masked_fill_(differs.logical_not_(), 0)
            worst = float(d.max())
        stats.max_abs_diff = _nanmax(stats.max_abs_diff, worst)
        stats.sq_diff += _sumsq(d)
    return stats


# --------------------------------------------------------------------------- values


def values_equal(a: object, b: object) -> bool:
    """Bitwise equality of plain values: floats by their bits, containers item by item."""
    if isinstance(a, float) and isinstance(b, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return (a.dtype, a.shape) == (b.dtype, b.shape) and (
            a.numel() == 0 or torch.equal(_flat(a).view(_BITS[a.element_size()]),
                                          _flat(b).view(_BITS[b.element_size()]))
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return (type(a) is type(b) and len(a) == len(b)
                and all(values_equal(x, y) for x, y in zip(a, b, strict=True)))
    return type(a) is type(b) and bool(a == b)


# --------------------------------------------------------------------------- checkpoints


# The comparator loads in its one process. A torch without dcp.load's ``no_dist`` (2.6)
# does so by itself where no process group is up, as in the comparator.
_NO_DIST: dict[str, bool] = (
    {"no_dist": True} if "no_dist" in inspect.signature(dcp.load).parameters else {})


class _Checkpoint:
    """One DCP checkpoint: its metadata, and loads of chosen keys only. A
    :class:`VerifiedCheckpoint` is read through its manifest (each chunk checked as it is
    read); a path is a DCP folder this process trusts (a test's, a bench's)."""

    def __init__(self, where: VerifiedCheckpoint | Path, role: str) -> None:
        self.role = role
        if isinstance(where, VerifiedCheckpoint):
            self.path = where.where
            verified = where.reader()
            self._reader: Callable[[], dcp.FileSystemReader] = lambda: verified
        else:
            folder = where / DCP_DIR if (where / DCP_DIR).is_dir() else where
            self.path = str(folder)
            self._reader = lambda: dcp.FileSystemReader(str(folder))
        try:
            meta = self._reader().read_metadata()
        except CheckpointError as e:  # refused by its manifest
            raise self._refused(str(e)) from e
        except DCP_ERRORS as e:  # a missing or unpicklable .metadata file
            raise CheckpointError(f"{self.path}: unreadable DCP metadata: {e}") from e
        self.items = meta.state_dict_metadata

    def _refused(self, why: str) -> FinalCheckpointRefused:
        return FinalCheckpointRefused(f"the {self.role} leg's final checkpoint fails "
                                      f"verification: {why}")

    def load(self, keys: Iterable[str]) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for key in keys:
            md = self.items[key]
            state[key] = (torch.empty(md.size, dtype=md.properties.dtype)
                          if isinstance(md, TensorStorageMetadata) else None)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a "
                                                      "single process")
            try:
                dcp.load(state, storage_reader=self._reader(),
                         planner=DefaultLoadPlanner(allow_partial_load=True), **_NO_DIST)
            except DCP_ERRORS as e:  # DCP wraps read failures in CheckpointException
                failures = ([exc for exc, _ in e.failures.values()]
                            if isinstance(e, CheckpointException) else [e])
                refusals = [str(exc) for exc in failures if isinstance(exc, CheckpointError)]
                if refusals:
                    raise self._refused("; ".join(refusals)) from e
                raise CheckpointError(f"{self.path}: cannot load {len(state)} item(s): "
                                      f"{'; '.join(map(str, failures))}") from e
        return state


class FinalCheckpointRefused(CheckpointError):
    """A byte the drift read does not match the checkpoint's manifest."""


def _tensor_spec(md: object) -> tuple[torch.Size, torch.dtype] | None:
    if isinstance(md, TensorStorageMetadata):
        return md.size, md.properties.dtype
    return None


def _batches(keys: list[str], sizes: dict[str, int], limit: int) -> Iterator[list[str]]:
    batch: list[str] = []
    total = 0
    for key in keys:
        if batch and total + sizes[key] > limit:
            yield batch
            batch, total = [], 0
        batch.append(key)
        total += sizes[key]
    if batch:
        yield batch


@dataclass
class _GroupTotals:
    group: Group
    tensors: int = 0
    stats: TensorStats = field(default_factory=TensorStats)
    worst: list[TensorDrift] = field(default_factory=list)
    values: int = 0
    values_differ: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)

    def add_tensor(self, name: str, stats: TensorStats, top: int) -> None:
        self.tensors += 1
        self.stats.add(stats)
        if stats.mismatched:
            self.worst.append(stats.drift(name))
            self.worst.sort(key=_badness, reverse=True)
            del self.worst[top:]

    def summary(self) -> DriftSummary:
        s = self.stats
        return DriftSummary(
            group=self.group, tensors=self.tensors, numel=s.numel,
            max_abs_diff=s.max_abs_diff, rel_l2=s.rel_l2,
            mismatch_fraction=s.mismatch_fraction, worst=self.worst, values=self.values,
            values_differ=self.values_differ, unmatched=self.unmatched,
        )


def _badness(t: TensorDrift) -> tuple[float, float, float]:
    def key(v: float) -> float:
        return math.inf if math.isnan(v) else v
    return key(t.max_abs_diff), key(t.rel_l2), t.mismatch_fraction


def checkpoint_drift(
    control: VerifiedCheckpoint | Path,
    preempted: VerifiedCheckpoint | Path,
    *,
    top: int = TOP_TENSORS,
    batch_bytes: int = BATCH_BYTES,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> list[DriftSummary]:
    """Drift of the model and optimizer groups from ``control`` to ``preempted``.

    Either argument may be a committed checkpoint read through its manifest, or a
    trusted checkpoint folder (holding ``dcp/``) or DCP folder.
    """
    a, b = _Checkpoint(control, "control"), _Checkpoint(preempted, "preempted")
    totals = {g: _GroupTotals(g) for g in GROUP_PREFIXES.values()}
    tensor_keys: list[str] = []
    value_keys: list[str] = []
    skipped = 0
    for key in sorted(set(a.items) | set(b.items)):
        group = group_of(key)
        if group is None:
            if not key.startswith("rank_"):
                skipped += 1
            continue
        ma, mb = a.items.get(key), b.items.get(key)
        if ma is None or mb is None or type(ma) is not type(mb) or (
            _tensor_spec(ma) != _tensor_spec(mb)
        ):
            totals[group].unmatched.append(key)
        elif isinstance(ma, BytesStorageMetadata):
            value_keys.append(key)
        else:
            tensor_keys.append(key)

    if skipped:
        log.debug("%s: %d key(s) outside the model and optimizer groups skipped", a.path,
                  skipped)
    sizes = {}
    for key in tensor_keys:
        md = a.items[key]
        assert isinstance(md, TensorStorageMetadata)
        sizes[key] = math.prod(md.size) * md.properties.dtype.itemsize
    for batch in _batches(tensor_keys, sizes, batch_bytes):
        left, right = a.load(batch), b.load(batch)
        for key in batch:
            stats = tensor_stats(left.pop(key), right.pop(key), chunk_elements)
            group = group_of(key)
            assert group is not None
            totals[group].add_tensor(key, stats, top)
        del left, right

    if value_keys:
        left, right = a.load(value_keys), b.load(value_keys)
        for key in value_keys:
            group = group_of(key)
            assert group is not None
            totals[group].values += 1
            if not values_equal(left[key], right[key]):
                totals[group].values_differ.append(key)
    return [t.summary() for t in totals.values()]


def is_exact(drift: DriftSummary) -> bool:
    """No element, value or key differs."""
    return drift.mismatch_fraction == 0 and not drift.values_differ and not drift.unmatched
