"""The numeric precision one rank trains in: autocast of forward and loss, the fp16 scaler.

Made from ``training.precision`` (and ``training.gradScaler``) for the device the rank
trains on. The loop and the reducer prime compute every loss through
:meth:`Precision.loss`, so both see the same graph; the loop owns the scaler this module
makes (its state is checkpointed with the rank state, see :mod:`resumequal.train.state`).

A device whose torch cannot autocast to the dtype is refused before training: torch
itself only warns and runs the region in fp32, which would qualify fp32 under a bf16 label.

fp16 under FSDP2 (``parallelism.kind: fsdp2``): each rank holds only its shard of the
gradients, so the scaler's inf/NaN check must be agreed across ranks, or one rank would
skip an update another makes. torch's DTensor does that (its dispatch all-reduces the
``found_inf`` of ``_amp_foreach_non_finite_check_and_unscale_`` with MAX over the mesh), so
the plain ``torch.amp.GradScaler`` serves; a torch whose DTensor lacks that is refused.
"""

from __future__ import annotations

import warnings
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from resumequal.errors import TrainingError
from resumequal.spec import GradScalerSpec, TrainingSpec
from resumequal.workloads.base import LossFn, Microbatch

DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(training: TrainingSpec, device_type: str,
                    parallelism: str = "ddp") -> None:
    """TrainingError naming ``training.precision`` when this torch cannot train in it on
    ``device_type`` (``cpu`` or ``cuda``) with ``parallelism`` (``parallelism.kind``)."""
    name = training.precision
    dtype = DTYPES.get(name)
    if dtype is None:
        return
    where = f"training.precision={name}: torch {torch.__version__} on {device_type}"
    if not torch.amp.is_autocast_available(device_type):
        raise TrainingError(f"{where} has no autocast")
    if device_type == "cuda" and dtype == torch.bfloat16 \
            and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise TrainingError(f"{where}: this GPU has no native bf16; use fp16 or fp32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast(device_type, dtype=dtype):
            enabled = torch.is_autocast_enabled(device_type)
            got = torch.get_autocast_dtype(device_type)
    if not enabled or got != dtype:
        said = f" ({caught[0].message})" if caught else ""
        raise TrainingError(f"{where} cannot autocast to {dtype}{said}; use fp32")
    if name == "fp16":
        try:
            torch.amp.GradScaler(device_type)
        except (RuntimeError, ValueError, AssertionError) as e:
            raise TrainingError(f"{where} has no GradScaler: {e}") from e
        if parallelism == "fsdp2" and not dtensor_agrees_on_found_inf():
            raise TrainingError(
                f"{where} with parallelism.kind=fsdp2: each rank holds only its shard of the "
                "gradients and this torch's DTensor does not all-reduce the GradScaler's "
                "inf/NaN check, so ranks could disagree on skipping a step; use bf16 or fp32")


def dtensor_agrees_on_found_inf() -> bool:
    """Whether DTensor reduces the GradScaler's ``found_inf`` over the mesh (a handler in a
    private torch module, hence probed)."""
    try:
        from torch.distributed.tensor import _dispatch
    except ImportError:  # pragma: no cover - depends on the torch build
        return False
    return hasattr(_dispatch, "found_inf_reduce_handler")


@dataclass(frozen=True)
class Precision:
    """How one rank computes its losses, and the loss scaler it trains with, if any."""

    device_type: str
    dtype: torch.dtype | None
    scaler_spec: GradScalerSpec | None

    @classmethod
    def of(cls, training: TrainingSpec, device: torch.device,
           parallelism: str = "ddp") -> Precision:
        """The precision ``training`` asks for on ``device`` with ``parallelism``, once
        checked to work there."""
        check_precision(training, device.type, parallelism)
        fp16 = training.precision == "fp16"
        return cls(device.type, DTYPES.get(training.precision),
                   training.grad_scaler if fp16 else None)

    def autocast(self) -> AbstractContextManager[object]:
        """The region forward and loss run in: autocast to the dtype, or nothing (fp32)."""
        if self.dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def loss(self, loss_fn: LossFn, model: nn.Module, mb: Microbatch) -> torch.Tensor:
        """``loss_fn(model, mb)`` in this precision (backward runs outside autocast, as
        torch's AMP recipe has it)."""
        with self.autocast():
            return loss_fn(model, mb)

    def new_scaler(self) -> torch.amp.GradScaler | None:
        """A fresh loss scaler for fp16, None otherwise."""
        s = self.scaler_spec
        if s is None:
            return None
        return torch.amp.GradScaler(self.device_type, init_scale=s.init_scale,
                                    growth_factor=s.growth_factor,
                                    backoff_factor=s.backoff_factor,
                                    growth_interval=s.growth_interval)


def scaler_state(scaler: torch.amp.GradScaler) -> tuple[float, int]:
    """(scale, growth tracker) of ``scaler``: what the next step will run with."""
    state = scaler.state_dict()
    return float(state["scale"]), int(state["_growth_tracker"])
