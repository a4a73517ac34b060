"""A control leg's training time next to a bare loop of the same workload and steps, under
DDP and under FSDP2, side by side.

Both sides run under torchrun with the same spec: 2 ranks on gloo, OMP_NUM_THREADS=1 and
one torch thread per rank. The harness side is ``resumequal leg --leg control``; the bare
side is ``bench/_bare_loop.py``, the same workload, seeds and accumulation loop in DDP (or
``fully_shard`` per block and at the root) with no digests, trace, checkpoints, reducer
prime or recording reduce-scatter. Runs alternate (bare, harness, harness, bare, ...) and
every figure printed is the median over the pairs; each parallelism gets its own pairs.

- training window: first step start to last step end, max over ranks (the harness side
  reads it from its trace, the bare side writes its own);
- process wall: torchrun launch to exit, imports, rendezvous and final save included;
- the harness overhead split: checkpoint saves are the gaps after the steps that saved,
  until the next step started, less the usual gap between steps; the rest is per-step work
  (digests, trace records, the stop-flag all-reduce per microbatch, the comm hook or the
  recording reduce-scatter). The final save, after the last step, is outside the window
  (it shows in process wall).

    python bench/harness_overhead.py [--workload tiny-gpt] [--steps 12] [--repeats 3]
                                     [--parallelism ddp fsdp2]

Temporary run directories are deleted at the end and every process started is stopped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from resumequal.local.backend import free_port
from resumequal.local.processes import ProcessTree
from resumequal.qualify.plan import local_torchrun_args
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, new_key, new_run_id
from resumequal.spec import QualificationSpec, load_spec
from resumequal.spec.launchers import TORCHRUN
from resumequal.trace.records import StepRecord

BARE_SCRIPT = Path(__file__).with_name("_bare_loop.py")
LABEL = {"ddp": "bare DDP", "fsdp2": "bare FSDP2"}
NPROC = 2


class BenchError(Exception):
    """A launch failed or wrote nothing to measure."""


@dataclass(frozen=True)
class Sample:
    """One run of one side."""

    window_s: float
    wall_s: float
    checkpoint_s: float = 0.0
    saves: int = 0


@dataclass(frozen=True)
class Pair:
    """A bare run and a harness run measured back to back."""

    bare: Sample
    harness: Sample


def torchrun(args: Sequence[str]) -> list[str]:
    """A single-node elastic launch with LocalBackend's options."""
    return [
        sys.executable, *TORCHRUN,
        *local_torchrun_args(endpoint=f"127.0.0.1:{free_port()}", nproc=NPROC,
                             max_restarts=0),
        *args,
    ]


