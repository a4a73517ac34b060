"""Per-step trace cost as a fraction of a tiny-gpt step (target: at most 3%).

Runs the default tiny-gpt workload (one CPU thread, or a GPU with ``--device cuda``),
wrapped in DDP over a one-rank group with the training loop's own comm hook (gradient
accumulation under ``no_sync``, as the loop does), and in the same loop times exactly the
trace work the training loop does per step: RNG digests at step start, digests of the local
gradients inside the comm hook as each bucket is reduced, of the reduced and clipped
gradients, of parameters and buffers after the update, of the optimizer state, and one
StepRecord written to the trace of a run folder. It runs once per digest algorithm, side by
side and alternating: ``xxh3_128`` (each tensor's bytes copied to the host and hashed there)
and ``wsum128`` (each tensor fingerprinted on its device, 16 bytes each to the host), and
holds the target to the one a run picks there (``comparison.digest: auto``).

    python bench/trace_overhead.py [--steps N] [--hashes] [--params JSON | --size 1b]
        [--device cuda] [--bandwidth]
    # at the size of a small real model (91M parameters, a 1.17 GB checkpoint with AdamW):
    python bench/trace_overhead.py --steps 4 --params \
        '{"d_model": 768, "n_layers": 12, "n_heads": 12, "vocab_size": 8192, "seq_len": 128}'
    # on a GPU at 1B parameters, with the fingerprint's GB/s against a copy's (make bench-device):
    python bench/trace_overhead.py --device cuda --size 1b --steps 6 --bandwidth

``--hashes`` also prints the hash comparison behind the choice of xxh3-128; ``--bandwidth``
the fingerprint's throughput on the device against the device's own copy throughput.
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
from resumequal.spec import ComparisonSpec, DDPSpec, TrainingSpec, WorkloadSpec
from resumequal.spec.sections import DIGEST_ALGORITHMS, DigestAlgorithm
from resumequal.trace import digest, fingerprint
from resumequal.trace.digest import (
    bucket_layout_digest,
    optimizer_digests,
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
# tiny-gpt at about a billion parameters (1.02e9: 19 blocks of width 2048, 32k tokens).
SIZES: dict[str, dict[str, int]] = {
    "1b": {"d_model": 2048, "n_layers": 19, "n_heads": 16, "vocab_size": 32000,
           "seq_len": 512},
}


class Stopwatch:
    """Accumulates seconds per label for the steps after warmup."""

    def __init__(self, device: torch.device) -> None:
        self.seconds: dict[str, list[float]] = {}
        self.device = device
        self._last = time.perf_counter()
        self.measuring = False

    def lap(self, label: str) -> None:
        """Charge the time since the previous lap to ``label`` (once the device is done)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
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
    """The loop's comm hook, its digests of each bucket timed."""

    def __init__(self, names: dict[int, str], device: torch.device) -> None:
        super().__init__(names)
        self.device = device
        self.seconds = 0.0

    def digest(self, params: list[str], grads: list[torch.Tensor]) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        super().digest(params, grads)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds += time.perf_counter() - t0


def run_steps(steps: int, trace_dir: Path, *, algorithm: DigestAlgorithm,
              device: torch.device, params: dict[str, Any] | None = None
              ) -> tuple[Stopwatch, int]:
    """Train ``steps`` measured steps after a warmup on ``device``, timing training and the
    trace work (digests with ``algorithm``) apart."""
    digest.use(algorithm)
    training = TrainingSpec()
    ctx = WorkloadContext(params={}, training=training, rank=0, world_size=1, device=device)
    torch.manual_seed(training.seed)
    w = load_workload(WorkloadSpec(params=params or {}), ctx)
    model, opt = w.model, w.optimizer
    params = list(model.named_parameters())
    names = {id(p): n for n, p in params}
    numel = sum(p.numel() for _, p in params)
    ddp = DDP(model, bucket_cap_mb=DDPSpec().bucket_cap_mb)
    recorder = _TimedRecorder(dict(names), device)
    ddp.register_comm_hook(None, lambda state, bucket: recorder.hook(state, bucket))
    acc = training.accumulation_steps
    clip = training.grad_clip_norm or float("inf")
    watch = Stopwatch(device)

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
            local = recorder.local_digest()
            tensors.local_grads.update(local_digests(model, recorder.local))
            buckets = recorder.layout()
            watch.lap("local grads")
            # One rank: the reduced gradients are the local ones, digested again.
            reduced = _boundary(grads, tensors.reduced_grads)
            watch.lap("reduced grads")

            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip))
            watch.lap("clip")
            clipped = _boundary([(n, p.grad) for n, p in params], tensors.clipped_grads)
            watch.lap("clipped grads")
            lr = [float(g["lr"]) for g in opt.param_groups]
            opt.step()
            if w.scheduler is not None:
                w.scheduler.step()
            opt.zero_grad(set_to_none=True)
            watch.lap("optimizer step")

            params_digest = _boundary(
                list(itertools.chain(model.named_parameters(), model.named_buffers())),
                tensors.params)
            watch.lap("params+buffers")
            digests = optimizer_digests(opt, names)
            tensors.optimizer_state.update(digests.tensors)
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
                    optimizer_state=digests.whole,
                    started_at=started_at,
                    finished_at=time.time(),
                    tensors=tensors,
                )
            )
            watch.lap("record")
    return watch, numel


