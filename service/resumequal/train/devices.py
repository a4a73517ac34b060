"""What a model's modules need of the device its legs train on, checked before they train.

``torch.nn.SyncBatchNorm`` computes its statistics with collectives on CUDA tensors only: on
the CPU its first training forward raises. Found when the workload is built (the trial
build before anything launches, and each worker), it is refused with the module named and
what to do instead, not an INVALID qualification after a leg crashed.
"""

from __future__ import annotations

import torch
from torch import nn

from resumequal.spec import SpecError

__all__ = ["check_trains_on"]

# Devices SyncBatchNorm synchronises on (torch.nn.modules.batchnorm.SyncBatchNorm.forward).
_SYNC_BN_DEVICES = frozenset({"cuda", "hpu", "xpu"})


def check_trains_on(model: nn.Module, device: torch.device, workload: str) -> None:
    """SpecError naming ``workload`` when a module of ``model`` cannot train on ``device``."""
    if device.type in _SYNC_BN_DEVICES:
        return
    synced = [name or "(model)" for name, m in model.named_modules()
              if isinstance(m, nn.SyncBatchNorm)]
    if synced:
        shown = ", ".join(synced[:3]) + (f" and {len(synced) - 3} more" if len(synced) > 3
                                         else "")
        raise SpecError(
            f"workload.name {workload!r}: the model has SyncBatchNorm ({shown}), which torch "
            f"runs on CUDA devices only, and the legs train on {device.type} here: keep "
            "BatchNorm and make its buffers equal on every rank before each save "
            "(resumequal.workloads.buffers.sync_buffers_after_step), or train on CUDA")
