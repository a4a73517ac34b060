"""The NCCL cells of a qualification on this machine's GPUs, under the default launcher.

    python tools/gpu_check.py [--run-dir build/gpu-check] [--cell NAME ...]

Each cell is a ``resumequal run`` of the default spec on NCCL (one rank per GPU, the last
rank cut) with stock torchrun, every worker a fresh interpreter: DDP fp32, DDP bf16,
FSDP2 bf16 and a compiled DDP model. The negative controls are left out so that the whole
check fits in ten minutes on one GPU; every cell still runs its control and preempted
legs, a real kill and a real restart. Prints a Markdown table (cell, verdict, exit code,
wall time, torch, CUDA, NCCL, GPU) and exits 1 unless every cell PASSes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CELLS: dict[str, list[str]] = {
    "ddp-fp32": [],
    "ddp-bf16": ["training.precision=bf16"],
    "fsdp2-bf16": ["parallelism.kind=fsdp2", "training.precision=bf16"],
    "compile": ["compile.enabled=true"],
}
CELL_SECONDS = 240


def gpus() -> tuple[int, dict[str, str | None]]:
    """How many GPUs torch sees, and what it runs them with."""
    import torch

    count = torch.cuda.device_count()
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if count else None
    return count, {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": nccl,
                   "gpu": torch.cuda.get_device_name(0) if count else None}


def run_cell(name: str, sets: list[str], nproc: int, run_dir: Path) -> dict[str, object]:
    """One ``resumequal run``; its verdict, exit code and wall time."""
    shutil.rmtree(run_dir, ignore_errors=True)
    args = [sys.executable, "-m", "resumequal", "run", "--run-dir", str(run_dir)]
    for setting in ["world.backend=nccl", f"world.nprocPerNode={nproc}",
                    f"preemption.rank={nproc - 1}", "controls.enabled=false", *sets]:
        args += ["--set", setting]
    started = time.monotonic()
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=CELL_SECONDS)
        code: int | str = proc.returncode
        tail = (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        code, tail = "timeout", f"over {CELL_SECONDS} s"
    wall = time.monotonic() - started
    report = run_dir / "report.json"
    result = json.loads(report.read_text())["verdict"]["result"] if report.exists() else "-"
    if result != "PASS":
        print(f"--- {name}: {result} (exit {code})\n{tail}", file=sys.stderr)
    return {"cell": name, "result": result, "exit": code, "seconds": round(wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, default=ROOT / "build" / "gpu-check")
    parser.add_argument("--cell", action="append", choices=list(CELLS),
                        help="run only these cells (repeatable); default: all")
    args = parser.parse_args()
    count, stack = gpus()
    if count == 0:
        print("gpu-check: torch sees no GPU here; nothing to check", file=sys.stderr)
        return 2
    rows = [run_cell(name, CELLS[name], count, args.run_dir / name)
            for name in (args.cell or list(CELLS))]
    print(f"\nNCCL cells, launcher torchrun, {count} rank(s) on {stack['gpu']}; torch "
          f"{stack['torch']}, CUDA {stack['cuda']}, NCCL {stack['nccl']}\n")
    print("| cell | verdict | exit | wall (s) |\n|---|---|---:|---:|")
    for row in rows:
        print(f"| {row['cell']} | {row['result']} | {row['exit']} | {row['seconds']} |")
    return 0 if all(row["result"] == "PASS" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
