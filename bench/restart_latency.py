"""From the kill to the first resumed step, phase by phase, next to the same resume with
torch alone under the same launcher, and a bare torchrun restart.

Every side runs with LocalBackend's launch options (c10d rendezvous on loopback, 2 ranks,
``--max-restarts 1``, ``--monitor-interval 0.1``, OMP_NUM_THREADS=1) and loses rank 1 to a
SIGKILL on attempt 0. For each launcher (``world.launcher``: stock torchrun, the default,
every worker a fresh interpreter; forked, workers forked from a process that loaded their
code once, :mod:`resumequal.worker.agent`):

- resumequal: the preempted leg of the default spec (hard cut at step 6, microstep 1, on
  rank 1), launched as LocalBackend launches it under that launcher. The bench waits for
  the beacon, kills the pid it names, and reads the phases of attempt 1 from the agent's
  log and the leg's trace;
- torch alone: ``bench/_torch_resume.py`` (run as a module, ``-m _torch_resume``, so that
  the forked launcher forks it too) under the same launcher: the same training (tiny-gpt's
  size, DDP, AdamW, deterministic algorithms, DCP) resumed as a torch user would without
  resumequal: no spec, trace, beacon or checkpoint verification.

and once, as the floor of any restart:

- bare: ``bench/_bare_restart.py`` under stock torchrun, which only joins a per-attempt
  gloo group and all-reduces once; rank 1 publishes its pid and sleeps until killed.

Phases, each a timestamp on this machine's clock, measured from the kill:

    failure detected  the agent logs "failed (exitcode: N)" (it logs this once it has also
                      stopped the surviving ranks)
    processes up      earliest process creation of attempt 1 (/proc), over ranks
    group joined      the last rank of attempt 1 has joined its process group
    built             the last rank has built the workload and wrapped it in DDP
    restored          the last rank has loaded the checkpoint (RestoreRecord.restored_at)
    first step        the last rank has finished its first resumed step

The bare side stops at "group joined". Runs rotate the order of the sides; figures are
medians. Printed ratios (each the median over rounds of one run per side), per launcher:
resumequal to torch alone under that launcher (kill -> first step on both; the target is
1.1x), and each to bare (kill -> first step against kill -> group joined).

    python bench/restart_latency.py [--repeats 3] [--launcher torchrun|forked|both]

Temporary run directories are deleted at the end and every process started is stopped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from resumequal.local.backend import free_port
from resumequal.local.processes import ProcessTree
from resumequal.qualify.plan import local_torchrun_args
from resumequal.run.location import RunLocation
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, new_key, new_run_id
from resumequal.spec.launchers import LAUNCHERS, TORCHRUN, command
from resumequal.trace.records import RestoreRecord, StartupRecord, StepRecord

BARE_SCRIPT = Path(__file__).with_name("_bare_restart.py")
TORCH_SCRIPT = Path(__file__).with_name("_torch_resume.py")
NPROC = 2
TARGET_RANK = 1
PHASES = ("failure detected", "processes up", "group joined", "built", "restored",
          "first step")
BARE_PHASES = PHASES[:3]
# torch's elastic logger: "E1129 19:02:09.579000 4242 torch/.../api.py:1002] failed (..."
FAILED_LINE = re.compile(
    r"^[DIWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) .*\bfailed \(exitcode: (-?\d+)\)"
)

Timeline = dict[str, float]  # phase -> seconds since the kill


class BenchError(Exception):
    """A launch failed or left nothing to measure."""


TORCH_MODULE = ["-m", TORCH_SCRIPT.stem]
TARGET = 1.1  # resumequal / torch alone, under the same launcher


def torchrun(args: Sequence[str], agent: Sequence[str] = TORCHRUN) -> list[str]:
    """LocalBackend's launch options, under ``agent``."""
    return [
        sys.executable, *agent,
        *local_torchrun_args(endpoint=f"127.0.0.1:{free_port()}", nproc=NPROC,
                             max_restarts=1),
        *args,
    ]