def _boundary(items: list[tuple[str, torch.Tensor | None]], into: dict[str, str]) -> str:
    """One boundary's digest, derived from per-tensor digests (kept in ``into``)."""
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


def measure_bandwidth(device: torch.device) -> float:
    """Print the fingerprint's read throughput on ``device`` against a copy's there (bytes
    read and written); returns their ratio (the target is at least 0.5)."""
    nbytes = (2 << 30) if device.type == "cuda" else (256 << 20)
    x = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    y = torch.empty_like(x)

    def timed(fn: Callable[[], object]) -> float:
        fn()  # warm: a compile, the multiplier tables
        best = float("inf")
        for _ in range(5):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - t0)
        return best

    copy_gbs = 2 * nbytes / timed(lambda: y.copy_(x)) / 1e9
    print_gbs = nbytes / timed(lambda: fingerprint.fingerprints([x])) / 1e9
    ratio = print_gbs / copy_gbs
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"wsum128 on {name}: {print_gbs:8.1f} GB/s read; a copy moves {copy_gbs:8.1f} GB/s "
          f"(read + write): {ratio:.0%} of the device's measured bandwidth "
          f"({nbytes >> 20} MiB, best of 5)")
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="measured steps (after warmup)")
    parser.add_argument("--hashes", action="store_true", help="also compare hash functions")
    parser.add_argument("--params", type=json.loads, default={},
                        help="tiny-gpt's parameters (JSON), e.g. a larger model")
    parser.add_argument("--size", choices=sorted(SIZES), help="tiny-gpt at a preset size")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda[:N]")
    parser.add_argument("--algorithms", default=",".join(DIGEST_ALGORITHMS),
                        help="digest algorithms to measure, comma-separated")
    parser.add_argument("--bandwidth", action="store_true",
                        help="also the fingerprint's GB/s against the device's copy GB/s")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    params = SIZES[args.size] if args.size else args.params
    algorithms = [a for a in DIGEST_ALGORITHMS if a in args.algorithms.split(",")]
    picked = ComparisonSpec().digest_on(device.type)

    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # One thread, as each rank runs by default (world.threads_per_rank).
        torch.set_num_threads(1)
    # A one-rank group, so that DDP runs its reducer and the loop's comm hook as in a leg.
    store = dist.HashStore()
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store,
                            rank=0, world_size=1)
    if args.hashes:
        compare_hashes()
        print()
    bandwidth_ok = True
    if args.bandwidth:
        bandwidth_ok = measure_bandwidth(device) >= 0.5
        print()
    # Alternate the algorithms, so that a loaded machine weighs on each alike.
    watches: dict[str, list[Stopwatch]] = {a: [] for a in algorithms}
    numel = 0
    for algorithm in algorithms * 2:
        with tempfile.TemporaryDirectory() as tmp:
            watch, numel = run_steps(args.steps // 2, Path(tmp), algorithm=algorithm,
                                     device=device, params=params)
        watches[algorithm].append(watch)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    def mean_ms(algorithm: str, labels: tuple[str, ...]) -> float:
        return statistics.mean(w.mean_ms(labels) for w in watches[algorithm])

    acc = TrainingSpec().accumulation_steps
    print(f"tiny-gpt, {numel:,} parameters on {device}, {args.steps} steps after "
          f"{WARMUP_STEPS} warmup for each digest algorithm")
    print(f"  {'':18s}" + "".join(f" {a:>12s}" for a in algorithms))
    for label in TRAIN_LABELS + DIGEST_LABELS:
        print(f"  {label:18s}" + "".join(f" {mean_ms(a, (label,)):9.3f} ms" for a in algorithms))
    ratios: dict[str, float] = {}
    for algorithm in algorithms:
        step_ms = mean_ms(algorithm, TRAIN_LABELS)
        digest_ms = mean_ms(algorithm, DIGEST_LABELS)
        ratios[algorithm] = digest_ms / step_ms
        print(f"{algorithm:9s}: step {step_ms:8.2f} ms ({acc} microbatches + clip + optimizer), "
              f"digests {digest_ms:7.2f} ms (rng, 3x grads, params+buffers, optimizer, "
              f"1 record): {ratios[algorithm]:6.2%}")
    if picked not in ratios:
        print(f"{picked} (what a run on {device.type} digests with) was not measured")
        return 1
    ok = ratios[picked] <= TARGET
    print(f"{picked} (what a run on {device.type} digests with): "
          f"{'PASS' if ok else f'OVER TARGET ({TARGET:.0%})'}")
    dist.destroy_process_group()
    return 0 if ok and bandwidth_ok else 1


if __name__ == "__main__":
    sys.exit(main())
