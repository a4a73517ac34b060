"""LocalBackend: each leg is a torchrun elastic launch on this machine.

Legs use a c10d rendezvous on a free loopback port, the spec's max restarts and rendezvous
timeouts from the spec (:func:`resumequal.plan.rdzv_conf`). The backend reads what workers
write (traces, beacons, completion and failure markers) through the run location — a
folder, or an ``s3://`` prefix, the way the operator reads them — to observe them, kills
the armed worker by pid (a process kill: SIGKILL, or SIGTERM then SIGKILL after the
grace), and on cleanup stops every process it started. A leg succeeded when torchrun
exited 0 and every rank left its completion marker. Logs and checkpoint staging stay in
the local ``run_dir``.

The run's checkpoint key (:mod:`resumequal.signing`) is the caller's
``RESUMEQUAL_CHECKPOINT_KEY`` if it set one, else a fresh random one made here. It lives
only in this process's environment: the legs inherit it, the comparison (in this
process) reads it; it is never written to the run folder or the store, nor logged.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from resumequal.errors import ResumequalError
from resumequal.local.processes import ProcessTree
from resumequal.plan import TORCHRUN, LegPlan, leg_module_args, local_torchrun_args, rdzv_conf
from resumequal.qualify import Beacon, LegObservation, LegState, beacon_from, kill_order
from resumequal.runstore import RunLocation
from resumequal.signing import KEY_ENV, new_key
from resumequal.spec import PreemptionSpec, QualificationSpec
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
        location: RunLocation | None = None,
        judge: Callable[[], Verdict] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.location = location or RunLocation.open(str(run_dir))
        self.spec = self.location.leg_spec(spec)
        self.run_dir = run_dir
        self.judge = judge
        self.python = python
        self.tree = ProcessTree()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        os.environ.setdefault(KEY_ENV, new_key())
        self._escalate: tuple[int, float] | None = None
        run_dir.mkdir(parents=True, exist_ok=True)
        self.location.write_spec(self.spec)

    # -- Backend ------------------------------------------------------------------------

    def launch_leg(self, plan: LegPlan) -> None:
        if plan.name in self.procs:
            return
        w = plan.spec.world
        if w.nnodes != 1:
            raise ResumequalError(
                f"world.nnodes={w.nnodes}: a local run has one node; set world.nprocPerNode to "
                "the world size instead"
            )
        self.location.write_leg_spec(plan.name, plan.spec, plan.omit)
        cmd = [
            self.python, *TORCHRUN,
            *local_torchrun_args(endpoint=f"127.0.0.1:{free_port()}", nproc=w.nproc_per_node,
                                 max_restarts=w.max_restarts, rdzv=rdzv_conf(plan.spec)),
            *leg_module_args(plan.name, self.location.uri, scratch=str(self.run_dir)),
        ]
        env = dict(os.environ, OMP_NUM_THREADS=str(w.threads_per_rank))
        # Workers find their leg spec with the standard AWS settings, as on a cluster.
        s3 = self.spec.checkpoint.s3
        if s3 is not None and s3.endpoint_url:
            env["AWS_ENDPOINT_URL_S3"] = s3.endpoint_url
        self.procs[plan.name] = self.tree.spawn(cmd, self.run_dir / f"{plan.name}.log", env)
        log.info("launched the %s leg (%d ranks)", plan.name, w.nproc_per_node)

    def observe_leg(self, leg: str) -> LegObservation:
        self._maybe_escalate()
        proc = self.procs.get(leg)
        if proc is None:
            return LegObservation(state=LegState.NOT_STARTED)
        code = proc.poll()
        world_size = self.spec.world.world_size
        progress = self.location.leg_progress(leg, world_size)
        message = None
        if code is None:
            state = LegState.RUNNING
        elif code != 0:
            state, message = LegState.FAILED, self._failure(leg, code)
        else:
            # One listing, once torchrun has exited: its exit 0 alone does not say that
            # every rank committed its final checkpoint and closed its trace.
            missing = sorted(set(range(world_size)) - self.location.ranks_done(leg))
            state = LegState.SUCCEEDED if not missing else LegState.FAILED
            if missing:
                message = (f"torchrun exited 0 but rank(s) {', '.join(map(str, missing))} "
                           f"never marked the leg done ({self.run_dir / f'{leg}.log'})")
        return LegObservation(state=state, steps_done=progress.steps_done,
                              attempts=progress.attempts, resumed_at=progress.resumed_at,
                              message=message)

    def read_beacon(self, leg: str, rank: int) -> Beacon | None:
        body = self.location.read_beacon(leg, rank)
        return None if body is None else beacon_from(body, self.location.url(leg))

    def deliver_kill(self, leg: str, beacon: Beacon, preemption: PreemptionSpec) -> None:
        # A local run has no pods: the spec refuses target pod before anything starts.
        if beacon.pid not in self.tree.pids():
            raise ResumequalError(
                f"the beacon names pid {beacon.pid}, which is not a process of this run"
            )
        mode = preemption.mode
        if mode == "hard":
            os.kill(beacon.pid, signal.SIGKILL)
        else:
            os.kill(beacon.pid, signal.SIGTERM)
            self._escalate = (beacon.pid, time.monotonic() + preemption.grace_seconds)
        # The order dates the kill in the store, as a cluster's does, for the comparator's
        # report; written after the signal, it changes nothing of the kill itself.
        self.location.write_kill_order(leg, kill_order(beacon, preemption))
        log.info("delivered %s kill to rank %d (pid %d)", mode, beacon.rank, beacon.pid)

    def compare(self) -> Verdict:
        if self.judge is not None:
            return self.judge()
        # The comparator (DCP readers, drift statistics) is imported when a comparison runs.
        from resumequal.compare import compare_qualification

        return compare_qualification(self.location, self.spec)

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

    def _failure(self, leg: str, code: int | None) -> str:
        reason = self.location.leg_failure(leg)
        if reason is not None and reason != "unreadable failure marker":
            return reason
        errors = [
            line for line in _tail(self.run_dir / f"{leg}.log", 200)
            if line.startswith("error: ") or "Error:" in line
        ]
        detail = errors[-1].strip() if errors else "see the leg's log"
        return f"torchrun exited {code}: {detail} ({self.run_dir / f'{leg}.log'})"


def _tail(path: Path, n: int) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except FileNotFoundError:
        return []
