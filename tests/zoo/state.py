"""Models that carry state beyond their parameters: an exponential moving average of the
weights (``torch.optim.swa_utils.AveragedModel``), a non-persistent buffer that changes as
it trains, and a weight-norm parametrization. A small MLP on a ``ShardedStream``, trained
with the spec's optimizer and schedule."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from resumequal.workloads.base import Microbatch, Workload, WorkloadContext
from resumequal.workloads.optim import build_optimizer, build_scheduler
from resumequal.workloads.stream import ShardedStream, sample_generator

FEATURES = 16


def _sample(sample_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(FEATURES, generator=sample_generator(0, sample_id))
    return x, x.sum().unsqueeze(0)


def loss_fn(model: nn.Module, microbatch: Microbatch) -> torch.Tensor:
    x, y = (t.to(next(model.parameters()).device) for t in microbatch.data)
    return nn.functional.mse_loss(model(x), y)


def _mlp() -> nn.Sequential:
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 1))


def _workload(ctx: WorkloadContext, model: nn.Module) -> Workload:
    t = ctx.training
    model = model.to(ctx.device)
    optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad],
                                t.optimizer)
    dataset = ShardedStream(num_samples=512, microbatch_size=t.microbatch_size, rank=ctx.rank,
                            world_size=ctx.world_size, seed=t.seed, make_sample=_sample,
                            blank_sample=lambda: (torch.zeros(FEATURES), torch.zeros(1)))
    return Workload(model=model, optimizer=optimizer,
                    scheduler=build_scheduler(optimizer, t.schedule, t.steps),
                    dataset=dataset, loss_fn=loss_fn)


class WithEMA(nn.Module):
    """A network and its exponential moving average, one module: the average's weights and
    its ``n_averaged`` are in the state_dict, so the checkpoint carries them."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _mlp()
        self.ema = AveragedModel(self.net, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        self.ema.requires_grad_(False)  # updated by the hook, never by the optimizer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def ema(ctx: WorkloadContext) -> Workload:
    """An MLP whose EMA is updated after every optimizer step."""
    model = WithEMA()
    workload = _workload(ctx, model)
    workload.optimizer.register_step_post_hook(
        lambda *_: model.ema.update_parameters(model.net))
    return workload


class CountingHead(nn.Module):
    """A layer that counts the calls it saw in a buffer left out of its state_dict (a
    statistic kept for logging, say) and scales its output by it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 1)
        self.register_buffer("calls", torch.zeros((), dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.calls += 1
        out: torch.Tensor = self.linear(x) * (1 + 1e-3 * self.calls)
        return out


def non_persistent(ctx: WorkloadContext) -> Workload:
    """An MLP whose head keeps a changing non-persistent buffer."""
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), CountingHead())
    return _workload(ctx, model)


def weight_normed(ctx: WorkloadContext) -> Workload:
    """An MLP whose layers are weight-normalised (a parametrization: ``original0`` and
    ``original1`` are what the optimizer trains)."""
    model = _mlp()
    weight_norm(model[0])
    weight_norm(model[3])
    return _workload(ctx, model)
