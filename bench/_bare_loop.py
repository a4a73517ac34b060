"""A bare training loop: the floor that ``bench/harness_overhead.py`` measures against.

Run under torchrun, one process per rank. Builds the spec's workload exactly as a leg
does (same seeds, threads and determinism settings), wraps it as ``parallelism.kind`` says
— DDP, or FSDP2's ``fully_shard`` on the same blocks and the root with the optimizer
pointed at the sharded parameters — and runs the same accumulation loop (gradient sync
off on all but the last microbatch, the spec's precision, clip, optimizer, scheduler) with
nothing else: no digests, no trace, no checkpoints, no reducer prime, no recording
reduce-scatter, no stop flag.

    torchrun --nproc-per-node 2 bench/_bare_loop.py --spec SPEC --out DIR

Each rank writes ``DIR/rank-N.json`` with its process start and per-step wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from resumequal.spec import load_spec
from resumequal.train.distributed import process_started_at
from resumequal.train.precision import Precision
from resumequal.train.recording import parameter_names
from resumequal.train.sharding import rebind_optimizer, shard_units
from resumequal.train.state import seed_everything
from resumequal.workloads import load_workload
from resumequal.workloads.base import WorkloadContext


def fsdp2(model: nn.Module, optimizer: torch.optim.Optimizer, world_size: int) -> nn.Module:
    """``fully_shard`` per block and at the root, as a leg shards (without its recorder)."""
    names = parameter_names(model)
    mesh = init_device_mesh("cpu", (world_size,))
    for _, unit in shard_units(model):
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    rebind_optimizer(optimizer, names, model)
    return model


@contextmanager
def sync(model: nn.Module, on: bool) -> Iterator[None]:
    """Gradient sync on or off for one microbatch, DDP's way or FSDP2's."""
    if on:
        yield
    elif isinstance(model, DDP):
        with model.no_sync():
            yield
    else:
        assert isinstance(model, FSDPModule)
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    spec = load_spec(args.spec)
    t = spec.training
    dist.init_process_group("gloo")
    joined_at = time.time()
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.set_num_threads(spec.world.threads_per_rank)
    if t.deterministic_algorithms:
        torch.use_deterministic_algorithms(True)
    # The leg's seeding: identical initialisation on every rank, then per-rank streams.
    seed_everything(t.seed)
    ctx = WorkloadContext(params=dict(spec.workload.params), training=t, rank=rank,
                          world_size=world_size, device=torch.device("cpu"))
    w = load_workload(spec.workload, ctx)
    kind = spec.parallelism.kind
    model = fsdp2(w.model, w.optimizer, world_size) if kind == "fsdp2" \
        else DDP(w.model, bucket_cap_mb=spec.ddp.bucket_cap_mb)
    precision = Precision.of(t, torch.device("cpu"), kind)
    scaler = precision.new_scaler()
    seed_everything(t.seed + 104729 * (rank + 1))
    built_at = time.time()

    accum = t.accumulation_steps
    params = [p for p in model.parameters() if p.requires_grad]
    started: list[float] = []
    finished: list[float] = []
    for _ in range(t.steps):
        started.append(time.time())
        for m in range(accum):
            mb = w.dataset.next_microbatch()
            with sync(model, m == accum - 1):
                loss = precision.loss(w.loss_fn, model, mb)
                scaled = loss / accum
                if scaler is not None:
                    scaled = scaler.scale(scaled)
                scaled.backward()
        if scaler is not None:
            scaler.unscale_(w.optimizer)
        if t.grad_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, t.grad_clip_norm, foreach=False)
        if scaler is not None:
            scaler.step(w.optimizer)
            scaler.update()
        else:
            w.optimizer.step()
        if w.scheduler is not None:
            w.scheduler.step()
        w.optimizer.zero_grad(set_to_none=True)
        finished.append(time.time())

    dist.destroy_process_group()
    args.out.mkdir(parents=True, exist_ok=True)
    body = {"rank": rank, "pid": os.getpid(), "process_started_at": process_started_at(),
            "joined_at": joined_at, "built_at": built_at,
            "started_at": started, "finished_at": finished}
    (args.out / f"rank-{rank}.json").write_text(json.dumps(body))


if __name__ == "__main__":
    main()
