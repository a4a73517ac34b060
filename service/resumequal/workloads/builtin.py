"""What the reference workloads share: a model and its samples made into a Workload.

The model trains on the spec's optimizer and schedule, its samples come through
:func:`~resumequal.workloads.stream.sample_source`, and the description names the workload.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel
from torch import nn

from resumequal.workloads.base import LossFn, Workload, WorkloadContext
from resumequal.workloads.optim import build_optimizer, build_scheduler
from resumequal.workloads.stream import Sample, sample_source


class Samples(Protocol):
    """A reference workload's samples: sample ``i``, and a fixed one for synthetic data."""

    def __call__(self, sample_id: int) -> Sample: ...

    def blank(self) -> Sample: ...


def builtin_workload(name: str, ctx: WorkloadContext, params: BaseModel, *, num_samples: int,
                     model: nn.Module, samples: Samples, loss_fn: LossFn) -> Workload:
    """``model`` on the spec's optimizer and schedule, trained on ``num_samples`` samples."""
    training = ctx.training
    optimizer = build_optimizer(model.parameters(), training.optimizer)
    return Workload(
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, training.schedule, training.steps),
        dataset=sample_source(ctx, num_samples, samples, samples.blank),
        loss_fn=loss_fn,
        description={
            "name": name,
            "params": params.model_dump(),
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )
