"""ShardedStream: a per-rank, epoch-permuted stream of samples with an explicit cursor.

The cursor is three integers (epoch, permutation seed, position in this rank's shard).
Epoch permutations come from a private generator, so the stream never touches the global
RNGs itself; only ``make_sample`` may (that is the workload's augmentation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from resumequal.workloads.base import Microbatch, StatefulDataset, WorkloadContext

Sample = tuple[torch.Tensor, ...]
Collate = Callable[[Sequence[Sample]], Any]

CURSOR_KEYS: tuple[str, ...] = ("epoch", "permutation_seed", "position")

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """SplitMix64's mixer: neighbouring inputs give unrelated 64-bit outputs."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def sample_generator(seed: int, sample_id: int) -> torch.Generator:
    """A private CPU generator that depends only on ``(seed, sample_id)``."""
    # Mixing (not adding) keeps neighbouring (seed, id) pairs from sharing streams.
    return torch.Generator().manual_seed(splitmix64(splitmix64(seed) ^ sample_id))


def stack_samples(samples: Sequence[Sample]) -> tuple[torch.Tensor, ...]:
    """Stack the i-th tensor of every sample into the i-th tensor of the batch."""
    return tuple(torch.stack(column) for column in zip(*samples, strict=True))


class ShardedStream:
    """A :class:`~resumequal.workloads.base.StatefulDataset` over ``num_samples`` ids.

    Every epoch is a fresh permutation of the ids; rank ``r`` reads ``perm[r::world_size]``
    cut to the same length on every rank. A microbatch that runs past the end of the shard
    continues into the next epoch. :meth:`microbatch_at` reads the same permutations by
    global position instead (a resize run's data).
    """

    def __init__(
        self,
        num_samples: int,
        microbatch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        make_sample: Callable[[int], Sample],
        blank_sample: Callable[[], Sample],
        collate: Collate = stack_samples,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is outside a world of {world_size}")
        if num_samples < world_size:
            raise ValueError(
                f"num_samples={num_samples} leaves some of {world_size} ranks without samples"
            )
        if microbatch_size < 1:
            raise ValueError(f"microbatch_size must be >= 1, got {microbatch_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.num_samples = num_samples
        self.microbatch_size = microbatch_size
        self.rank = rank
        self.world_size = world_size
        self.shard_length = num_samples // world_size
        self._make_sample = make_sample
        self._blank_sample = blank_sample
        self._collate = collate
        self._epoch = 0
        self._permutation_seed = seed
        self._position = 0
        # Derived from the cursor, never saved: (epoch, permutation_seed) -> shard ids.
        self._shard_cache: tuple[tuple[int, int], list[int]] | None = None
        self._perm_cache: tuple[int, list[int]] | None = None

    def _permutation(self, epoch: int) -> list[int]:
        if self._perm_cache is None or self._perm_cache[0] != epoch:
            generator = torch.Generator().manual_seed(self._permutation_seed + epoch)
            self._perm_cache = (epoch, torch.randperm(self.num_samples,
                                                      generator=generator).tolist())
        return self._perm_cache[1]

    def microbatch_at(self, position: int, size: int) -> Microbatch:
        """The samples at global positions ``position ..``: epoch ``e`` is the same
        permutation of every id that the shards of epoch ``e`` are cut from."""
        if position < 0 or size < 1:
            raise ValueError(f"no microbatch of {size} at position {position}")
        ids = [self._permutation(p // self.num_samples)[p % self.num_samples]
               for p in range(position, position + size)]
        return Microbatch(sample_ids=ids, data=self._collate([self._make_sample(i) for i in ids]))

    def _shard(self) -> list[int]:
        key = (self._epoch, self._permutation_seed)
        if self._shard_cache is None or self._shard_cache[0] != key:
            generator = torch.Generator().manual_seed(self._permutation_seed + self._epoch)
            perm = torch.randperm(self.num_samples, generator=generator)
            shard = perm[self.rank :: self.world_size][: self.shard_length].tolist()
            self._shard_cache = (key, shard)
        return self._shard_cache[1]

    def next_sample_ids(self) -> list[int]:
        """The ids of the next microbatch; advances the cursor without building samples."""
        ids: list[int] = []
        while len(ids) < self.microbatch_size:
            shard = self._shard()
            take = shard[self._position : self._position + self.microbatch_size - len(ids)]
            ids.extend(take)
            self._position += len(take)
            if self._position == self.shard_length:
                self._epoch += 1
                self._position = 0
        return ids

    def next_microbatch(self) -> Microbatch:
        """The next microbatch for this rank; advances the cursor."""
        ids = self.next_sample_ids()
        return Microbatch(sample_ids=ids, data=self._collate([self._make_sample(i) for i in ids]))

    def synthetic_microbatch(self) -> Microbatch:
        """A fixed, well-formed microbatch holding no real sample (``sample_ids`` is empty)."""
        blank = self._blank_sample()
        return Microbatch(sample_ids=[], data=self._collate([blank] * self.microbatch_size))

    def state_dict(self) -> dict[str, Any]:
        """The cursor as plain integers (a new dict on every call)."""
        return {
            "epoch": self._epoch,
            "permutation_seed": self._permutation_seed,
            "position": self._position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the cursor; a missing/unexpected key raises KeyError, a bad value
        TypeError or ValueError, each naming the key."""
        missing = [k for k in CURSOR_KEYS if k not in state]
        if missing:
            raise KeyError(f"data cursor is missing key(s): {', '.join(missing)}")
        unexpected = sorted(str(k) for k in state if k not in CURSOR_KEYS)
        if unexpected:
            raise KeyError(
                f"data cursor has unexpected key(s): {', '.join(unexpected)}; "
                f"expected: {', '.join(CURSOR_KEYS)}"
            )
        for key in CURSOR_KEYS:
            value = state[key]
            # bool is an int subclass, but a bool cursor is always a bug upstream.
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(
                    f"data cursor key {key!r} must be an int, got {type(value).__name__}"
                )
            if value < 0:
                raise ValueError(f"data cursor key {key!r} must be >= 0, got {value}")
        if state["position"] >= self.shard_length:
            raise ValueError(
                f"data cursor key 'position'={state['position']} is past the end of this "
                f"rank's shard ({self.shard_length} samples)"
            )
        self._epoch = state["epoch"]
        self._permutation_seed = state["permutation_seed"]
        self._position = state["position"]


def sample_source(
    ctx: WorkloadContext,
    num_samples: int,
    make_sample: Callable[[int], Sample],
    blank_sample: Callable[[], Sample],
) -> StatefulDataset:
    """A built-in's per-rank data source: a :class:`ShardedStream`, or with
    ``workload.loader`` the same samples through a ``StatefulDataLoader`` with workers."""
    t = ctx.training
    if ctx.loader is None:
        return ShardedStream(num_samples=num_samples, microbatch_size=t.microbatch_size,
                             rank=ctx.rank, world_size=ctx.world_size, seed=t.seed,
                             make_sample=make_sample, blank_sample=blank_sample)
    from resumequal.workloads.loader import builtin_loader

    return builtin_loader(ctx.loader, ctx, num_samples, make_sample, blank_sample)
