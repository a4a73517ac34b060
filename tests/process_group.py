"""A single-process gloo group (rank 0 of 1) over a FileStore: what a worker's checkpoint
manager has, without a network or a second process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist


@contextmanager
def single_rank_group(folder: Path) -> Iterator[None]:
    """Rank 0 of 1, its store a file under ``folder``; destroyed on the way out."""
    assert not dist.is_initialized()
    store = dist.FileStore(str(folder / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()
