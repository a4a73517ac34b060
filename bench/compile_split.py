"""Where a compiled qualification's time goes: compiling vs training, per leg and attempt,
next to the same qualification run eagerly.

Three runs of the default spec (tiny-gpt, 2 ranks on gloo, 12 steps, hard cut at step 6
microstep 1, controls off), one after the other in this process's machine:

- eager: ``compile.enabled=false``;
- shared: ``compile.enabled=true``, ``compile.cache=shared`` (the default): the control
  leg compiles cold, every process of the preempted leg finds inductor's cache warm;
- fresh: ``compile.cache=fresh``: every process compiles cold, the resumed one included.

Per leg attempt, from the traces, for its slowest rank: *compile* is its compile seconds
(``CompiledRecord``: dynamo, AOTAutograd and inductor, forward and backward graphs);
*train* is the time from the workload built (``StartupRecord.built_at``) to its last step
finished, minus compile (it includes a resumed attempt's restore and DDP's reducer prime,
where a DDP model compiles). Printed side by
side: compile and train seconds, the compiled attempts' train time per step over eager's,
and the resumed attempt's compile seconds, fresh over shared (what a warm cache saves a
restart).

    python bench/compile_split.py

Temporary run directories are deleted at the end.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from resumequal.run.location import RunLocation
from resumequal.trace.records import CompiledRecord, StartupRecord, StepRecord

RUNS = {
    "eager": ["compile.enabled=false"],
    "shared": ["compile.enabled=true", "compile.cache=shared"],
    "fresh": ["compile.enabled=true", "compile.cache=fresh"],
}
LEGS = ("control", "preempted")
WORLD = 2


def _run(run_dir: Path, sets: list[str]) -> float:
    args = [a for s in [*sets, "controls.enabled=false"] for a in ("--set", s)]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "resumequal", "run", "--run-dir",
                           str(run_dir), *args], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"resumequal run {' '.join(sets)} exited {proc.returncode}:\n"
                         f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.monotonic() - started


def split(run_dir: Path) -> dict[tuple[str, int], dict[str, float]]:
    """(leg, attempt) -> compile and train seconds of its slowest rank, and its steps."""
    location = RunLocation.open(str(run_dir))
    out: dict[tuple[str, int], dict[str, float]] = {}
    for leg in LEGS:
        per_rank: dict[tuple[int, int], dict[str, float]] = {}
        for rank, records in location.traces(leg).records_so_far(WORLD).items():
            for rec in records:
                cell = per_rank.setdefault((rec.attempt, rank),
                                           {"compile": 0.0, "built": 0.0, "end": 0.0,
                                            "steps": 0})
                if isinstance(rec, CompiledRecord):
                    cell["compile"] += rec.seconds
                elif isinstance(rec, StartupRecord):
                    cell["built"] = rec.built_at
                elif isinstance(rec, StepRecord):
                    cell["end"] = max(cell["end"], rec.finished_at)
                    cell["steps"] += 1
        for cell in per_rank.values():
            cell["wall"] = cell["end"] - cell["built"]
        for attempt in sorted({a for a, _ in per_rank}):
            slowest = max((c for (a, _), c in per_rank.items() if a == attempt),
                          key=lambda c: c["wall"])
            if slowest["steps"]:
                out[(leg, attempt)] = {"compile": slowest["compile"],
                                       "train": slowest["wall"] - slowest["compile"],
                                       "steps": slowest["steps"]}
    return out


def _table(results: dict[str, dict[tuple[str, int], dict[str, float]]]) -> None:
    print(f"{'run':8} {'leg':10} {'attempt':>7} {'steps':>5} {'compile s':>10} "
          f"{'train s':>8} {'train s/step':>12} {'vs eager':>8}")
    for name, cells in results.items():
        for (leg, attempt), c in cells.items():
            per_step = c["train"] / c["steps"]
            eager = results["eager"].get((leg, attempt))
            ratio = per_step / (eager["train"] / eager["steps"]) if eager else float("nan")
            print(f"{name:8} {leg:10} {attempt:>7} {int(c['steps']):>5} {c['compile']:>10.2f} "
                  f"{c['train']:>8.2f} {per_step:>12.3f} {ratio:>7.2f}x")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    results: dict[str, dict[tuple[str, int], dict[str, float]]] = {}
    walls: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="resumequal-bench-compile-") as tmp:
        for name, sets in RUNS.items():
            run_dir = Path(tmp) / name
            walls[name] = _run(run_dir, sets)
            results[name] = split(run_dir)
    _table(results)
    print()
    for name, wall in walls.items():
        compiled = sum(c["compile"] for c in results[name].values())
        print(f"{name:8} whole qualification {wall:6.1f} s, compiling {compiled:6.1f} s "
              f"(slowest ranks, summed over leg attempts)")
    resumed: dict[str, Any] = {n: results[n].get(("preempted", 1)) for n in ("shared", "fresh")}
    if all(resumed.values()):
        print(f"resumed attempt's compile: fresh {resumed['fresh']['compile']:.2f} s / "
              f"shared {resumed['shared']['compile']:.2f} s = "
              f"{resumed['fresh']['compile'] / max(resumed['shared']['compile'], 1e-9):.1f}x")


if __name__ == "__main__":
    main()