def tail(log: Path, n: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:])


def kill_and_wait(
    tree: ProcessTree, cmd: list[str], log: Path, pid_file: Path, timeout: float
) -> float:
    """Launch, SIGKILL the pid published in ``pid_file``, wait for a clean exit; kill time."""
    # The bench's folder on the path: the torch-alone side runs as a module.
    path = os.pathsep.join(p for p in (str(BARE_SCRIPT.parent),
                                       os.environ.get("PYTHONPATH")) if p)
    proc = tree.spawn(cmd, log, dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path))
    deadline = time.monotonic() + timeout
    while not pid_file.exists():
        if proc.poll() is not None:
            raise BenchError(f"{log.name}: exited {proc.returncode} before arming\n{tail(log)}")
        if time.monotonic() > deadline:
            raise BenchError(f"{log.name}: no {pid_file.name} within {timeout:g}s\n{tail(log)}")
        time.sleep(0.01)
    pid = int(json.loads(pid_file.read_text())["pid"])
    if pid not in tree.pids():
        raise BenchError(f"{pid_file} names pid {pid}, which is not a process of this bench")
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except Exception as e:
        raise BenchError(f"{log.name}: no exit within {timeout:g}s\n{tail(log)}") from e
    if code != 0:
        raise BenchError(f"{log.name}: torchrun exited {code} after the restart\n{tail(log)}")
    return killed_at


def failure_logged_at(log: Path) -> float:
    """When torchrun logged the failed attempt (month and day from the line, year from today).

    A run that exits 0 after one restart has exactly one such line.
    """
    year = dt.date.today().year
    for line in log.read_text(errors="replace").splitlines():
        m = FAILED_LINE.match(line)
        if m is not None:
            month, day, hour, minute, second, micro, _ = (int(g) for g in m.groups())
            return dt.datetime(year, month, day, hour, minute, second, micro).timestamp()
    raise BenchError(f"{log.name}: no 'failed (exitcode: ...)' line from torchrun\n{tail(log)}")


def since(killed_at: float, stamps: dict[str, float]) -> Timeline:
    return {phase: at - killed_at for phase, at in stamps.items()}


def resumequal_run(tree: ProcessTree, spec_path: Path, run_dir: Path, timeout: float,
                   launcher: str) -> Timeline:
    log = run_dir.with_suffix(".log")
    cmd = torchrun(["-m", "resumequal", "leg", "--spec", str(spec_path), "--leg", "preempted",
                    "--run-dir", str(run_dir)], command(launcher))
    beacon = run_dir / "preempted" / "beacons" / f"attempt-0-rank-{TARGET_RANK}.json"
    killed_at = kill_and_wait(tree, cmd, log, beacon, timeout)

    startups: list[StartupRecord] = []
    restores: list[RestoreRecord] = []
    first_steps: list[float] = []
    traces = RunLocation.open(str(run_dir)).traces("preempted")
    for rank in range(NPROC):
        records = [r for r in traces.records(rank) if r.attempt == 1]
        startups += [r for r in records if isinstance(r, StartupRecord)]
        restores += [r for r in records if isinstance(r, RestoreRecord)]
        first_steps += [r.finished_at for r in records if isinstance(r, StepRecord)][:1]
    if not (len(startups) == len(restores) == len(first_steps) == NPROC):
        raise BenchError(f"{run_dir}: attempt 1 traced {len(startups)} startups, "
                         f"{len(restores)} restores, {len(first_steps)} first steps "
                         f"for {NPROC} ranks")
    return since(killed_at, {
        "failure detected": failure_logged_at(log),
        "processes up": min(r.process_started_at for r in startups),
        "group joined": max(r.group_joined_at for r in startups),
        "built": max(r.built_at for r in startups),
        "restored": max(r.restored_at for r in restores),
        "first step": max(first_steps),
    })


