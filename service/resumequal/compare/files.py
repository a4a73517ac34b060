"""What a finished run location holds, read back for the comparator.

A run location (:class:`~resumequal.run.location.RunLocation`, a folder or an object
store) has the spec, and per leg its trace (read through :mod:`resumequal.run.traces`), its
beacons and, unless the spec names a checkpoint store, its checkpoints. This module only
reads; it never imports the worker side (``resumequal.train``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from resumequal.checkpoint import checkpoint_location
from resumequal.checkpoint.layout import Position
from resumequal.checkpoint.reading import VerifiedCheckpoint
from resumequal.errors import CheckpointError, StoreError, TraceError
from resumequal.run.location import RunLocation
from resumequal.spec import REFERENCE_LEG, QualificationSpec
from resumequal.store import StoreNotFound
from resumequal.trace.records import (
    ArmRecord,
    CompiledRecord,
    InventoryRecord,
    RestoreRecord,
    SavedRecord,
    StepRecord,
    TraceRecord,
    effective_steps,
)

LEGS: tuple[str, str] = (REFERENCE_LEG, "preempted")

_R = TypeVar("_R", StepRecord, InventoryRecord, RestoreRecord, ArmRecord, CompiledRecord,
             SavedRecord)


def final_checkpoint(
    spec: QualificationSpec, location: RunLocation, leg: str
) -> VerifiedCheckpoint | None:
    """The leg's final checkpoint (``step-T``) where it lies, read through its
    authenticated manifest: every byte checked as it is read, nothing copied.

    A failure (not committed, refused, unreachable) is a CheckpointError naming the file;
    None for a store this process cannot read.
    """
    try:
        # Its manifest must name this run (the location's seal says which) and this leg.
        run = location.seal.run if location.seal is not None else None
        # An object store's root names a working folder for saves; reading writes none.
        where = checkpoint_location(spec.checkpoint.store or location.uri,
                                    spec.checkpoint.store_settings,
                                    Path(tempfile.gettempdir()), leg, run=run)
    except CheckpointError:
        return None
    name = Position(spec.training.steps).name
    try:
        return where.final(name)
    except StoreError as e:
        raise CheckpointError(f"cannot read the {leg} leg's {where.uri(name)}: {e}") from e


@dataclass
class LegTrace:
    """Every trace record one leg wrote, per rank, and what could not be read."""

    leg: str
    world_size: int
    ranks: dict[int, list[TraceRecord]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, location: RunLocation, leg: str, world_size: int) -> LegTrace:
        out = cls(leg, world_size)
        traces = location.traces(leg)
        for rank in range(world_size):
            try:
                out.ranks[rank] = traces.records(rank)
            except StoreNotFound:
                out.problems.append(f"the {leg} leg has no trace of rank {rank} "
                                    f"({traces.uri(rank)})")
            except (TraceError, StoreError) as e:
                out.problems.append(f"the {leg} leg's trace of rank {rank} is unreadable: {e}")
        return out

    def of(self, kind: type[_R], rank: int | None = None) -> Iterator[_R]:
        """Records of one kind, in file order, for one rank or all of them."""
        ranks = [rank] if rank is not None else sorted(self.ranks)
        for r in ranks:
            for record in self.ranks.get(r, []):
                if isinstance(record, kind):
                    yield record

    @cached_property
    def effective(self) -> dict[int, dict[int, StepRecord]]:
        """Rank -> step -> the record of what the leg finally did at that step."""
        return {r: effective_steps(records, r) for r, records in self.ranks.items()}

    def attempt_steps(self, attempt: int) -> dict[int, dict[int, StepRecord]]:
        """Rank -> step -> record, for the steps one attempt ran."""
        out: dict[int, dict[int, StepRecord]] = {r: {} for r in self.ranks}
        for record in self.of(StepRecord):
            if record.attempt == attempt:
                out[record.rank][record.step] = record
        return out

    def attempts(self) -> list[int]:
        """Every attempt that wrote anything, on any rank."""
        return sorted({rec.attempt for records in self.ranks.values() for rec in records})
