"""A workload whose one module computes differently in a resumed process, for zoom's tests.

``dropout-mlp`` with a module ``mix`` after its hidden layer that adds a small multiple of
each row's sum. The sum's association order depends on the process's history: a process
that has run every forward call the model has seen (its call count has reached the
checkpointed count ``seen``) sums in one order, a resumed process in another. The two
sums differ in their last bits, so a resume of this workload is not exact, and the
difference arises in ``mix`` alone. Its gradient is the same in both orders.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch
from torch import nn

from resumequal.workloads import dropout_mlp
from resumequal.workloads.base import Workload, WorkloadContext


class HistoryMix(nn.Module):
    """x + 0.01 * sum(x), summed in an order that depends on the process's history."""

    def __init__(self) -> None:
        super().__init__()
        # Checkpointed with the model: every forward call the model has seen.
        self.register_buffer("seen", torch.zeros((), dtype=torch.int64))
        self.calls = 0  # this process's calls only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fresh = self.calls >= int(self.seen)
        self.calls += 1
        with torch.no_grad():
            self.seen += 1
        total = x.sum(-1, keepdim=True) if fresh else x.flip(-1).cumsum(-1)[..., -1:]
        return x + 0.01 * total


def build(ctx: WorkloadContext) -> Workload:
    """``dropout-mlp`` with ``mix`` between its hidden layer and its second activation."""
    base = dropout_mlp.build(ctx)
    layers = list(base.model.children())
    names = ("input", "act1", "drop1", "hidden", "act2", "drop2", "out")
    modules = OrderedDict(zip(names, layers, strict=True))
    ordered: OrderedDict[str, nn.Module] = OrderedDict()
    for name, module in modules.items():
        ordered[name] = module
        if name == "hidden":
            ordered["mix"] = HistoryMix().to(ctx.device)
    # The same parameter objects: the optimizer built over them still holds them.
    return dataclasses.replace(base, model=nn.Sequential(ordered),
                               description={**base.description, "name": "history-mix"})
