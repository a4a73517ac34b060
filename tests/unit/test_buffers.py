"""Buffers kept equal on every rank (``sync_buffers_after_step``), and the buffers a
checkpoint never holds (``unsaved_buffers``)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from resumequal.train.recording import unsaved_buffers
from resumequal.workloads.buffers import sync_buffers_after_step


def _step(rank: int, synced: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if synced:
        sync_buffers_after_step(model, optimizer)
    model(torch.full((8, 3), float(rank + 1)) + torch.randn(8, 3)).sum().backward()
    optimizer.step()
    return {n: b.clone() for n, b in model.named_buffers()}


def _rank(rank: int, folder: str) -> None:
    store = dist.FileStore(f"{folder}/store", 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    try:
        torch.save({"plain": _step(rank, False), "synced": _step(rank, True)},
                   f"{folder}/rank-{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_takes_rank_0s_buffers_after_each_step(tmp_path: Path) -> None:
    mp.spawn(_rank, args=(str(tmp_path),), nprocs=2, join=True)
    plain, synced = ([torch.load(tmp_path / f"rank-{r}.pt")[kind] for r in range(2)]
                     for kind in ("plain", "synced"))
    assert not torch.equal(plain[0]["1.running_mean"], plain[1]["1.running_mean"])
    for name, tensor in synced[0].items():
        assert torch.equal(tensor, synced[1][name]), name
    assert torch.equal(synced[0]["1.running_mean"], plain[0]["1.running_mean"])


def test_a_single_process_is_left_alone() -> None:
    model = nn.BatchNorm1d(2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sync_buffers_after_step(model, optimizer)
    model(torch.randn(4, 2)).sum().backward()
    optimizer.step()  # no process group: nothing to broadcast, nothing raised


def test_unsaved_buffers_are_the_non_persistent_ones() -> None:
    model = nn.Sequential(nn.BatchNorm1d(2), nn.Linear(2, 2))
    model[1].register_buffer("calls", torch.zeros(()), persistent=False)
    model[1].register_buffer("kept", torch.zeros(()))
    assert unsaved_buffers(model) == ["1.calls"]
