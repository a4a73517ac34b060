"""Optimizers and learning-rate schedules built from the spec.

Schedules are ``LambdaLR`` with small callable classes rather than lambdas: ``LambdaLR``
saves a callable object's attributes in its ``state_dict`` (a lambda it silently drops),
and the object pickles into a checkpoint.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import torch
from torch.optim import lr_scheduler
from torch.optim.lr_scheduler import LambdaLR, LRScheduler
from torch.optim.optimizer import ParamsT

from resumequal.built import (
    KEY_CHARS,
    MAX_HYPERPARAMETERS,
    MAX_NUMBERS,
    NAME_CHARS,
    TEXT_CHARS,
    BuiltOptimizer,
    Hyperparameter,
)
from resumequal.spec import OptimizerSpec, ScheduleSpec, TrainingSpec


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


def describe_built(optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None,
                   training: TrainingSpec) -> BuiltOptimizer:
    """What a workload built, and whether it is what ``training``'s optimizer and schedule
    build: the same classes and hyperparameters, the same schedule factors."""
    # The spec's own, built on a stand-in parameter: no RNG is drawn, nothing steps.
    reference = build_optimizer([torch.zeros(1, requires_grad=True)], training.optimizer)
    reference_schedule = build_scheduler(reference, training.schedule, training.steps)
    return BuiltOptimizer(
        optimizer=_class_name(optimizer, torch.optim),
        groups=len(optimizer.param_groups),
        hyperparameters=hyperparameters(optimizer),
        scheduler=None if scheduler is None else _class_name(scheduler, lr_scheduler),
        optimizer_from_spec=type(optimizer) is type(reference)
        and _unscheduled(optimizer) == _unscheduled(reference),
        schedule_from_spec=_same_schedule(scheduler, reference_schedule),
    )


def hyperparameters(optimizer: torch.optim.Optimizer) -> dict[str, Hyperparameter]:
    """The first param group's numbers, flags and strings (what is neither is left out)."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    out: dict[str, Hyperparameter] = {}
    for key in sorted(k for k in group if k != "params" and len(k) <= KEY_CHARS):
        value = _plain(group[key])
        if value is not None and len(out) < MAX_HYPERPARAMETERS:
            out[key] = value
    return out


def _plain(value: Any) -> Hyperparameter | None:
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value[:TEXT_CHARS]
    if isinstance(value, torch.Tensor) and value.numel() == 1:  # a capturable lr
        return float(value.item())
    if (isinstance(value, tuple | list) and 0 < len(value) <= MAX_NUMBERS
            and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)):
        return [float(v) for v in value]
    return None


def _class_name(obj: object, home: ModuleType) -> str:
    """``SGD`` for a class ``home`` exports, else ``module.Class``."""
    cls = type(obj)
    name: str = cls.__name__
    if getattr(home, name, None) is cls:
        return name
    return f"{cls.__module__}.{cls.__qualname__}"[:NAME_CHARS]


def _unscheduled(optimizer: torch.optim.Optimizer) -> dict[str, Hyperparameter]:
    """The hyperparameters with ``lr`` the base lr: what a scheduler has not scaled yet."""
    h = hyperparameters(optimizer)
    if "initial_lr" in h:
        h["lr"] = h.pop("initial_lr")
    return h


def _same_schedule(scheduler: LRScheduler | None, reference: LRScheduler) -> bool:
    """A LambdaLR whose every factor has the class and attributes of the reference's."""
    if type(scheduler) is not LambdaLR or type(reference) is not LambdaLR:
        return False
    want = _factor(reference.lr_lambdas[0])
    return all(_factor(f) == want for f in scheduler.lr_lambdas)


def _factor(factor: Any) -> tuple[type, dict[str, Any] | None]:
    # A factor class's attributes are its settings (LambdaLR saves them the same way).
    return type(factor), getattr(factor, "__dict__", None)
