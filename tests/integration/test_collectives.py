"""Checks that need a real process group: restored counters must agree on every rank."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from resumequal.errors import CheckpointError
from resumequal.train.loop import check_counters_agree
from resumequal.train.state import Counters
from testing.ports import free_port


def _worker(
    rank: int, port: int, counters: list[tuple[int, int, int]], out: dict[int, str]
) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    try:
        check_counters_agree(Counters(*counters[rank]), torch.device("cpu"))
        out[rank] = "ok"
    except CheckpointError as e:
        out[rank] = str(e)
    finally:
        dist.destroy_process_group()


def _run(counters: list[tuple[int, int, int]]) -> dict[int, str]:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), counters, out), nprocs=2, join=True)
        return dict(out)


def test_agreeing_counters_pass() -> None:
    assert _run([(5, 1, 16), (5, 1, 16)]) == {0: "ok", 1: "ok"}


def test_disagreeing_step_stops_every_rank_naming_ranks_and_values() -> None:
    out = _run([(5, 0, 15), (4, 0, 12)])
    for rank in (0, 1):
        assert out[rank].startswith("ranks restored different counters")
        assert "step: rank 0=5, rank 1=4" in out[rank]
        assert "global_microstep: rank 0=15, rank 1=12" in out[rank]
        assert "microstep: rank 0=0" not in out[rank]


@pytest.mark.parametrize("counters", [[(3, 2, 11), (3, 1, 10)]])
def test_disagreeing_microstep_is_named(counters: list[tuple[int, int, int]]) -> None:
    out = _run(counters)
    assert "microstep: rank 0=2, rank 1=1" in out[0]
