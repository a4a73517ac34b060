"""Image classifiers as users write them: synthetic images through a StatefulDataLoader.

``cnn`` is a small network of a user's own (two convolutions, a BatchNorm2d, dropout),
``resnet18`` torchvision's ResNet-18 on small images. Both train with AdamW under a
warm-up and cosine schedule (the spec's), fed by a ``DistributedSampler`` in a
``StatefulDataLoader`` built from ``workload.loader``. Under DDP each rank updates its
BatchNorm statistics from its own batches; ``sync_buffers: true`` makes every rank take
rank 0's after each step (:func:`resumequal.workloads.buffers.sync_buffers_after_step`), and
``sync_batchnorm: true`` converts the BatchNorms to ``SyncBatchNorm`` (CUDA only).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn
from torch.utils.data import Dataset, DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

from resumequal.workloads.base import Microbatch, Workload, WorkloadContext, parse_params
from resumequal.workloads.buffers import sync_buffers_after_step
from resumequal.workloads.loader import loader_options
from resumequal.workloads.optim import build_optimizer, build_scheduler
from resumequal.workloads.stream import sample_generator

CLASSES = 10


class Params(BaseModel):
    """``workload.params`` of the image classifiers."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    image_size: int = 8
    samples: int = 256
    sync_buffers: bool = False
    sync_batchnorm: bool = False


class Images(Dataset[dict[str, Any]]):
    """Random images and labels, each a function of its sample id alone."""

    def __init__(self, samples: int, size: int, seed: int) -> None:
        self.samples, self.size, self.seed = samples, size, seed

    def __len__(self) -> int:
        return self.samples

    def __getitem__(self, sample_id: int) -> dict[str, Any]:
        g = sample_generator(self.seed, sample_id)
        x = torch.randn(3, self.size, self.size, generator=g)
        y = int(torch.randint(0, CLASSES, (1,), generator=g))
        return {"sample_id": sample_id, "x": x, "y": y}


class SmallCNN(nn.Module):
    """Two convolutions with a BatchNorm2d between, dropout before the classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.1), nn.Linear(16, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


def loss_fn(model: nn.Module, microbatch: Microbatch) -> torch.Tensor:
    device = next(model.parameters()).device
    batch = microbatch.data
    return nn.functional.cross_entropy(model(batch["x"].to(device)), batch["y"].to(device))


def _workload(ctx: WorkloadContext, model: nn.Module, p: Params) -> Workload:
    t = ctx.training
    if p.sync_batchnorm:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(ctx.device)
    optimizer = build_optimizer(model.parameters(), t.optimizer)
    if p.sync_buffers:
        sync_buffers_after_step(model, optimizer)
    dataset = Images(p.samples, p.image_size, t.seed)
    sampler = DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank,
                                 shuffle=True, seed=t.seed, drop_last=True)
    options = loader_options(ctx.loader) if ctx.loader is not None else {}
    loader = StatefulDataLoader(dataset, batch_size=t.microbatch_size, sampler=sampler,
                                drop_last=True, **options)
    return Workload(model=model, optimizer=optimizer,
                    scheduler=build_scheduler(optimizer, t.schedule, t.steps),
                    dataset=loader,  # type: ignore[arg-type]  # wrapped by load_workload
                    loss_fn=loss_fn)


def cnn(ctx: WorkloadContext) -> Workload:
    """The user's small CNN with a BatchNorm2d."""
    return _workload(ctx, SmallCNN(), parse_params(Params, ctx.params))


def resnet18(ctx: WorkloadContext) -> Workload:
    """torchvision's ResNet-18, random weights, on small images."""
    from torchvision.models import resnet18 as build

    return _workload(ctx, build(num_classes=CLASSES), parse_params(Params, ctx.params))
