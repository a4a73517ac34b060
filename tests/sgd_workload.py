"""A factory that builds its own optimizer and schedule: ``dropout-mlp`` trained with SGD
(momentum) under a ``LambdaLR`` of its own, whatever ``training.optimizer`` and
``training.schedule`` say. What the reports must name is what it built."""

from __future__ import annotations

import dataclasses

import torch

from resumequal.workloads import dropout_mlp
from resumequal.workloads.base import Workload, WorkloadContext

LR, MOMENTUM = 0.05, 0.9


def decay(step: int) -> float:
    """A plain function: LambdaLR saves no state for it, and every process builds it alike."""
    return 0.9 ** step


def build(ctx: WorkloadContext) -> Workload:
    """``dropout-mlp`` with SGD and a LambdaLR of this module's own."""
    base = dropout_mlp.build(ctx)
    optimizer = torch.optim.SGD(base.model.parameters(), lr=LR, momentum=MOMENTUM,
                                foreach=False)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
    return dataclasses.replace(base, optimizer=optimizer, scheduler=scheduler,
                               description={**base.description, "name": "sgd-lambda"})
