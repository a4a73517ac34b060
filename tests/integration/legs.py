"""Launch real torchrun legs, wait for beacons, deliver real signals, read what legs wrote."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from resumequal.qualify.plan import leg_module_args, local_torchrun_args
from resumequal.run.location import RunLocation
from resumequal.run.signing import RunSeal
from resumequal.spec import launchers
from resumequal.spec.boundaries import BOUNDARIES
from resumequal.trace.records import (
    RestoreRecord,
    StepRecord,
    TraceRecord,
    boundary_value,
    effective_steps,
)
from testing.ports import free_port
from tests.waiting import eventually

TORCHRUN = [sys.executable, *launchers.TORCHRUN]

# For `resumequal run` in tests whose subject cannot depend on how a worker process starts
# (precision, sharding, the negative controls, the seed matrix's bookkeeping): the forked
# launcher spends about a quarter of stock torchrun's CPU (33 s against 128 s for the default
# qualification), and the suite shares two cores. Every verdict of the default path, and every
# test of restarts, nodes, pods, the loader, compile and zoom, runs stock torchrun.
FORKED = ("--launcher", "forked")


def resumequal(*args: str, env: dict[str, str] | None = None, columns: int = 120,
               timeout: float = 280) -> subprocess.CompletedProcess[str]:
    """Run the CLI; on a timeout interrupt it (so it stops its legs) before giving up."""
    cmd = [sys.executable, "-m", "resumequal", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COLUMNS=str(columns), **(env or {})))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        raise AssertionError(f"resumequal {' '.join(args)} ran over {timeout}s:\n{out[-3000:]}"
                             f"\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def qualify(run_dir: Path, *sets: str, launcher: tuple[str, ...] = (), timeout: float = 280
            ) -> tuple[dict[str, Any], str]:
    """``resumequal run`` into ``run_dir``, a ``--set`` for each of ``sets``, which must exit
    0: its report.json and what it printed."""
    args = [a for s in sets for a in ("--set", s)]
    proc = resumequal("run", "--run-dir", str(run_dir), *launcher, *args, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report: dict[str, Any] = json.loads((run_dir / "report.json").read_text())
    return report, proc.stdout


# The newest checkpoint the default run's resume loads (12 steps on 2 ranks, cut at step 6,
# microbatch 1): the periodic one of step 4 after a hard kill, the emergency one taken
# mid-step 6 (5 steps and 1 microbatch done) after a graceful one.
RESUMED_FROM = {"hard": "step-00000004", "graceful": "step-00000005+1"}


def assert_exact(verdict: dict[str, Any], mode: str) -> None:
    """The default run's verdict: PASS, exact through step 12, resumed from where ``mode``
    leaves its checkpoint, cut at step 6, microbatch 1."""
    assert verdict["result"] == "PASS", verdict["reason"]
    assert verdict["reason"].startswith("exact: every boundary of 12 steps on 2 ranks equal")
    assert (verdict["exact_through_step"], verdict["first_divergence"]) == (12, None)
    assert verdict["resumed_from"] == RESUMED_FROM[mode]
    assert (verdict["cut"]["step"], verdict["cut"]["microstep"]) == (6, 1)


def write_spec(path: Path, spec: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec))
    return path


@dataclass
class LegProcess:
    """A torchrun launch of one leg in its own process group, with its log file."""

    proc: subprocess.Popen[bytes]
    log: Path
    run_dir: Path
    leg: str
    started: float = field(default_factory=time.monotonic)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"leg {self.leg} did not finish in {timeout}s; log:\n"
                                 + self.tail()) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


RUNNING: list[LegProcess] = []


def launch(
    spec_path: Path,
    leg: str,
    run_dir: Path,
    *,
    nproc: int = 2,
    max_restarts: int = 1,
    omit: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> LegProcess:
    """Start ``resumequal leg`` under torchrun with a c10d rendezvous on a free port;
    ``env`` adds to the environment (e.g. ``POD_UID``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"{leg}.log"
    cmd = [
        *TORCHRUN,
        *local_torchrun_args(endpoint=f"127.0.0.1:{free_port()}", nproc=nproc,
                             max_restarts=max_restarts),
        *leg_module_args(leg, str(run_dir), omit=omit, spec_file=str(spec_path)),
    ]
    full_env = dict(os.environ, OMP_NUM_THREADS="1", **(env or {}))
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True)
    lp = LegProcess(proc, log, run_dir, leg)
    RUNNING.append(lp)
    return lp


