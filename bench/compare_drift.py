"""Drift on two final checkpoints against just reading them (targets: ratio >= 0.7, memory).

Writes two DCP checkpoints of float32 tensors of various sizes (about 0.53 GB each by
default; the second a perturbed copy), then, each in a fresh subprocess:

- read: load every tensor of both checkpoints through DCP, in the batches the comparator
  uses, and drop it (the floor for any comparison that must see every byte);
- drift: ``resumequal.compare.checkpoint_drift`` on the pair.

Prints both throughputs (MB/s of checkpoint data, both checkpoints counted), their ratio
against the 0.7 target, and the drift pass's peak resident memory above its starting
point against "2 x the largest tensor + 300 MB". Each pass runs ``--repeat`` times; the
fastest counts. Temporary files are deleted at the end.

    python bench/compare_drift.py [--mb 550] [--repeat 2] [--perturb sparse|dense]

``sparse`` perturbs one element in 1000 of every tensor, ``dense`` every element (the
state after a divergence has spread); both are small relative changes.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from resumequal.compare.drift import BATCH_BYTES, checkpoint_drift

RATIO_TARGET = 0.7
MEMORY_SLACK_MB = 300
MB = 1 << 20

# (elements, count) per MB budget unit: a few large matrices, many medium, many small,
# like a model with its two Adam moments.
_SHAPES: list[tuple[tuple[int, ...], int]] = [
    ((4096, 8192), 1),   # 128 MB: the largest tensor (an embedding)
    ((4096, 4096), 2),   # 64 MB
    ((2048, 2048), 8),   # 16 MB
    ((1024, 1024), 24),  # 4 MB
    ((256, 256), 200),   # 256 KB
    ((1024,), 400),      # 4 KB (norms and biases)
]


def _shapes(budget_mb: int) -> list[tuple[int, ...]]:
    """The mix above (532 MB) repeated to about ``budget_mb`` of float32."""
    mix = [shape for shape, count in _SHAPES for _ in range(count)]
    mix_mb = sum(math.prod(s) for s in mix) * 4 / MB
    return mix * max(1, round(budget_mb / mix_mb))


def write_pair(root: Path, budget_mb: int, perturb: str) -> tuple[int, int]:
    """Write checkpoints ``a`` and ``b`` under ``root``; returns (bytes each, largest)."""
    gen = torch.Generator().manual_seed(0)
    state_a: dict[str, Any] = {"model": {}, "optim": {"state": {}}}
    state_b: dict[str, Any] = {"model": {}, "optim": {"state": {}}}
    total = largest = 0
    for i, shape in enumerate(_shapes(budget_mb)):
        t = torch.randn(shape, generator=gen)
        u = t.clone()
        flat = u.view(-1)
        if perturb == "dense":
            flat.mul_(1 + 1e-6)
        else:
            flat[::1000] += 1e-6
        # About a third model, two thirds optimizer state (two Adam moments).
        if i % 3 == 0:
            state_a["model"][f"layer{i}.weight"], state_b["model"][f"layer{i}.weight"] = t, u
        else:
            key = f"layer{i}.weight"
            moment = "exp_avg" if i % 3 == 1 else "exp_avg_sq"
            state_a["optim"]["state"].setdefault(key, {})[moment] = t
            state_b["optim"]["state"].setdefault(key, {})[moment] = u
        total += t.nbytes
        largest = max(largest, t.nbytes)
    for name, state in (("a", state_a), ("b", state_b)):
        state["optim"]["param_groups"] = [{"lr": 1e-3, "betas": (0.9, 0.95)}]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save(state, storage_writer=dcp.FileSystemWriter(str(root / name)),
                     no_dist=True)
        state.clear()
    return total, largest


# -------------------------------------------------------------------- passes (subprocess)


def _rss_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def read_pass(a: Path, b: Path) -> None:
    """Load every tensor of both checkpoints in the comparator's batches; compute nothing."""
    meta = dcp.FileSystemReader(str(a)).read_metadata().state_dict_metadata
    keys = sorted(k for k, m in meta.items() if isinstance(m, TensorStorageMetadata))
    batch: list[str] = []
    size = 0

    def load(keys: list[str]) -> None:
        for path in (a, b):
            state: dict[str, Any] = {}
            for k in keys:
                md = meta[k]
                assert isinstance(md, TensorStorageMetadata)
                state[k] = torch.empty(md.size, dtype=md.properties.dtype)
            dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)),
                     planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
            del state

    for k in keys:
        md = meta[k]
        assert isinstance(md, TensorStorageMetadata)
        n = math.prod(md.size) * md.properties.dtype.itemsize
        if batch and size + n > BATCH_BYTES:
            load(batch)
            batch, size = [], 0
        batch.append(k)
        size += n
    if batch:
        load(batch)


