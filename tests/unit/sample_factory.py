"""Workload factories written the way a user would, for the load_workload tests."""

from __future__ import annotations

import torch
from torch import nn

from resumequal.workloads.base import Microbatch, Workload, WorkloadContext
from resumequal.workloads.optim import build_optimizer
from resumequal.workloads.stream import ShardedStream

NOT_A_FUNCTION = 42


def _sample(sample_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.full((4,), float(sample_id))
    return x, x.sum()


def _blank() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(4), torch.tensor(0.0)


def _loss(model: nn.Module, microbatch: Microbatch) -> torch.Tensor:
    x, y = microbatch.data
    return nn.functional.mse_loss(model(x).squeeze(-1), y)


def build(ctx: WorkloadContext) -> Workload:
    """A linear regression on 64 samples; ``ctx.params['width']`` is ignored but recorded."""
    model = nn.Linear(4, 1).to(ctx.device)
    dataset = ShardedStream(
        num_samples=64,
        microbatch_size=ctx.training.microbatch_size,
        rank=ctx.rank,
        world_size=ctx.world_size,
        seed=ctx.training.seed,
        make_sample=_sample,
        blank_sample=_blank,
    )
    return Workload(
        model=model,
        optimizer=build_optimizer(model.parameters(), ctx.training.optimizer),
        scheduler=None,
        dataset=dataset,
        loss_fn=_loss,
        description={"name": "sample-linear", "params": dict(ctx.params)},
    )


def returns_a_dict(ctx: WorkloadContext) -> object:
    """Forgets to wrap its parts in a Workload."""
    return {"model": nn.Linear(4, 1)}


def returns_a_list_dataset(ctx: WorkloadContext) -> Workload:
    """Hands over a plain list where a StatefulDataset belongs."""
    workload = build(ctx)
    workload.dataset = [1, 2, 3]  # type: ignore[assignment]
    return workload
