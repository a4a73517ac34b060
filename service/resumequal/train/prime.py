"""The DDP reducer prime: rebuild gradient buckets before the first real batch.

A freshly constructed DDP reducer starts with buckets in parameter order and rebuilds them
from the gradient-ready order it observes during its first synchronised backward. The
reference leg rebuilds after step 1; a resumed leg would rebuild after its first resumed
step, so that step reduces with a different layout (on gloo with 3+ ranks, different
bits). The prime runs one protected, non-optimising synthetic forward/backward through the
normal loss path in every fresh process, asks the reducer to rebuild, and verifies that no
training state moved.

Uses DDP's private ``reducer._rebuild_buckets``; guarded by a feature check.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from resumequal.errors import TrainingError
from resumequal.trace.digest import named_tensors_digest, optimizer_state_digest, rng_digests
from resumequal.train.precision import Precision
from resumequal.train.state import LiveState, capture_rng, restore_rng

log = logging.getLogger(__name__)


def check_supported(model: nn.Module) -> None:
    """Fail clearly when this torch lacks the private API the prime relies on."""
    reducer = getattr(model, "reducer", None)
    if not isinstance(model, DDP) or reducer is None or not hasattr(reducer, "_rebuild_buckets"):
        raise TrainingError(
            f"ddp.reducerPrime needs DistributedDataParallel.reducer._rebuild_buckets, which "
            f"torch {torch.__version__} does not provide; set ddp.reducerPrime: false"
        )


def _snapshot(live: LiveState) -> dict[str, Any]:
    w = live.workload
    inner = live.model.module if isinstance(live.model, DDP) else live.model
    return {
        "parameters and buffers": named_tensors_digest(
            [(f"p:{n}", p.detach()) for n, p in inner.named_parameters()]
            + [(f"b:{n}", b) for n, b in inner.named_buffers()]
        ),
        "gradients": named_tensors_digest([(n, p.grad) for n, p in inner.named_parameters()]),
        "optimizer state": optimizer_state_digest(w.optimizer),
        "scheduler state": repr(w.scheduler.state_dict()) if w.scheduler is not None else None,
        "RNG states": rng_digests(),
        "loss scaler": repr(live.scaler.state_dict()) if live.scaler is not None else None,
        "counters": live.counters.as_tuple(),
        "data cursor": repr(w.dataset.state_dict()),
    }


def prime_reducer(live: LiveState, precision: Precision) -> None:
    """Run the synthetic backward (its loss in the leg's ``precision``, unscaled: only the
    order gradients become ready in matters), rebuild buckets, and prove nothing else
    changed."""
    model = live.model
    check_supported(model)
    assert isinstance(model, DDP)
    w = live.workload
    inner = model.module
    before = _snapshot(live)
    rng = capture_rng()
    pending = {n: p.grad for n, p in inner.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in inner.named_buffers()}
    for p in inner.parameters():
        p.grad = None
    try:
        loss = precision.loss(w.loss_fn, model, w.dataset.synthetic_microbatch())
        loss.backward()
        rebuilt = bool(model.reducer._rebuild_buckets())
    finally:
        with torch.no_grad():
            for n, b in inner.named_buffers():
                b.copy_(buffers[n])
        for n, p in inner.named_parameters():
            p.grad = pending[n]
        restore_rng(rng)
    after = _snapshot(live)
    changed = [k for k in before if before[k] != after[k]]
    if changed:
        raise TrainingError(
            "the reducer prime changed training state it must not touch: " + ", ".join(changed)
            + "; the workload's synthetic_microbatch or loss path has side effects"
        )
    if not rebuilt:
        raise TrainingError(
            "the reducer prime ran but DDP did not rebuild its buckets (already rebuilt, or "
            "find_unused_parameters without static_graph); the layout would differ on resume"
        )
    log.info("rank %d: DDP reducer primed; buckets rebuilt", live.rank)
