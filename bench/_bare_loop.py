"""A bare DDP training loop: the floor that ``bench/harness_overhead.py`` measures against.

Run under torchrun, one process per rank. Builds the spec's workload exactly as a leg
does (same seeds, threads and determinism settings), wraps it in DDP and runs the same
accumulation loop — no_sync on all but the last microbatch, the spec's precision, clip,
optimizer, scheduler —
with nothing else: no digests, no trace, no checkpoints, no reducer prime, no stop flag.

    torchrun --nproc-per-node 2 bench/_bare_ddp.py --spec SPEC --out DIR

Each rank writes ``DIR/rank-N.json`` with its process start and per-step wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from resumequal.spec import load_spec
from resumequal.state import seed_everything
from resumequal.train.distributed import process_started_at
from resumequal.train.precision import Precision
from resumequal.workloads import load_workload
from resumequal.workloads.base import WorkloadContext


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
    model = DDP(w.model, bucket_cap_mb=spec.ddp.bucket_cap_mb)
    precision = Precision.of(t, torch.device("cpu"))
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
            with nullcontext() if m == accum - 1 else model.no_sync():
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
