"""``rank0_manager``: the checkpoint manager of tests that play rank 0 on a world-1 gloo
group (the ``single_process_group`` fixture)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from resumequal.checkpoint import CheckpointManager, CheckpointRoot, FolderRoot

# An async manager's gloo groups give up after this rather than torch's default 30 minutes.
GROUP_TIMEOUT = timedelta(seconds=30)


def rank0_manager(root: CheckpointRoot | Path, *, keep_last: int = 10, attempt: int = 0,
                  world_size: int = 1, async_save: bool = False) -> CheckpointManager:
    """Rank 0's manager on ``root`` (a folder when given a path), attempt 0 of one rank
    unless told otherwise."""
    where = FolderRoot(root) if isinstance(root, Path) else root
    return CheckpointManager(where, rank=0, world_size=world_size, attempt=attempt,
                             keep_last=keep_last, async_save=async_save,
                             group_timeout=GROUP_TIMEOUT)
