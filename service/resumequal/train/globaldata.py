"""Global data for a resize run: which microbatches a rank runs in a world of any size.

A resize run (``preemption.resize``) fixes each optimizer step's data over all ranks, not
per rank: step ``s`` consumes ``G = accumulationSteps x world.worldSize`` microbatches at
any world size. In a world of ``W`` ranks, rank ``r`` runs ``G / W`` microbatches per
step, microstep ``m`` being global microbatch ``j = m*W + r``; microbatch ``j`` reads the
samples at its global position and, before it is built and run, every RNG of the process
is seeded from (seed, step, j). The samples and random streams of a step are then the same
whichever ranks run them; only the order of the reduction changes with the world.

The rank-keyed negative controls plant what an implementation keyed by rank gets wrong:
``rank_cursor`` takes the samples, ``rank_rng`` the random streams, of microbatch
``m*W0 + r`` (``W0`` the spec's world size) as if the world had never resized.
"""

from __future__ import annotations

from dataclasses import dataclass

from resumequal.errors import TrainingError
from resumequal.spec import QualificationSpec
from resumequal.spec.omissions import planted
from resumequal.workloads.stream import splitmix64


def microbatch_seed(seed: int, step: int, index: int) -> int:
    """The seed of global microbatch ``index`` of ``step``: mixed, so neighbours differ."""
    return splitmix64(splitmix64(splitmix64(seed) ^ step) ^ index) & ((1 << 63) - 1)


@dataclass(frozen=True)
class Slot:
    """One microbatch a rank runs: its global index, and where its samples and RNG come
    from (the same index, unless a rank-keyed control plants otherwise)."""

    index: int
    data_index: int
    rng_index: int


@dataclass(frozen=True)
class GlobalData:
    """The microbatches of one rank in a world of ``world_size`` ranks."""

    global_microbatches: int
    spec_world_size: int
    world_size: int
    rank: int
    microbatch_size: int
    seed: int
    rank_cursor: bool = False
    rank_rng: bool = False

    @classmethod
    def of(cls, spec: QualificationSpec, rank: int, world_size: int,
           omit: frozenset[str]) -> GlobalData:
        """For this rank; TrainingError if the world cannot share a step's microbatches."""
        g = spec.global_microbatches
        if g % world_size:
            raise TrainingError(
                f"a step's {g} microbatches do not divide among {world_size} ranks")
        return cls(g, spec.world.world_size, world_size, rank, spec.training.microbatch_size,
                   spec.training.seed, planted(omit, "data"), planted(omit, "rng"))

    @property
    def microsteps(self) -> int:
        """Microbatches this rank runs per optimizer step."""
        return self.global_microbatches // self.world_size

    def slot(self, microstep: int) -> Slot:
        """Microstep ``microstep`` of this rank."""
        index = microstep * self.world_size + self.rank
        keyed = microstep * self.spec_world_size + self.rank
        return Slot(index, keyed if self.rank_cursor else index,
                    keyed if self.rank_rng else index)

    def position(self, step: int, data_index: int) -> int:
        """The global position of the first sample of microbatch ``data_index`` of ``step``."""
        return ((step - 1) * self.global_microbatches + data_index) * self.microbatch_size

    def seed_of(self, step: int, rng_index: int) -> int:
        return microbatch_seed(self.seed, step, rng_index)
