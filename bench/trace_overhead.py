"""Per-step trace cost as a fraction of a tiny-gpt step (target: at most 3%).

Runs the default tiny-gpt workload on one CPU thread, wrapped in DDP over a one-rank gloo
group with the training loop's own comm hook (gradient accumulation under ``no_sync``, as
the loop does), and in the same loop times exactly the trace work the training loop does
per step: RNG digests at step start, digests of the local gradients inside the comm hook as
each bucket is reduced, of the reduced and clipped gradients, of parameters and buffers
after the update, of the optimizer state, and one StepRecord written to the trace of a run
folder. It runs twice,
side by side: with a digest per tensor (what the loop does: each boundary's tensors, the
whole-boundary digest derived from them, all written in the record) and with one digest per
boundary over all its tensors (what it did before), and prints both.

    python bench/trace_overhead.py [--steps N] [--hashes] [--params JSON]
    # at the size of a small real model (91M parameters, a 1.17 GB checkpoint with AdamW):
    python bench/trace_overhead.py --steps 4 --params \
        '{"d_model": 768, "n_layers": 12, "n_heads": 12, "vocab_size": 8192, "seq_len": 128}'

``--hashes`` also prints the hash comparison behind the choice of xxh3-128.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import xxhash
from torch.nn.parallel import DistributedDataParallel as DDP

from resumequal.run.location import RunLocation
from resumequal.spec import DDPSpec, TrainingSpec, WorkloadSpec
from resumequal.trace.digest import (
    bucket_layout_digest,
    named_tensors_digest,
    optimizer_digests,
    optimizer_state_digest,
    rng_digests,
    tensor_digests,
)
from resumequal.trace.records import (
    MicrostepRecord,
    StepRecord,
    TensorDigests,
    TraceWriter,
)
from resumequal.train.recording import GradRecorder, local_digests
from resumequal.workloads import load_workload
from resumequal.workloads.base import WorkloadContext

TARGET = 0.03
WARMUP_STEPS = 2


class Stopwatch:
    """Accumulates seconds per label for the steps after warmup."""

    def __init__(self) -> None:
        self.seconds: dict[str, list[float]] = {}
        self._last = time.perf_counter()
        self.measuring = False

    def lap(self, label: str) -> None:
        """Charge the time since the previous lap to ``label``."""
        now = time.perf_counter()
        if self.measuring:
            self.seconds.setdefault(label, []).append(now - self._last)
        self._last = now

    def move(self, seconds: float, source: str, target: str) -> None:
        """Charge ``seconds`` of the last ``source`` lap to a new ``target`` lap instead."""
        if self.measuring:
            self.seconds[source][-1] -= seconds
            self.seconds.setdefault(target, []).append(seconds)

    def mean_ms(self, labels: tuple[str, ...]) -> float:
        """Mean per-step milliseconds of the given labels together."""
        return sum(statistics.mean(self.seconds[label]) for label in labels) * 1e3


TRAIN_LABELS = ("forward/backward", "clip", "optimizer step")
DIGEST_LABELS = ("rng", "local grads", "reduced grads", "clipped grads", "params+buffers",
                 "optimizer", "record")


class _TimedRecorder(GradRecorder):
    """The loop's comm hook, its digests of each bucket timed; ``per_bucket``: one digest
    per bucket, as the hook did before per-tensor digests."""

    def __init__(self, names: dict[int, str], per_bucket: bool) -> None:
        super().__init__(names)
        self.per_bucket = per_bucket
        self.seconds = 0.0

    def digest(self, params: list[str], grads: list[torch.Tensor]) -> None:
        t0 = time.perf_counter()
        if self.per_bucket:
            self.local[f"bucket-{len(self.local)}"] = named_tensors_digest(
                list(zip(params, grads, strict=True)))
        else:
            super().digest(params, grads)
        self.seconds += time.perf_counter() - t0


def run_steps(steps: int, trace_dir: Path, *, per_tensor: bool,
              params: dict[str, Any] | None = None) -> tuple[Stopwatch, int]:
    """Train ``steps`` measured steps after a warmup, timing training and trace work apart;
    ``per_tensor``: a digest per tensor, else one per boundary."""
    training = TrainingSpec()
    ctx = WorkloadContext(
        params={}, training=training, rank=0, world_size=1, device=torch.device("cpu")
    )
    torch.manual_seed(training.seed)
    w = load_workload(WorkloadSpec(params=params or {}), ctx)
    model, opt = w.model, w.optimizer
    params = list(model.named_parameters())
    names = {id(p): n for n, p in params}
    numel = sum(p.numel() for _, p in params)
    ddp = DDP(model, bucket_cap_mb=DDPSpec().bucket_cap_mb)
    recorder = _TimedRecorder(dict(names), per_bucket=not per_tensor)
    ddp.register_comm_hook(None, lambda state, bucket: recorder.hook(state, bucket))
    acc = training.accumulation_steps
    clip = training.grad_clip_norm or float("inf")
    watch = Stopwatch()

    # The sink a worker writes through: one segment object per record in a run folder.
    sink = RunLocation.open(str(trace_dir)).trace_sink("control", rank=0, attempt=0)
    with TraceWriter(sink) as writer:
        for step in range(1, steps + WARMUP_STEPS + 1):
            watch.measuring = step > WARMUP_STEPS
            started_at = time.time()
            watch.lap("between steps")
            rng = rng_digests()
            watch.lap("rng")

            recorder.reset()
            recorder.seconds = 0.0
            microsteps = []
            for index in range(acc):
                mb = w.dataset.next_microbatch()
                # Only the last microbatch reduces (and so runs the hook), as in the loop.
                with contextlib.nullcontext() if index == acc - 1 else ddp.no_sync():
                    loss = w.loss_fn(ddp, mb)
                    (loss / acc).backward()
                microsteps.append(
                    MicrostepRecord(index=index, sample_ids=mb.sample_ids, loss=loss.item())
                )
            watch.lap("forward/backward")
            watch.move(recorder.seconds, "forward/backward", "local grads")

            grads = [(n, p.grad) for n, p in params]
            tensors = TensorDigests()
            if per_tensor:
                local = recorder.local_digest()
                tensors.local_grads.update(local_digests(model, recorder.local))
            else:
                local = "sha256:" + hashlib.sha256("\n".join(
                    d for _, d in sorted(recorder.local.items())).encode()).hexdigest()
            buckets = recorder.layout()
            watch.lap("local grads")
            # One rank: the reduced gradients are the local ones, digested again.
            reduced = _boundary(grads, tensors.reduced_grads, per_tensor)
            watch.lap("reduced grads")

            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
            watch.lap("clip")
            clipped = _boundary([(n, p.grad) for n, p in params], tensors.clipped_grads,
                                per_tensor)
            watch.lap("clipped grads")
            lr = [float(g["lr"]) for g in opt.param_groups]
            opt.step()
            if w.scheduler is not None:
                w.scheduler.step()
            opt.zero_grad(set_to_none=True)
            watch.lap("optimizer step")

            params_digest = _boundary(
                list(itertools.chain(model.named_parameters(), model.named_buffers())),
                tensors.params, per_tensor)
            watch.lap("params+buffers")
            if per_tensor:
                digests = optimizer_digests(opt, names)
                optimizer_digest = digests.whole
                tensors.optimizer_state.update(digests.tensors)
            else:
                optimizer_digest = optimizer_state_digest(opt)
            watch.lap("optimizer")
            writer.write(
                StepRecord(
                    rank=0,
                    attempt=0,
                    step=step,
                    microsteps=microsteps,
                    rng=rng,
                    local_grads=local,
                    bucket_layout=bucket_layout_digest(buckets),
                    buckets=buckets,
                    reduced_grads=reduced,
                    grad_norm=grad_norm,
                    clipped_grads=clipped,
                    lr=lr,
                    params=params_digest,
                    optimizer_state=optimizer_digest,
                    started_at=started_at,
                    finished_at=time.time(),
                    tensors=tensors if per_tensor else None,
                )
            )
            watch.lap("record")
    return watch, numel


def _boundary(items: list[tuple[str, torch.Tensor | None]], into: dict[str, str],
              per_tensor: bool) -> str:
    """One boundary's digest: derived from per-tensor digests (kept in ``into``), or one
    digest over every tensor."""
    if not per_tensor:
        return named_tensors_digest(items)
    digests = tensor_digests(items)
    into.update(digests.tensors)
    return digests.whole


def _best_ms(fn: Callable[[], object], repeat: int = 5, number: int = 20) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best * 1e3


def compare_hashes() -> None:
    """Print ms to hash ~10 MB of float32 and ~40 mixed-size tensors with each candidate."""
    g = torch.Generator().manual_seed(0)
    big = torch.randn(10 * 2**20 // 4, generator=g)
    sizes = [64, 4096, 16384, 512, 65536, 65536, 128, 1, 131072, 3000]
    mixed = [torch.randn(sizes[i % len(sizes)], generator=g) for i in range(40)]
    mixed_mb = sum(t.numel() * 4 for t in mixed) / 2**20

    def raw(t: torch.Tensor) -> Any:
        return t.contiguous().reshape(-1).view(torch.uint8).numpy().data

    candidates: dict[str, Callable[[], Any]] = {
        "blake2b-128": lambda: hashlib.blake2b(digest_size=16),
        "sha256": hashlib.sha256,
        "xxh3_128": xxhash.xxh3_128,
    }
    print(f"{'hash':12s} {'10 MiB':>10s} {'GB/s':>7s} {f'40 tensors ({mixed_mb:.1f} MiB)':>24s}")
    for name, make in candidates.items():

        def one(make: Callable[[], Any] = make) -> None:
            h = make()
            h.update(raw(big))
            h.hexdigest()

        def many(make: Callable[[], Any] = make) -> None:
            h = make()
            for t in mixed:
                h.update(raw(t))
            h.hexdigest()

        one_ms = _best_ms(one)
        rate = 10 * 2**20 / (one_ms / 1e3) / 1e9
        print(f"{name:12s} {one_ms:8.2f}ms {rate:7.2f} {_best_ms(many):22.2f}ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="measured steps (after warmup)")
    parser.add_argument("--hashes", action="store_true", help="also compare hash functions")
    parser.add_argument("--params", type=json.loads, default={},
                        help="tiny-gpt's parameters (JSON), e.g. a larger model")
    args = parser.parse_args(argv)

    # One thread, as each rank runs by default (world.threads_per_rank), in a one-rank group
    # so that DDP runs its reducer and the loop's comm hook as in a leg.
    torch.set_num_threads(1)
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    if args.hashes:
        compare_hashes()
        print()
    # Alternate the two, so that a loaded machine weighs on both alike.
    watches: dict[bool, list[Stopwatch]] = {True: [], False: []}
    numel = 0
    for per_tensor in (True, False, True, False):
        with tempfile.TemporaryDirectory() as tmp:
            watch, numel = run_steps(args.steps // 2, Path(tmp), per_tensor=per_tensor,
                                     params=args.params)
        watches[per_tensor].append(watch)

    def mean_ms(per_tensor: bool, labels: tuple[str, ...]) -> float:
        return statistics.mean(w.mean_ms(labels) for w in watches[per_tensor])

    acc = TrainingSpec().accumulation_steps
    print(f"tiny-gpt, {numel:,} parameters, {args.steps} steps after {WARMUP_STEPS} warmup "
          "for each way of digesting")
    print(f"  {'':18s} {'per tensor':>12s} {'per boundary':>14s}")
    for label in TRAIN_LABELS + DIGEST_LABELS:
        print(f"  {label:18s} {mean_ms(True, (label,)):9.3f} ms "
              f"{mean_ms(False, (label,)):11.3f} ms")
    ratios: dict[bool, float] = {}
    for per_tensor in (True, False):
        step_ms = mean_ms(per_tensor, TRAIN_LABELS)
        digest_ms = mean_ms(per_tensor, DIGEST_LABELS)
        ratios[per_tensor] = digest_ms / step_ms
        how = "per tensor  " if per_tensor else "per boundary"
        print(f"{how}: step {step_ms:7.2f} ms ({acc} microbatches + clip + optimizer), digests "
              f"{digest_ms:6.2f} ms (rng, 3x grads, params+buffers, optimizer, 1 record): "
              f"{ratios[per_tensor]:6.2%}")
    print(f"per-tensor digests cost {ratios[True] / ratios[False]:.2f}x the per-boundary ones")
    ok = ratios[True] <= TARGET
    print(f"per tensor: {'PASS' if ok else f'OVER TARGET ({TARGET:.0%})'}")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
