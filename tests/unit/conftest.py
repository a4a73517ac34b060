"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def single_process_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A single-process gloo group (rank 0 of 1) over a FileStore; no network."""
    assert not dist.is_initialized()
    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()
