"""Optimizers and learning-rate schedules built from the spec.

Schedules are ``LambdaLR`` with small callable classes rather than lambdas: ``LambdaLR``
saves a callable object's attributes in its ``state_dict`` (a lambda it silently drops),
and the object pickles into a checkpoint.
"""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler
from torch.optim.optimizer import ParamsT

from resumequal.spec import OptimizerSpec, ScheduleSpec


def build_optimizer(params: ParamsT, spec: OptimizerSpec) -> torch.optim.Optimizer:
    """The optimizer named by ``spec`` on the single-tensor (``foreach=False``) code path."""
    # foreach/fused kernels reorder the arithmetic; the plain loop is one path on every stack.
    if spec.name == "adamw":
        return torch.optim.AdamW(
            params, lr=spec.lr, betas=spec.betas, eps=spec.eps,
            weight_decay=spec.weight_decay, foreach=False,
        )
    if spec.name == "adam":
        return torch.optim.Adam(
            params, lr=spec.lr, betas=spec.betas, eps=spec.eps,
            weight_decay=spec.weight_decay, foreach=False,
        )
    return torch.optim.SGD(
        params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay,
        foreach=False,
    )


class ConstantFactor:
    """lr multiplier 1 at every step."""

    def __call__(self, step: int) -> float:
        return 1.0


class StepDecayFactor:
    """lr multiplier ``gamma ** (step // step_size)``."""

    def __init__(self, step_size: int, gamma: float) -> None:
        self.step_size = step_size
        self.gamma = gamma

    def __call__(self, step: int) -> float:
        return float(self.gamma ** (step // self.step_size))


class WarmupCosineFactor:
    """Linear warmup, then cosine from 1 down to ``min_lr_ratio`` at ``total_steps``.

    ``step`` counts completed optimizer steps. Warmup: ``(step + 1) / (warmup_steps + 1)``
    for ``step < warmup_steps`` (never 0, so the first update moves the parameters).
    After it: ``min + (1 - min) * (1 + cos(pi * p)) / 2`` with
    ``p = (step - warmup_steps) / (total_steps - warmup_steps)`` clamped to ``[0, 1]``.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> None:
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps
        self.min_lr_ratio = min_lr_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def build_scheduler(
    optimizer: torch.optim.Optimizer, spec: ScheduleSpec, total_steps: int
) -> LRScheduler:
    """A ``LambdaLR`` for ``spec``, to be stepped once per optimizer step."""
    factor: ConstantFactor | StepDecayFactor | WarmupCosineFactor
    if spec.kind == "constant":
        factor = ConstantFactor()
    elif spec.kind == "step":
        factor = StepDecayFactor(spec.step_size, spec.gamma)
    else:
        factor = WarmupCosineFactor(spec.warmup_steps, total_steps, spec.min_lr_ratio)
    return LambdaLR(optimizer, lr_lambda=factor)
