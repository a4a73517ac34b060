"""Buffers kept equal on every rank, so that a checkpoint's one copy of each is every rank's.

DDP keeps parameters equal on every rank, not buffers: a BatchNorm's running statistics
are updated from each rank's own batches. DCP saves what every rank holds under one name
once, and a resumed rank gets that one copy back, another rank's statistics
(``docs/resume-defects.md``). Where ``torch.nn.SyncBatchNorm`` cannot run (it needs a CUDA
device), a factory calls :func:`sync_buffers_after_step`: every rank takes rank 0's buffers
after each optimizer step, so each periodic checkpoint holds what every rank has.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = ["sync_buffers_after_step"]


def sync_buffers_after_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                            src: int = 0) -> RemovableHandle:
    """After every step of ``optimizer``, broadcast ``model``'s buffers from rank ``src``
    (a no-op outside a process group of two or more ranks); the hook's handle.

    Rank 0's, not an average: integer buffers (``num_batches_tracked``) cannot be averaged,
    and a broadcast is what DDP's own ``broadcast_buffers`` does at each forward."""

    def broadcast(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return
        with torch.no_grad():
            for buffer in model.buffers():
                dist.broadcast(buffer, src)

    return optimizer.register_step_post_hook(broadcast)
