"""What a finished run directory holds, read back for the comparator.

A run directory has ``run.json`` (the spec), and per leg ``<leg>/trace/rank-N.jsonl``,
``<leg>/beacons/`` and, unless the spec names a checkpoint store, ``<leg>/checkpoints/``.
This module only reads; it never imports the worker side (``resumequal.train``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from resumequal.checkpoint import checkpoint_location
from resumequal.checkpoint.layout import Position
from resumequal.errors import CheckpointError, StoreError, TraceError
from resumequal.spec import REFERENCE_LEG, QualificationSpec, SpecError, format_validation_error
from resumequal.trace.records import (
    ArmRecord,
    InventoryRecord,
    RestoreRecord,
    StepRecord,
    TraceRecord,
    effective_steps,
    read_trace,
)

RUN_FILE = "run.json"
LEGS: tuple[str, str] = (REFERENCE_LEG, "preempted")

_R = TypeVar("_R", StepRecord, InventoryRecord, RestoreRecord, ArmRecord)


def load_run_spec(run_dir: Path) -> QualificationSpec:
    """The spec a run directory was made for, from its ``run.json``."""
    path = run_dir / RUN_FILE
    try:
        data = json.loads(path.read_text())["spec"]
    except FileNotFoundError as e:
        raise SpecError(f"{run_dir} is not a run directory (no {RUN_FILE})") from e
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SpecError(f"{path}: unreadable run file: {e}") from e
    try:
        return QualificationSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, str(path))) from e


def trace_path(run_dir: Path, leg: str, rank: int) -> Path:
    return run_dir / leg / "trace" / f"rank-{rank}.jsonl"


def beacon_path(run_dir: Path, leg: str, attempt: int, rank: int) -> Path:
    return run_dir / leg / "beacons" / f"attempt-{attempt}-rank-{rank}.json"


def final_checkpoint_root(
    spec: QualificationSpec, run_dir: Path, leg: str, scratch: Path
) -> Path | None:
    """A local folder holding the leg's final checkpoint (``step-T``) as a checkpoint root.

    In a folder that is the leg's checkpoint root itself. On an object store, ``step-T``
    is downloaded into ``scratch/<leg>/`` with every object checked against the manifest's
    sha256; a failure (not committed, tampered, unreachable) is a CheckpointError naming
    the object. None for a store this process cannot read.
    """
    try:
        where = checkpoint_location(spec.checkpoint.store, spec.checkpoint.s3, run_dir, leg)
    except CheckpointError:
        return None
    name = Position(spec.training.steps).name
    try:
        return where.final_root(name, scratch / leg)
    except StoreError as e:
        raise CheckpointError(f"cannot download the {leg} leg's {where.uri(name)}: {e}") from e


@dataclass
class LegTrace:
    """Every trace record one leg wrote, per rank, and what could not be read."""

    leg: str
    world_size: int
    ranks: dict[int, list[TraceRecord]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, run_dir: Path, leg: str, world_size: int) -> LegTrace:
        out = cls(leg, world_size)
        for rank in range(world_size):
            path = trace_path(run_dir, leg, rank)
            if not path.is_file():
                out.problems.append(f"the {leg} leg has no trace of rank {rank} ({path})")
                continue
            try:
                out.ranks[rank] = read_trace(path)
            except TraceError as e:
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
