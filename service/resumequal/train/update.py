"""The arithmetic of one optimizer update: each microbatch's forward and backward (the
gradients kept local until the last), unscaling and clipping, and the optimizer and
scheduler steps.

What the loop traces around them, and when it checkpoints, is :mod:`resumequal.train.loop`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from resumequal.trace.records import LossScaleRecord
from resumequal.train.capture import StepCapture, named_optimizer_tensors
from resumequal.train.precision import Precision, scaler_state
from resumequal.train.recording import named_state, parameter_names, unwrapped
from resumequal.train.state import LiveState
from resumequal.workloads.base import Microbatch


def forward_backward(live: LiveState, precision: Precision, mb: Microbatch, accum: int, *,
                     sync: bool) -> torch.Tensor:
    """One microbatch's forward and backward, its loss divided by ``accum`` (and scaled under
    fp16); without ``sync`` the gradients accumulate locally. Returns the unscaled loss."""
    with nullcontext() if sync else no_sync(live.model):
        loss = precision.loss(live.workload.loss_fn, live.model, mb)
        scaled = loss / accum
        if live.scaler is not None:
            scaled = live.scaler.scale(scaled)
        scaled.backward()
    return loss


def unscale_and_clip(live: LiveState, params: list[nn.Parameter], clip_norm: float | None
                     ) -> tuple[LossScaleRecord | None, torch.Tensor]:
    """Unscale the gradients (fp16) and clip them; the loss scale this step ran with and
    the gradients' total norm before clipping."""
    # The scaler's state this step ran with (update() in step_optimizer moves it on).
    loss_scale = None
    if live.scaler is not None:
        scale, tracker = scaler_state(live.scaler)
        loss_scale = LossScaleRecord(scale=scale, growth_tracker=tracker)
        live.scaler.unscale_(live.workload.optimizer)
    if clip_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, clip_norm, foreach=False)
    else:
        grads = [p.grad for p in params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, foreach=False)
    if isinstance(norm, DTensor):  # FSDP2: the norm over every rank's shards
        norm = norm.full_tensor()
    return loss_scale, norm


def step_optimizer(live: LiveState, cap: StepCapture | None) -> None:
    """Step the optimizer (through the scaler) and the scheduler, then zero the grads."""
    w = live.workload
    if live.scaler is not None:
        # Skips the optimizer step when the unscaled gradients hold inf or NaN.
        live.scaler.step(w.optimizer)
        live.scaler.update()
    else:
        w.optimizer.step()
    if w.scheduler is not None:
        w.scheduler.step()
    if cap is not None:
        cap.stage("params", named_state(live.model))
        cap.stage("optimizer_state", named_optimizer_tensors(
            w.optimizer, parameter_names(unwrapped(live.model))).items())
    w.optimizer.zero_grad(set_to_none=True)


@contextmanager
def no_sync(model: nn.Module) -> Iterator[None]:
    """Keep the gradients of the backward passes inside local: no all-reduce (DDP), no
    reduce-scatter (FSDP2)."""
    if isinstance(model, DDP):
        with model.no_sync():
            yield
    elif isinstance(model, FSDPModule):
        # FSDP2 accumulates unsharded gradients and reduce-scatters only when this is True.
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
    else:
        yield
