"""LocalBackend: each leg is a torchrun elastic launch on this machine.

Legs use a c10d rendezvous on a free loopback port and the spec's max restarts. The
backend reads what workers write (traces, beacons, failure markers) to observe them,
kills the armed worker by pid, and on cleanup stops every process it started.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from resumequal.errors import ResumequalError
from resumequal.local.processes import ProcessTree
from resumequal.plan import LegPlan
from resumequal.qualify import Beacon, LegObservation, LegState
from resumequal.spec import QualificationSpec
from resumequal.verdict import Verdict

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalBackend:
    """Runs legs as torchrun process trees under ``run_dir``."""

    def __init__(
        self,
        spec: QualificationSpec,
        run_dir: Path,
        *,
        judge: Callable[[], Verdict] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.judge = judge
        self.python = python
        self.tree = ProcessTree()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._escalate: tuple[int, float] | None = None
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "spec.json").write_text(spec.model_dump_json(indent=1))

    # -- Backend ------------------------------------------------------------------------

    def launch_leg(self, plan: LegPlan) -> None:
        if plan.name in self.procs:
            return
        w = plan.spec.world
        if w.nnodes != 1:
            raise ResumequalError(
                f"world.nnodes={w.nnodes}: a local run has one node; set nproc_per_node to "
                "the world size instead"
            )
        spec_path = self.run_dir / "legs" / f"{plan.name}.spec.json"
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(plan.spec.model_dump_json(indent=1))
        cmd = [
            self.python, "-m", "torch.distributed.run",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            f"--nproc-per-node={w.nproc_per_node}",
            f"--max-restarts={w.max_restarts}",
            "--monitor-interval=0.1",
            "-m", "resumequal", "leg",
            "--spec", str(spec_path), "--leg", plan.name, "--run-dir", str(self.run_dir),
        ]
        for name in plan.omit:
            cmd += ["--omit", name]
        env = dict(os.environ, OMP_NUM_THREADS=str(w.threads_per_rank))
        self.procs[plan.name] = self.tree.spawn(cmd, self.run_dir / f"{plan.name}.log", env)
        log.info("launched the %s leg (%d ranks)", plan.name, w.nproc_per_node)

    def observe_leg(self, leg: str) -> LegObservation:
        self._maybe_escalate()
        proc = self.procs.get(leg)
        if proc is None:
            return LegObservation(state=LegState.NOT_STARTED)
        code = proc.poll()
        steps_done, attempts, resumed_at = self._progress(leg)
        if code is None:
            state = LegState.RUNNING
        elif code == 0:
            state = LegState.SUCCEEDED
        else:
            state = LegState.FAILED
        message = None
        if state == LegState.FAILED:
            message = self._failure(leg, code)
        return LegObservation(state=state, steps_done=steps_done, attempts=attempts,
                              resumed_at=resumed_at, message=message)

    def read_beacon(self, leg: str, rank: int) -> Beacon | None:
        path = self.run_dir / leg / "beacons" / f"attempt-0-rank-{rank}.json"
        try:
            return Beacon.model_validate_json(path.read_text())
        except FileNotFoundError:
            return None

    def deliver_kill(self, beacon: Beacon, mode: str, grace_seconds: float) -> None:
        if beacon.pid not in self.tree.pids():
            raise ResumequalError(
                f"the beacon names pid {beacon.pid}, which is not a process of this run"
            )
        if mode == "hard":
            os.kill(beacon.pid, signal.SIGKILL)
        else:
            os.kill(beacon.pid, signal.SIGTERM)
            self._escalate = (beacon.pid, time.monotonic() + grace_seconds)
        log.info("delivered %s kill to rank %d (pid %d)", mode, beacon.rank, beacon.pid)

    def compare(self) -> Verdict:
        if self.judge is not None:
            return self.judge()
        from resumequal.compare import compare_qualification  # loads torch only here

        return compare_qualification(self.run_dir, self.spec)

    def cleanup(self) -> None:
        stopped = self.tree.stop_all()
        if stopped:
            log.info("stopped %d process(es)", len(stopped))

    # -- helpers ------------------------------------------------------------------------

    def _maybe_escalate(self) -> None:
        if self._escalate is None:
            return
        pid, deadline = self._escalate
        if time.monotonic() < deadline:
            return
        self._escalate = None
        if pid in self.tree.pids():
            log.warning("pid %d outlived its grace period; sending SIGKILL", pid)
            os.kill(pid, signal.SIGKILL)

    def _progress(self, leg: str) -> tuple[int, int, float | None]:
        """Steps every rank has finished, attempts seen, and when the resume completed."""
        per_rank_steps: list[int] = []
        attempts = 0
        resumed: list[float] = []
        for r in range(self.spec.world.world_size):
            path = self.run_dir / leg / "trace" / f"rank-{r}.jsonl"
            done = 0
            first_resumed: float | None = None
            for rec in _complete_lines(path):
                attempts = max(attempts, int(rec.get("attempt", 0)) + 1)
                if rec.get("kind") != "step":
                    continue
                done = max(done, int(rec["step"]))
                if rec["attempt"] >= 1 and first_resumed is None:
                    first_resumed = float(rec["finished_at"])
            per_rank_steps.append(done)
            if first_resumed is not None:
                resumed.append(first_resumed)
        resumed_at = max(resumed) if len(resumed) == self.spec.world.world_size else None
        return min(per_rank_steps, default=0), attempts, resumed_at

    def _failure(self, leg: str, code: int | None) -> str:
        marker = self.run_dir / leg / "FAILED.json"
        if marker.exists():
            try:
                return str(json.loads(marker.read_text())["reason"])
            except (ValueError, KeyError, OSError):
                pass
        errors = [
            line for line in _tail(self.run_dir / f"{leg}.log", 200)
            if line.startswith("error: ") or "Error:" in line
        ]
        detail = errors[-1].strip() if errors else "see the leg's log"
        return f"torchrun exited {code}: {detail} ({self.run_dir / f'{leg}.log'})"


def _complete_lines(path: Path) -> list[dict[str, Any]]:
    """Whole JSON lines of a trace that may be written to right now."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out = []
    for line in data.split(b"\n")[:-1]:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except FileNotFoundError:
        return []
