"""dropout-mlp: a small dropout classifier whose input path draws from every global RNG.

A sample's clean features and label depend only on (dataset seed, sample id). Augmentation
then draws from Python ``random``, ``np.random`` and the torch CPU RNG on purpose, like a
real input pipeline: a resume that does not restore those RNGs feeds different inputs.
With ``augment: false`` and ``dropout: 0`` the workload uses no randomness at all after
initialisation.
"""

from __future__ import annotations

import random

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from resumequal.workloads.base import Microbatch, Workload, WorkloadContext, parse_params
from resumequal.workloads.builtin import builtin_workload
from resumequal.workloads.stream import Sample, sample_generator

# Spread of a sample around its class centre; wide enough that classes overlap.
_CLASS_SPREAD = 0.8


class DropoutMLPParams(BaseModel):
    """Parameters of ``dropout-mlp`` (``workload.params``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    in_features: int = Field(default=32, ge=1)
    hidden: int = Field(default=64, ge=1)
    classes: int = Field(default=8, ge=2)
    dropout: float = Field(default=0.1, ge=0, lt=1)
    num_samples: int = Field(default=4096, ge=1)
    augment: bool = True


class DropoutMLP(nn.Sequential):
    """Linear-ReLU-Dropout twice, then a linear classifier."""

    def __init__(self, params: DropoutMLPParams) -> None:
        p = params
        super().__init__(
            nn.Linear(p.in_features, p.hidden), nn.ReLU(), nn.Dropout(p.dropout),
            nn.Linear(p.hidden, p.hidden), nn.ReLU(), nn.Dropout(p.dropout),
            nn.Linear(p.hidden, p.classes),
        )


class GaussianClasses:
    """Builds sample ``i``: a label and a point near that label's centre, then augments it."""

    def __init__(self, params: DropoutMLPParams, seed: int) -> None:
        self.params = params
        self.seed = seed
        centres = torch.Generator().manual_seed(seed)
        self.centres = torch.randn(params.classes, params.in_features, generator=centres)

    def clean(self, sample_id: int) -> Sample:
        """Features and label of ``sample_id`` before augmentation (no global RNG)."""
        g = sample_generator(self.seed, sample_id)
        label = torch.randint(self.params.classes, (), generator=g)
        noise = torch.randn(self.params.in_features, generator=g)
        return self.centres[label] + _CLASS_SPREAD * noise, label

    def __call__(self, sample_id: int) -> Sample:
        features, label = self.clean(sample_id)
        if self.params.augment:
            features = self._augment(features)
        return features, label

    def _augment(self, x: torch.Tensor) -> torch.Tensor:
        n = self.params.in_features
        x = x * (0.9 + 0.2 * random.random())
        x = x + torch.from_numpy(np.random.normal(0.0, 0.05, size=n)).to(torch.float32)
        x = x + 0.05 * torch.randn(n)
        return x * (torch.rand(n) >= 0.05)  # drop ~5% of the features

    def blank(self) -> Sample:
        """A fixed sample for synthetic microbatches."""
        n = self.params.in_features
        return torch.linspace(-1.0, 1.0, n), torch.tensor(0)


def loss_fn(model: nn.Module, microbatch: Microbatch) -> torch.Tensor:
    """Mean cross entropy over the microbatch."""
    device = next(model.parameters()).device
    features, labels = microbatch.data
    return F.cross_entropy(model(features.to(device)), labels.to(device))


def build(ctx: WorkloadContext) -> Workload:
    """The ``dropout-mlp`` reference workload."""
    params = parse_params(DropoutMLPParams, ctx.params)
    return builtin_workload("dropout-mlp", ctx, params, num_samples=params.num_samples,
                            model=DropoutMLP(params).to(ctx.device),
                            samples=GaussianClasses(params, ctx.training.seed), loss_fn=loss_fn)