def wait_beacon(lp: LegProcess, rank: int, timeout: float = 120) -> dict[str, Any]:
    path = lp.run_dir / lp.leg / "beacons" / f"attempt-0-rank-{rank}.json"
    eventually(path.exists, timeout, f"a beacon at {path}", interval=0.05,
               abort=lambda: None if lp.proc.poll() is None else
               f"the leg exited {lp.proc.returncode} before arming:\n{lp.tail()}")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def run_leg(spec_path: Path, leg: str, run_dir: Path, timeout: float = 240, **kw: Any) -> None:
    lp = launch(spec_path, leg, run_dir, **kw)
    code = lp.wait(timeout)
    assert code == 0, f"{leg} leg exited {code}:\n{lp.tail()}"


def preempt(
    spec_path: Path, run_dir: Path, sig: signal.Signals, rank: int = 1, timeout: float = 240,
    omit: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run the preempted leg, deliver ``sig`` to the armed worker, wait for the restart."""
    lp = launch(spec_path, "preempted", run_dir, omit=omit)
    beacon = wait_beacon(lp, rank)
    os.kill(beacon["pid"], sig)
    code = lp.wait(timeout)
    assert code == 0, f"preempted leg exited {code}:\n{lp.tail()}"
    return beacon


def trace(run: Path | str, leg: str, rank: int) -> list[TraceRecord]:
    """One rank's whole trace, read from the run location (a folder or a URI)."""
    return RunLocation.open(str(run)).traces(leg).records(rank)


def location(run: Path | str) -> RunLocation:
    """The run location sealed as the test's legs seal it (their key and run id come from
    the test session's environment: see tests/conftest.py)."""
    return RunLocation.open(str(run), seal=RunSeal.from_env())


def records(run: Path | str, leg: str, kind: str, ranks: tuple[int, ...] = (0, 1)
            ) -> list[dict[str, Any]]:
    """The records of one kind in the ranks' traces, as JSON objects, rank by rank."""
    per_rank = RunLocation.open(str(run)).traces(leg).records_so_far(max(ranks) + 1)
    # As written (model_dump_json): a non-finite float reads "Infinity", as in the trace.
    return [json.loads(r.model_dump_json()) for rank in ranks for r in per_rank.get(rank, [])
            if r.kind == kind]


def steps(run: Path | str, leg: str, rank: int) -> dict[int, StepRecord]:
    return effective_steps(trace(run, leg, rank), rank)


def restores(run: Path | str, leg: str, rank: int) -> list[RestoreRecord]:
    return [r for r in trace(run, leg, rank) if isinstance(r, RestoreRecord)]


def first_divergence(
    a_dir: Path, b_dir: Path, ranks: int = 2, a_leg: str = "control", b_leg: str = "preempted"
) -> tuple[int, str, int] | None:
    """The first (step, boundary, rank) where two legs differ, in execution order."""
    a = {r: steps(a_dir, a_leg, r) for r in range(ranks)}
    b = {r: steps(b_dir, b_leg, r) for r in range(ranks)}
    for r in range(ranks):
        assert sorted(a[r]) == sorted(b[r]), f"rank {r}: steps {sorted(a[r])} vs {sorted(b[r])}"
    for step in sorted(a[0]):
        for boundary in BOUNDARIES:
            for r in range(ranks):
                if boundary_value(a[r][step], boundary) != boundary_value(b[r][step], boundary):
                    return step, boundary, r
    return None


def final_tensors(run_dir: Path, leg: str, name: str) -> dict[str, Any]:
    """Model and optimizer tensors of a committed checkpoint, read without a process group."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = run_dir / f"{leg}-{name}.pt"
    dcp_to_torch_save(run_dir / leg / "checkpoints" / name / "dcp", out)
    return torch.load(out, weights_only=False)  # type: ignore[no-any-return]


def assert_same_tensors(a: Any, b: Any, path: str = "") -> int:
    """Recursively require bitwise-equal tensors and equal values; returns tensors compared."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(torch.uint8)
                           if b.dim() else b), f"tensor differs at {path}"
        return 1
    if isinstance(a, dict):
        assert set(a) == set(b), f"keys differ at {path}: {set(a) ^ set(b)}"
        return sum(assert_same_tensors(a[k], b[k], f"{path}.{k}") for k in a)
    if isinstance(a, list | tuple):
        assert len(a) == len(b), path
        return sum(assert_same_tensors(x, y, f"{path}[{i}]") for i, (x, y) in
                   enumerate(zip(a, b, strict=True)))
    assert a == b, f"value differs at {path}: {a!r} vs {b!r}"
    return 0
