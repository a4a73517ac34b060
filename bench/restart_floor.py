"""CPU time a worker started afresh spends loading code before its first step, stage by
stage, next to the bare worker's.

Under the default launcher (stock torchrun) every worker is a fresh interpreter and pays
this at every start. Under ``world.launcher: forked`` a leg's workers are forked from the
agent's forkserver (``resumequal.worker.agent``), which loads this code once, before the first
attempt (``resumequal.train.preload``): a restart loads none of it, and what it costs is
paid there, once per agent (at a leg's start, and by the new agent of a replaced node or
pod). A worker started as a fresh interpreter pays it at every start:
both workers of a restart start at once and each keeps one of this machine's cores busy
until its first step, so their wall time follows each rank's CPU time. This script
measures that loading, in fresh interpreters (the figure per stage is the median over
``--repeats``; CPU is user + system, in the 10 ms ticks ``os.times`` counts), in the
order a leg loads it:

    python           interpreter start: site, the editable install's finder
    cli + spec       ``resumequal.cli``: click, pydantic, YAML and the spec models
    torch            ``torch`` and ``torch.distributed`` (all the bare worker loads)
    DCP              ``torch.distributed.checkpoint``: DTensor, FX, sympy
    worker modules   ``resumequal.train.worker`` and the rest of ours it loads
    dynamo           ``torch._dynamo``, which DDP's constructor imports

The leg's collector is paused after ``cli + spec``, where ``resumequal leg`` pauses it;
the bare worker's runs throughout, as in ``bench/_bare_restart.py``. OMP_NUM_THREADS=1, as under
``bench/restart_latency.py``.

    python bench/restart_floor.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys

STAGES = ("python", "cli + spec", "torch", "DCP", "worker modules", "dynamo")
TORCH_OWN = ("DCP", "dynamo")  # what torch loads for a leg beyond the bare worker

_MARK = "import os\ndef cpu(): t = os.times(); return t.user + t.system\nmarks = [cpu()]\n"
LEG = _MARK + (
    "import resumequal.cli\nmarks.append(cpu())\n"
    "import gc\ngc.disable()\n"
    "import torch, torch.distributed\nmarks.append(cpu())\n"
    "import torch.distributed.checkpoint\nmarks.append(cpu())\n"
    "import resumequal.train.worker\nmarks.append(cpu())\n"
    "import torch._dynamo\nmarks.append(cpu())\n"
    "import json\nprint(json.dumps(marks))\n"
)
BARE = _MARK + (
    "import torch, torch.distributed\nmarks.append(cpu())\n"
    "import json\nprint(json.dumps(marks))\n"
)


def stage_ms(code: str, repeats: int) -> list[float]:
    """Median CPU milliseconds of each stage of ``code`` (its first mark is the start)."""
    runs: list[list[float]] = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, timeout=300,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))  # as both benches
        marks = json.loads(out.stdout.splitlines()[-1])
        runs.append([marks[0]] + [b - a for a, b in itertools.pairwise(marks)])
    return [1e3 * statistics.median(run[i] for run in runs) for i in range(len(runs[0]))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh interpreters per side")
    args = parser.parse_args()

    leg = dict(zip(STAGES, stage_ms(LEG, args.repeats), strict=True))
    bare = dict(zip(("python", "torch"), stage_ms(BARE, args.repeats), strict=True))
    print(f"CPU ms per worker, loading code (median of {args.repeats} fresh interpreters)")
    print()
    print(f"{'stage':<16}{'leg':>8}{'bare':>8}")
    for stage in STAGES:
        other = f"{bare[stage]:>8.0f}" if stage in bare else f"{'-':>8}"
        print(f"{stage:<16}{leg[stage]:>8.0f}{other}")
    leg_total, bare_total = sum(leg.values()), sum(bare.values())
    torch_own = sum(leg[s] for s in TORCH_OWN)
    ours = leg["cli + spec"] + leg["worker modules"]
    print(f"{'total':<16}{leg_total:>8.0f}{bare_total:>8.0f}")
    print()
    print(f"summary: a leg loads {leg_total - bare_total:.0f} ms of CPU more than the bare "
          f"worker: {torch_own:.0f} ms that torch loads for it (DCP {leg['DCP']:.0f}, "
          f"dynamo {leg['dynamo']:.0f}), {ours:.0f} ms of ours (cli + spec, worker "
          f"modules), {leg['torch'] - bare['torch']:+.0f} ms on torch itself (the paused "
          "collector)")


if __name__ == "__main__":
    main()