def script_run(tree: ProcessTree, script: Sequence[str], out: Path, timeout: float,
               phases: dict[str, str], agent: Sequence[str] = TORCHRUN) -> Timeline:
    """Launch ``script`` (a bench worker writing ``attempt-1-rank-R.json``) under ``agent``,
    kill rank 1 on its published pid; ``phases`` maps a phase to the field that times it in
    every rank's file (the earliest process start, the latest of the others)."""
    out.mkdir(parents=True)
    log = out.with_suffix(".log")
    cmd = torchrun([*script, "--out", str(out)], agent)
    killed_at = kill_and_wait(tree, cmd, log, out / f"pid-rank-{TARGET_RANK}.json", timeout)
    bodies: list[dict[str, Any]] = [
        json.loads((out / f"attempt-1-rank-{rank}.json").read_text()) for rank in range(NPROC)
    ]
    stamps = {"failure detected": failure_logged_at(log)}
    for phase, field in phases.items():
        pick = min if phase == "processes up" else max
        stamps[phase] = pick(b[field] for b in bodies)
    return since(killed_at, stamps)


BARE_FIELDS = {"processes up": "process_started_at", "group joined": "joined_at"}
TORCH_FIELDS = {**BARE_FIELDS, "built": "built_at", "restored": "restored_at",
                "first step": "first_step_at"}


def sides(launchers: Sequence[str]) -> list[str]:
    """``resumequal/L`` and ``torch alone/L`` for each launcher L, then ``bare``."""
    return [f"{side}/{launcher}" for launcher in launchers
            for side in ("resumequal", "torch alone")] + ["bare"]


def measure(spec_path: Path, root: Path, repeats: int, timeout: float,
            launchers: Sequence[str]) -> dict[str, list[Timeline]]:
    tree = ProcessTree()
    order = sides(launchers)
    runs: dict[str, list[Timeline]] = {side: [] for side in order}
    try:
        for i in range(repeats):
            # Each side goes first, second and last in turn: none always follows another.
            shift = i % len(order)
            for side in order[shift:] + order[:shift]:
                kind, _, launcher = side.partition("/")
                where = root / f"{kind.replace(' ', '-')}-{launcher or 'torchrun'}-{i}"
                if kind == "resumequal":
                    timeline = resumequal_run(tree, spec_path, where, timeout, launcher)
                elif kind == "torch alone":
                    timeline = script_run(tree, TORCH_MODULE, where, timeout, TORCH_FIELDS,
                                          command(launcher))
                else:
                    timeline = script_run(tree, [str(BARE_SCRIPT)], where, timeout,
                                          BARE_FIELDS)
                runs[side].append(timeline)
                last = list(timeline)[-1]
                print(f"  run {i + 1}/{repeats} {side:<21}: kill -> {last} "
                      f"{timeline[last] * 1e3:6.0f} ms", flush=True)
    finally:
        tree.stop_all()
    return runs


def phase_ms(runs: list[Timeline], phases: Sequence[str]) -> tuple[list[float], list[float]]:
    """Median duration of each phase and median time since the kill at its end, in ms."""
    durations, cumulative = [], []
    for i, phase in enumerate(phases):
        prev = phases[i - 1] if i else None
        durations.append(statistics.median(
            (t[phase] - (t[prev] if prev else 0.0)) * 1e3 for t in runs))
        cumulative.append(statistics.median(t[phase] * 1e3 for t in runs))
    return durations, cumulative


def pair_ratios(top: list[Timeline], bottom: list[Timeline], top_phase: str,
                bottom_phase: str) -> tuple[float, str]:
    """The median of ``top[top_phase] / bottom[bottom_phase]`` over rounds, and each."""
    ratios = [t[top_phase] / b[bottom_phase] for t, b in zip(top, bottom, strict=True)]
    return statistics.median(ratios), ", ".join(f"{r:.2f}" for r in ratios)