def run_pass(kind: str, a: Path, b: Path) -> None:
    """Entry of the subprocess: run one pass, print seconds and memory as JSON."""
    warnings.simplefilter("ignore")
    base_kb = _rss_kb("VmRSS")
    reset = _reset_peak()
    start = time.perf_counter()
    if kind == "read":
        read_pass(a, b)
        summary = None
    else:
        model, optim = checkpoint_drift(a, b)
        summary = {d.group: [d.max_abs_diff, d.mismatch_fraction] for d in (model, optim)}
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "base_kb": base_kb, "peak_kb": _rss_kb("VmHWM"),
                      "peak_reset": reset, "drift": summary}))


def _subprocess(kind: str, a: Path, b: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--pass", kind, str(a), str(b)],
                         check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# -------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=532,
                        help="about this many MB per checkpoint (multiples of 532)")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each pass (best counts)")
    parser.add_argument("--perturb", choices=("sparse", "dense"), default="sparse")
    parser.add_argument("--pass", dest="kind", choices=("read", "drift"), help=argparse.SUPPRESS)
    parser.add_argument("paths", nargs="*", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.kind:
        run_pass(args.kind, *args.paths)
        return 0

    with tempfile.TemporaryDirectory(prefix="resumequal-drift-bench-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        each, largest = write_pair(root, args.mb, args.perturb)
        print(f"wrote 2 checkpoints of {each / MB:.0f} MB ({args.perturb} perturbation), "
              f"largest tensor {largest / MB:.0f} MB, in {time.perf_counter() - t0:.1f}s")
        a, b = root / "a", root / "b"
        _subprocess("read", a, b)  # warm the page cache; not counted
        reads, drifts = [], []
        for _ in range(args.repeat):
            reads.append(_subprocess("read", a, b))
            drifts.append(_subprocess("drift", a, b))
    read = min(reads, key=lambda r: r["seconds"])
    drift = min(drifts, key=lambda r: r["seconds"])

    data_mb = 2 * each / MB
    read_mbs, drift_mbs = data_mb / read["seconds"], data_mb / drift["seconds"]
    ratio = drift_mbs / read_mbs
    peak_mb = max((d["peak_kb"] - d["base_kb"]) / 1024 for d in drifts)
    target_mb = 2 * largest / MB + MEMORY_SLACK_MB
    print(f"drift figures: {drift['drift']}")
    print(f"read only : {read_mbs:8.0f} MB/s  ({read['seconds']:.2f}s for {data_mb:.0f} MB)")
    print(f"drift     : {drift_mbs:8.0f} MB/s  ({drift['seconds']:.2f}s)")
    ok_ratio = ratio >= RATIO_TARGET
    print(f"throughput ratio drift/read: {ratio:.2f} (target >= {RATIO_TARGET}) "
          f"{'PASS' if ok_ratio else 'over target'}")
    how = "" if drift["peak_reset"] else " (peak not resettable: includes startup)"
    ok_mem = peak_mb <= target_mb
    print(f"drift peak RSS above start: {peak_mb:.0f} MB (target <= 2 x {largest / MB:.0f} MB "
          f"+ {MEMORY_SLACK_MB} MB = {target_mb:.0f} MB){how} "
          f"{'PASS' if ok_mem else 'over target'}")
    return 0 if ok_ratio and ok_mem else 1


if __name__ == "__main__":
    sys.exit(main())