def launch(tree: ProcessTree, cmd: list[str], log: Path, timeout: float) -> float:
    """Run ``cmd`` to completion; returns its wall seconds, raises BenchError on failure."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = tree.spawn(cmd, log, env)
    try:
        code = proc.wait(timeout=timeout)
    except Exception as e:
        raise BenchError(f"{log.name}: no exit within {timeout:g}s\n{tail(log)}") from e
    wall = time.perf_counter() - t0
    if code != 0:
        raise BenchError(f"{log.name}: torchrun exited {code}\n{tail(log)}")
    return wall


def tail(log: Path, n: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def window(started: Sequence[float], finished: Sequence[float]) -> float:
    return finished[-1] - started[0]


def bare_run(tree: ProcessTree, spec_path: Path, out: Path, timeout: float) -> Sample:
    wall = launch(tree, torchrun([str(BARE_SCRIPT), "--spec", str(spec_path), "--out", str(out)]),
                  out.with_suffix(".log"), timeout)
    windows = []
    for rank in range(NPROC):
        body = json.loads((out / f"rank-{rank}.json").read_text())
        windows.append(window(body["started_at"], body["finished_at"]))
    return Sample(window_s=max(windows), wall_s=wall)


def checkpoint_seconds(steps: list[StepRecord], spec: QualificationSpec) -> tuple[float, int]:
    """Seconds spent saving inside the window, and how many saves that covers.

    A step that saved is followed by a longer gap before the next step starts; its excess
    over the median gap after steps that did not save is charged to the checkpoint.
    """
    last = spec.training.steps
    save_gaps: list[float] = []
    plain_gaps: list[float] = []
    for rec, nxt in itertools.pairwise(steps):
        gap = nxt.started_at - rec.finished_at
        (save_gaps if spec.checkpoint.saves_after(rec.step, last) else plain_gaps).append(gap)
    usual = statistics.median(plain_gaps) if plain_gaps else 0.0
    return sum(max(0.0, g - usual) for g in save_gaps), len(save_gaps)


def harness_run(
    tree: ProcessTree, spec_path: Path, spec: QualificationSpec, run_dir: Path, timeout: float
) -> Sample:
    cmd = torchrun(["-m", "resumequal", "leg", "--spec", str(spec_path), "--leg", "control",
                    "--run-dir", str(run_dir)])
    wall = launch(tree, cmd, run_dir.with_suffix(".log"), timeout)
    best: tuple[float, float, int] | None = None
    traces = RunLocation.open(str(run_dir)).traces("control")
    for rank in range(NPROC):
        recs = traces.records(rank)
        steps = sorted((r for r in recs if isinstance(r, StepRecord)), key=lambda r: r.step)
        if len(steps) != spec.training.steps:
            raise BenchError(f"rank {rank} traced {len(steps)} of {spec.training.steps} steps")
        span = window([s.started_at for s in steps], [s.finished_at for s in steps])
        if best is None or span > best[0]:
            best = (span, *checkpoint_seconds(steps, spec))
    assert best is not None
    return Sample(window_s=best[0], wall_s=wall, checkpoint_s=best[1], saves=best[2])


def measure(spec_path: Path, spec: QualificationSpec, root: Path, repeats: int,
            timeout: float) -> list[Pair]:
    tree = ProcessTree()
    pairs = []
    try:
        for i in range(repeats):
            # Alternate which side goes first so slow drift does not favour either.
            order = ("bare", "harness") if i % 2 == 0 else ("harness", "bare")
            got: dict[str, Sample] = {}
            for side in order:
                if side == "bare":
                    got[side] = bare_run(tree, spec_path, root / f"bare-{i}", timeout)
                else:
                    got[side] = harness_run(tree, spec_path, spec, root / f"harness-{i}",
                                            timeout)
                print(f"  run {i + 1}/{repeats} {side:<7}: window {got[side].window_s:6.3f} s, "
                      f"process {got[side].wall_s:5.2f} s", flush=True)
            pairs.append(Pair(bare=got["bare"], harness=got["harness"]))
    finally:
        tree.stop_all()
    return pairs


def report(pairs: list[Pair], spec: QualificationSpec) -> float:
    """Print one parallelism's figures; returns its median step-time ratio."""
    n = spec.training.steps
    label = LABEL[spec.parallelism.kind]
    med = statistics.median
    bare_ms = med(p.bare.window_s / n * 1e3 for p in pairs)
    harness_ms = med(p.harness.window_s / n * 1e3 for p in pairs)
    ratio = med(p.harness.window_s / p.bare.window_s for p in pairs)
    overhead_ms = med((p.harness.window_s - p.bare.window_s) / n * 1e3 for p in pairs)
    ckpt_ms = med(p.harness.checkpoint_s / n * 1e3 for p in pairs)
    # Derived, so that the two parts add up to the overhead printed above them.
    work_ms = overhead_ms - ckpt_ms
    saves = pairs[0].harness.saves
    per_save_ms = med(p.harness.checkpoint_s / p.harness.saves * 1e3
                      for p in pairs) if saves else 0.0
    wall_ratio = med(p.harness.wall_s / p.bare.wall_s for p in pairs)

    def share(part_ms: float) -> str:
        return f"{100 * part_ms / overhead_ms:3.0f}%" if overhead_ms > 0 else "  -"

    t = spec.training
    print()
    print(f"{spec.workload.name} ({spec.parallelism.kind}): {t.steps} steps x "
          f"{t.accumulation_steps} microbatches, {NPROC} ranks (gloo, 1 thread each); medians "
          f"of {len(pairs)} alternating pairs")
    print()
    print(f"{'':<34}{label:>10}{'resumequal':>12}{'ratio':>8}")
    print(f"{'step ms (window / steps)':<34}{bare_ms:>10.1f}{harness_ms:>12.1f}{ratio:>7.2f}x")
    print(f"{'training window s':<34}{med(p.bare.window_s for p in pairs):>10.3f}"
          f"{med(p.harness.window_s for p in pairs):>12.3f}")
    print(f"{'process wall s (launch to exit)':<34}{med(p.bare.wall_s for p in pairs):>10.2f}"
          f"{med(p.harness.wall_s for p in pairs):>12.2f}{wall_ratio:>7.2f}x")
    print()
    pair_ratios = ", ".join(f"{p.harness.window_s / p.bare.window_s:.2f}" for p in pairs)
    print(f"step-time ratio of each pair: {pair_ratios} (their spread is the noise)")
    print(f"harness overhead per step (median of pairs): {overhead_ms:+.1f} ms")
    print(f"  per-step work (digests, trace, stop flag): {work_ms:+7.1f} ms/step "
          f"({share(work_ms)})")
    print(f"  checkpoint saves ({saves} in the window):     {ckpt_ms:+7.1f} ms/step "
          f"({share(ckpt_ms)}), {per_save_ms:.0f} ms per save")
    print()
    print(f"summary: the harness trains at {ratio:.2f}x the {label} step time "
          f"({harness_ms:.1f} vs {bare_ms:.1f} ms/step): {work_ms:+.1f} ms/step of digests "
          f"and trace, {ckpt_ms:+.1f} ms/step of checkpoint saves; whole process "
          f"{wall_ratio:.2f}x")
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="tiny-gpt")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--accumulation", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="alternating pairs of runs")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per launch")
    parser.add_argument("--parallelism", nargs="+", choices=list(LABEL), default=list(LABEL),
                        help="which to measure (each against its own bare loop)")
    args = parser.parse_args()

    # Checkpoints and traces are sealed with the run's key and id, as in a run.
    os.environ.setdefault(KEY_ENV, new_key())
    os.environ.setdefault(RUN_ID_ENV, new_run_id())
    ratios: dict[str, float] = {}
    for kind in args.parallelism:
        with tempfile.TemporaryDirectory(prefix="rq-bench-overhead-") as tmp:
            root = Path(tmp)
            spec_path = root / "spec.yaml"
            spec_path.write_text(yaml.safe_dump({
                "workload": {"name": args.workload},
                "training": {"steps": args.steps, "accumulationSteps": args.accumulation},
                "world": {"nprocPerNode": NPROC, "backend": "gloo", "threadsPerRank": 1},
                "parallelism": {"kind": kind},
            }))
            spec = load_spec(spec_path)
            print(f"harness overhead, {kind}: {args.repeats} alternating pairs of runs",
                  flush=True)
            try:
                pairs = measure(spec_path, spec, root, args.repeats, args.timeout)
            except BenchError as e:
                sys.exit(f"harness_overhead: {e}")
        ratios[kind] = report(pairs, spec)
        print()
    if len(ratios) > 1:
        print("side by side, harness step time / bare step time: " + ", ".join(
            f"{kind} {ratio:.2f}x" for kind, ratio in ratios.items()) + " (target <= 1.15x)")


if __name__ == "__main__":
    main()