def report(runs: dict[str, list[Timeline]], launchers: Sequence[str]) -> None:
    bare = runs["bare"]
    bare_phase, bare_cum = phase_ms(bare, BARE_PHASES)
    print()
    print(f"restart latency, {NPROC} ranks on gloo; medians of {len(bare)} runs per side "
          "(ms; 'since kill' is its own median)")
    summary = []
    for launcher in launchers:
        rq, alone = runs[f"resumequal/{launcher}"], runs[f"torch alone/{launcher}"]
        rq_phase, rq_cum = phase_ms(rq, PHASES)
        torch_phase, torch_cum = phase_ms(alone, PHASES)
        print()
        print(f"launcher {launcher}")
        print(f"{'':<18}{'resumequal':>22}{'torch alone':>24}{'bare torchrun':>24}")
        print(f"{'phase':<18}{'phase':>10}{'since kill':>12}"
              + 2 * f"{'phase':>12}{'since kill':>12}")
        for i, phase in enumerate(PHASES):
            row = f"{phase:<18}{rq_phase[i]:>10.0f}{rq_cum[i]:>12.0f}"
            row += f"{torch_phase[i]:>12.0f}{torch_cum[i]:>12.0f}"
            if i < len(BARE_PHASES):
                row += f"{bare_phase[i]:>12.0f}{bare_cum[i]:>12.0f}"
            else:
                row += f"{'-':>12}{'-':>12}"
            print(row)
        to_torch, to_torch_pairs = pair_ratios(rq, alone, "first step", "first step")
        to_bare, to_bare_pairs = pair_ratios(rq, bare, "first step", "group joined")
        floor, floor_pairs = pair_ratios(alone, bare, "first step", "group joined")
        worst = max(range(len(PHASES)), key=lambda i: rq_phase[i] - torch_phase[i])
        print(f"resumequal / torch alone {to_torch:.2f}x (pairs: {to_torch_pairs}; target "
              f"{TARGET:.1f}x): what resumequal adds to a resume under this launcher")
        print(f"resumequal / bare        {to_bare:.2f}x (pairs: {to_bare_pairs})")
        print(f"torch alone / bare       {floor:.2f}x (pairs: {floor_pairs})")
        print(f"largest phase beyond torch alone: {PHASES[worst]} "
              f"(+{rq_phase[worst] - torch_phase[worst]:.0f} ms)")
        summary.append(f"{launcher}: resumequal {rq_cum[-1] / 1e3:.2f} s, torch alone "
                       f"{torch_cum[-1] / 1e3:.2f} s, {to_torch:.2f}x "
                       f"({'meets' if to_torch <= TARGET else 'misses'} {TARGET:.1f}x)")
    print()
    print(f"summary (kill -> first resumed step; bare kill -> group joined "
          f"{bare_cum[-1] / 1e3:.2f} s): " + "; ".join(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per side, in rotating order")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per launch")
    parser.add_argument("--launcher", choices=[*LAUNCHERS, "both"], default="both",
                        help="the launcher(s) to measure resumequal and torch alone under")
    args = parser.parse_args()
    launchers = LAUNCHERS if args.launcher == "both" else (args.launcher,)
    # Checkpoints and traces are sealed with the run's key and id, as in a run.
    os.environ.setdefault(KEY_ENV, new_key())
    os.environ.setdefault(RUN_ID_ENV, new_run_id())

    with tempfile.TemporaryDirectory(prefix="rq-bench-restart-") as tmp:
        root = Path(tmp)
        spec_path = root / "spec.yaml"
        # The default cut: hard kill at step 6, microstep 1, on rank 1.
        spec_path.write_text(yaml.safe_dump({
            "world": {"nprocPerNode": NPROC, "backend": "gloo", "threadsPerRank": 1},
            "preemption": {"step": 6, "microstep": 1, "rank": TARGET_RANK, "mode": "hard"},
        }))
        print(f"restart latency: {args.repeats} runs per side, in rotating order", flush=True)
        try:
            runs = measure(spec_path, root, args.repeats, args.timeout, launchers)
        except BenchError as e:
            sys.exit(f"restart_latency: {e}")
    report(runs, launchers)


if __name__ == "__main__":
    main()
