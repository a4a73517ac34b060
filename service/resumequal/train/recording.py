"""What the loop digests of a model: the rank-local gradients DDP is about to all-reduce
(its comm hook), and each parameter's, gradient's, buffer's and optimizer tensor's digest
by name, for the trace's step, restore and save records.

FSDP2's counterpart of the comm hook, digesting what a rank sends into each reduce-scatter,
is :class:`resumequal.train.sharding.ReduceScatterRecorder`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from resumequal.trace.digest import (
    Digests,
    batched,
    named_tensors_digest,
    optimizer_digests,
    tensor_digests,
)
from resumequal.trace.records import BucketRecord


@dataclass
class GradRecorder:
    """A DDP comm hook that digests rank-local gradients before they are all-reduced."""

    names: dict[int, str]
    local: dict[str, str] = field(default_factory=dict)
    buckets: list[BucketRecord] = field(default_factory=list)
    # Under a capture (resumequal zoom), the local gradients themselves, not just digests.
    keep: bool = False
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def reset(self) -> None:
        self.local = {}
        self.buckets = []
        self.tensors = {}

    def hook(
        self, group: dist.ProcessGroup | None, bucket: dist.GradBucket
    ) -> torch.futures.Future[torch.Tensor]:
        params = [self.names[id(p)] for p in bucket.parameters()]
        self.digest(params, bucket.gradients())
        self.buckets.append(
            BucketRecord(index=bucket.index(), params=params, numel=bucket.buffer().numel())
        )
        # The same arithmetic as DDP's built-in allreduce: divide, then sum.
        buffer = bucket.buffer()
        pg = group if group is not None else dist.group.WORLD
        assert pg is not None
        buffer.div_(pg.size())
        work = dist.all_reduce(buffer, group=pg, async_op=True)
        assert work is not None
        reduced: torch.futures.Future[torch.Tensor] = work.get_future().then(
            lambda fut: fut.value()[0]
        )
        return reduced

    def digest(self, params: list[str], grads: list[torch.Tensor]) -> None:
        """Digest one bucket's rank-local gradients, each by its parameter's name."""
        with batched(grads):
            for name, grad in zip(params, grads, strict=True):
                self.local[name] = named_tensors_digest([(name, grad)])
                if self.keep:
                    self.tensors[name] = grad.detach().to("cpu", copy=True)

    def local_digest(self) -> str:
        return joined_digest(self.local)

    def layout(self) -> list[BucketRecord]:
        return sorted(self.buckets, key=lambda b: b.index)


def joined_digest(local: dict[str, str]) -> str:
    """One digest over a recorder's digests by name, in name order."""
    joined = "\n".join(f"{n}={d}" for n, d in sorted(local.items()))
    return "sha256:" + hashlib.sha256(joined.encode()).hexdigest()


def parameter_names(model: nn.Module) -> dict[int, str]:
    """``id(parameter) -> name``, taken before sharding replaces the parameters."""
    return {id(p): n for n, p in model.named_parameters()}


def unwrapped(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper; any other model as it is."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model


def param_digests(model: nn.Module) -> Digests:
    """Parameters and buffers, by name (their names never collide)."""
    return tensor_digests(named_state(model))


def unsaved_buffers(model: nn.Module) -> list[str]:
    """The buffers ``model.state_dict()`` leaves out (registered ``persistent=False``): a
    checkpoint never holds them, a resumed process has whatever the workload built."""
    saved = set(model.state_dict(keep_vars=True))
    return [n for n, _ in model.named_buffers() if n not in saved]


def named_state(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """Parameters (detached) and buffers, by name."""
    m = unwrapped(model)
    return [(n, p.detach()) for n, p in m.named_parameters()] + list(m.named_buffers())


def named_grads(model: nn.Module) -> list[tuple[str, torch.Tensor | None]]:
    """Each parameter's gradient (None where it has none), by the parameter's name."""
    return [(n, p.grad) for n, p in unwrapped(model).named_parameters()]


def grad_digests(model: nn.Module) -> Digests:
    """The gradients as they are now, by parameter name."""
    return tensor_digests(named_grads(model))


def optimizer_state_digests(model: nn.Module, optimizer: torch.optim.Optimizer) -> Digests:
    """The optimizer's state tensors, named by the parameters they belong to."""
    return optimizer_digests(optimizer, parameter_names(unwrapped(model)))


def _bare(digest: str) -> str:
    return digest.partition(":")[2] or digest


def local_digests(model: nn.Module, local: dict[str, str]) -> dict[str, str]:
    """The recorder's digests (by parameter under DDP, by sharded module under FSDP2) in the
    model's order, not the order the reductions ran in."""
    m = unwrapped(model)
    order = {n: i for i, n in enumerate(
        [n for n, _ in m.named_parameters()] + [n for n, _ in m.named_modules()])}
    return {n: _bare(local[n]) for n in sorted(local, key=lambda n: order.get(n, len(order)))}
