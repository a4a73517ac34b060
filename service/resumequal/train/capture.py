"""Full-tensor capture of one training step, for ``resumequal zoom``.

During the captured step every module of the model carries a forward hook (its inputs and
outputs) and a full backward hook (the gradient that reaches its outputs and the one it
passes to its inputs); the loop adds the stages between modules and the optimizer: the
rank-local gradients before the reduction, the reduced and clipped gradients, the
parameters and optimizer state before and after. Every tensor is copied to the CPU as it
is seen, and the whole capture is written once, with ``torch.save``, to a local file that
only the zoom process that started this replay reads back (``weights_only``); its format
is in :mod:`resumequal.trace.capture`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.hooks import RemovableHandle

from resumequal.trace.capture import CAPTURE_FORMAT, ROOT

log = logging.getLogger(__name__)


def _copy(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, DTensor):  # FSDP2: this rank's shard
        t = t.to_local()
    return t.detach().to("cpu", copy=True)


def _tensors(value: Any) -> Iterator[torch.Tensor | None]:
    """The tensors in a module's inputs or outputs, in a stable order (None kept, so a
    position means the same thing in both legs)."""
    if value is None or isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, Mapping):
        for k in sorted(value, key=str):
            yield from _tensors(value[k])


def _copies(value: Any) -> list[torch.Tensor | None]:
    return [None if t is None else _copy(t) for t in _tensors(value)]


def named_optimizer_tensors(optimizer: torch.optim.Optimizer,
                            names: Mapping[int, str]) -> dict[str, torch.Tensor]:
    """The optimizer's per-parameter state as ``<param>.<key>`` tensors (numbers as 0-d)."""
    out: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for i, param in enumerate(group["params"]):
            for key, value in sorted((optimizer.state.get(param) or {}).items()):
                pname = names.get(id(param)) or f"#{i}"
                out[f"{pname}.{key}"] = _copy(value) if isinstance(value, torch.Tensor) \
                    else torch.tensor(float(value), dtype=torch.float64)
    return out


@dataclass
class StepCapture:
    """Everything one rank saw during step ``step``; :meth:`save` writes it."""

    step: int
    rank: int
    microstep: int = 0
    calls: list[dict[str, Any]] = field(default_factory=list)
    stages: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    buckets: list[dict[str, Any]] = field(default_factory=list)
    module_params: dict[str, list[str]] = field(default_factory=dict)
    _counts: dict[tuple[str, str, int], int] = field(default_factory=dict)

    def _record(self, module: str, phase: str, inputs: list[torch.Tensor | None],
                outputs: list[torch.Tensor | None]) -> None:
        key = (module, phase, self.microstep)
        call = self._counts.get(key, 0)
        self._counts[key] = call + 1
        self.calls.append({"module": module, "phase": phase, "microstep": self.microstep,
                           "call": call, "inputs": inputs, "outputs": outputs})

    @contextmanager
    def hooks(self, model: nn.Module) -> Iterator[None]:
        """Forward and full backward hooks on every module of ``model`` while inside."""
        handles: list[RemovableHandle] = []
        for name, module in model.named_modules():
            path = name or ROOT
            self.module_params[path] = [f"{name}.{p}" if name else p
                                        for p, _ in module.named_parameters(recurse=False)]

            def forward(mod: nn.Module, args: Any, kwargs: Any, output: Any,
                        path: str = path) -> None:
                self._record(path, "forward", _copies((args, kwargs)), _copies(output))

            def backward(mod: nn.Module, grad_input: Any, grad_output: Any,
                         path: str = path) -> None:
                # What reaches the module from above, and what it sends below.
                self._record(path, "backward", _copies(grad_output), _copies(grad_input))

            handles.append(module.register_forward_hook(forward, with_kwargs=True))
            handles.append(module.register_full_backward_hook(backward))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def stage(self, name: str, tensors: Iterable[tuple[str, torch.Tensor | None]]) -> None:
        """Copy a stage's named tensors (gradients, parameters, optimizer state)."""
        self.stages[name] = {n: _copy(t) for n, t in tensors if t is not None}

    def save(self, path: Path) -> None:
        """Write the capture to ``path`` (a local file), atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"format": CAPTURE_FORMAT, "step": self.step, "rank": self.rank,
                    "calls": self.calls, "stages": self.stages, "buckets": self.buckets,
                    "module_params": self.module_params}, tmp)
        tmp.replace(path)
        log.info("rank %d: captured step %d (%d module calls) into %s", self.rank, self.step,
                 len(self.calls), path)
