"""What the ranks of a leg agree on around a checkpoint: a decision taken by rank 0 and
broadcast, every rank's error gathered (the same list on every rank), which ranks' part of a
DCP save or load failed, and whether a background save may be committed.

Collectives and words only: no store, no checkpoint files.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from resumequal.errors import CheckpointError, StoreError

__all__ = ["WriteState", "broadcast", "commit_decision", "failures", "gather_errors",
           "store_failures"]


class WriteState(IntEnum):
    """Where one rank's background write stands; gathered from every rank at a poll."""

    WRITING = 0
    WRITTEN = 1
    FAILED = 2


def commit_decision(states: Sequence[int], name: str) -> bool:
    """Whether a background save may be committed, from every rank's ``WriteState``.

    True only when every rank has written its part. A failure on any rank is an error on
    every rank (naming the ranks), even while others are still writing: the checkpoint
    can never be committed, and waiting for the others would gain nothing.
    """
    failed = [r for r, s in enumerate(states) if s == WriteState.FAILED]
    if failed:
        raise CheckpointError(
            f"background write of {name} failed on rank(s) {', '.join(map(str, failed))}"
        )
    return all(s == WriteState.WRITTEN for s in states)


def broadcast(value: Any, group: dist.ProcessGroup | None = None) -> Any:
    """Rank 0's ``value``, on every rank."""
    holder = [value]
    dist.broadcast_object_list(holder, src=0, group=group)
    return holder[0]


def store_failures(error: BaseException) -> list[str]:
    """``"rank N: ..."`` for every rank whose DCP write failed on the store (an upload of a
    shard sent while written), from DCP's exception, which carries every rank's."""
    return failures(error, StoreError)


def failures(error: BaseException, kind: type[BaseException]) -> list[str]:
    """``"rank N: ..."`` for every rank whose part of a DCP save or load failed with a
    ``kind``, from DCP's exception, which carries every rank's; ``"ranks N, M: ..."`` for
    ranks that failed alike (those of a node refused by one of them)."""
    if not isinstance(error, CheckpointException):
        return []
    ranks: dict[str, list[int]] = {}  # the ranks of a node fail alike: each error once
    for r, (exc, _) in sorted(error.failures.items()):
        if isinstance(exc, kind):
            ranks.setdefault(str(exc), []).append(r)
    return [f"{'rank' if len(rs) == 1 else 'ranks'} {', '.join(map(str, rs))}: {text}"
            for text, rs in ranks.items()]


def gather_errors(error: str | None, world_size: int,
                   group: dist.ProcessGroup | None = None) -> list[str]:
    """Every rank's error, ``"rank N: ..."``; the same list on every rank."""
    gathered: list[str | None] = [None] * world_size
    dist.all_gather_object(gathered, error, group=group)
    return [f"rank {r}: {e}" for r, e in enumerate(gathered) if e is not None]
