"""FSDP2 (``parallelism.kind: fsdp2``): which modules are sharded, the sharding itself, and
what the trace sees of the gradients before their reduce-scatter.

``fully_shard`` goes on each repeated block (the elements of every ``nn.ModuleList``, e.g.
tiny-gpt's transformer blocks) and then on the root; a model without a ``ModuleList``
shards each direct child that has parameters. Each sharded module is one reduce-scatter
group: FSDP2's counterpart of a DDP bucket, except that it is fixed when the model is
wrapped and never rebuilt, so there is no bucket layout to trace and no reducer to prime.

``fully_shard`` replaces every parameter with a sharded one, while a workload builds its
optimizer on the model it made: :func:`rebind_optimizer` points the (still empty)
optimizer at the sharded parameters, by name.

The rank-local gradients before the reduce-scatter are observed by a custom reduce-scatter
(FSDP2's ``set_custom_reduce_scatter``) that digests each group's input buffer (this rank's
unsharded, accumulated gradients laid out per destination rank, zero-padded) and then runs
the same collective FSDP2's default does (``reduce_scatter_single``, or in an older torch
``reduce_scatter_tensor``). The interface it implements lives in a private torch module
(torch >= 2.9): :mod:`resumequal.spec.capabilities` refuses fsdp2 on a torch without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from resumequal.errors import TrainingError
from resumequal.trace.digest import tensor_digest
from resumequal.train.recording import joined_digest


def _reduce_scatter_base() -> type | None:
    """FSDP2's custom reduce-scatter interface (torch >= 2.9), from a private module."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter
    except ImportError:  # pragma: no cover - depends on the torch build
        return None
    return ReduceScatter


# What FSDP2's default reduce-scatter calls in this torch: ``reduce_scatter_single`` where
# it exists, else ``reduce_scatter_tensor`` (the same collective under its older name).
_reduce_scatter: Any = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)


def shard_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules to ``fully_shard`` before the root, by qualified name, in module order:
    every element with parameters of an ``nn.ModuleList`` not inside another such element
    (a block's own lists stay in the block), or else every direct child with parameters."""
    blocks: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer, _ in blocks)
        if isinstance(module, nn.ModuleList) and not inside:  # the outermost lists only
            blocks += [(f"{name}.{i}", block) for i, block in enumerate(module)
                       if any(True for _ in block.parameters())]
    if blocks:
        return blocks
    return [(name, child) for name, child in model.named_children()
            if any(True for _ in child.parameters())]


@dataclass
class ReduceScatterRecorder:
    """Digests of what this rank sends into each group's reduce-scatter, by group name."""

    local: dict[str, str] = field(default_factory=dict)

    def reset(self) -> None:
        self.local = {}

    def local_digest(self) -> str:
        return joined_digest(self.local)


def _recording_comm(recorder: ReduceScatterRecorder, group_name: str) -> Any:
    base = _reduce_scatter_base()
    if base is None:
        raise TrainingError(
            f"parallelism.kind=fsdp2 traces gradients before their reduce-scatter through "
            f"FSDP2's custom reduce-scatter, which torch {torch.__version__} does not provide")

    class _Recording(base):  # type: ignore[misc,valid-type]
        """FSDP2's default reduce-scatter, digesting its input first."""

        def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                     device: torch.device) -> torch.Tensor:
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                     group: dist.ProcessGroup, op: Any,
                     async_op: bool = False) -> dist.Work | None:
            recorder.local[group_name] = tensor_digest(input_tensor)
            work: dist.Work | None = _reduce_scatter(
                output_tensor, input_tensor, group=group, op=op, async_op=async_op)
            return work

    return _Recording()


def shard_model(model: nn.Module, device: torch.device, world_size: int,
                recorder: ReduceScatterRecorder) -> nn.Module:
    """``fully_shard`` each unit of :func:`shard_units`, then the root, on a 1-D mesh of all
    ranks; each group's reduce-scatter reports to ``recorder``. Returns the root (the same
    module, now an ``FSDPModule``)."""
    mesh = init_device_mesh(device.type, (world_size,))
    units = shard_units(model)
    for _, unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for name, unit in [*units, ("<root>", model)]:
        assert isinstance(unit, FSDPModule)
        unit.set_custom_reduce_scatter(_recording_comm(recorder, name))
    return model


def rebind_optimizer(optimizer: torch.optim.Optimizer, names: dict[int, str],
                     sharded: nn.Module) -> None:
    """Point ``optimizer``'s param groups at ``sharded``'s parameters of the same names (the
    optimizer must not have stepped yet: it has no state to move)."""
    if optimizer.state:
        raise TrainingError("the workload's optimizer already holds state; parallelism.kind="
                            "fsdp2 shards the model before the first step")
    now = dict(sharded.named_parameters())
    for group in optimizer.param_groups:
        rebound = []
        for p in group["params"]:
            name = names.get(id(p))
            if name is None or name not in now:
                raise TrainingError(
                    "the workload's optimizer holds a parameter that is not the model's; "
                    "parallelism.kind=fsdp2 can only shard parameters of the model")
            rebound.append(now[name])
        group["params"] = rebound
