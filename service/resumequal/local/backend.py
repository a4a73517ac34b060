"""LocalBackend: each leg is a torchrun elastic launch on this machine: stock torchrun, or
with ``world.launcher: forked`` torchrun's agent with its workers forked from a process
that loaded their code once (:mod:`resumequal.spec.launchers`, :mod:`resumequal.worker.agent`).

Legs use a c10d rendezvous on a free loopback port, served by a store process of the leg's
own that listens on loopback alone (:mod:`resumequal.local.rdzv_store`: torch's rendezvous
state is pickled there), the spec's max restarts and rendezvous timeouts from the spec
(:func:`resumequal.qualify.plan.rdzv_conf`). The backend reads what workers
write (traces, beacons, completion and failure markers) through the run location — a
folder, or an ``s3://`` prefix, the way the operator reads them — to observe them, kills
the armed worker by pid (a process kill: SIGKILL, or SIGTERM then SIGKILL after the
grace), and on cleanup stops every process it started. A leg succeeded when torchrun
exited 0 and every rank left its completion marker. Logs stay in the local ``run_dir``;
the legs' local files (inductor's caches, torchrun's error files, an object store's
checkpoint staging) go to a private scratch folder
(:func:`resumequal.run.location.default_scratch`), removed on cleanup.

Nothing of a local leg listens beyond loopback: its workers' group store is rank 0's,
bound to 127.0.0.1 (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 and ``--local-addr=127.0.0.1``:
the agents open no store of their own).

A leg of ``world.nnodes`` > 1, or one whose preemption kills a node (``preemption.target:
pod``), runs one torchrun agent per node, as a cluster runs one per pod, against that
store, so that any node can die. A node kill takes the armed rank's whole node — its
agent, every worker (and a forked leg's forkserver: all carry the node's tag): SIGKILL to
all of them, or SIGTERM to the agent (what a pod deletion sends the pod's main process)
and SIGKILL after the grace — and once they are gone starts a new agent in its place, as
a training operator recreates a deleted pod. Every agent of such a leg sets
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the store shared, a surviving rank 0 publishes
no MASTER_ADDR for a round a new agent joins, and both wait until the read timeout (torch
2.13, dynamic_rendezvous.py ``next_rendezvous``).

A resize (``preemption.resize``) runs the agents with ``--nnodes=toNodes:nnodes``: the
killed node is not replaced, the survivors' agents re-rendezvous at the smaller size once
its heartbeats have expired, and with ``growAfterStep`` a new agent starts when rank 0 of
the smaller world publishes that it waits for the grow (a beacon at ``grow``); the others
admit it by a membership change, which torchrun does not count as a restart
(``SimpleElasticAgent._invoke_run``). The rendezvous's last call is 1 s instead of torch's
30 s, which every re-rendezvous at the minimum size waits out (``_add_to_participants``).

The run's checkpoint key (:mod:`resumequal.run.signing`) is the caller's
``RESUMEQUAL_CHECKPOINT_KEY`` if it set one, else a fresh random one made here. It lives
only in this process's environment: the legs inherit it, the comparison (in this
process) reads it; it is never written to the run folder or the store, nor logged.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from resumequal.errors import ResumequalError
from resumequal.local.comparison import QUALIFICATION, Comparison, first_failing
from resumequal.local.processes import ProcessTree, Tagged, send_signal
from resumequal.qualify.machine import LegObservation, LegState, kill_order
from resumequal.qualify.plan import (
    NODE_KEEP_ALIVE,
    RESIZE_LAST_CALL,
    LegPlan,
    leg_module_args,
    local_torchrun_args,
    rdzv_conf,
)
from resumequal.results.verdict import Verdict
from resumequal.run.beacons import GROW, Beacon
from resumequal.run.location import RunLocation, default_scratch
from resumequal.run.signing import KEY_ENV, RUN_ID_ENV, RunSeal, new_key, new_run_id
from resumequal.spec import PreemptionSpec, QualificationSpec
from resumequal.spec.launchers import command
from resumequal.store import regular
from resumequal.train.loopback import LOOPBACK

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


# The workers' group store is rank 0's, not the agent's: with the agent's (torch's default,
# TCPStore sharing) torch's rank 0 agent opens a store for the workers that listens on every
# interface (dynamic_rendezvous.py ``_create_tcp_store_server``: a TCPStore torch binds
# itself). Without it the agent opens none, hands the workers ``MASTER_ADDR`` =
# ``--local-addr`` (127.0.0.1), and rank 0 binds the group's store there
# (resumequal.train.distributed.init_process_group, resumequal.train.loopback).
_OWN_WORKER_STORE = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


# Every process of one node carries its node's tag, inherited by the workers torchrun starts
# in sessions of their own: a node kill finds them all.
NODE_TAG_VAR = "RESUMEQUAL_NODE_TAG"


@dataclass
class _Node:
    """One torchrun agent of a leg, with the tag its processes carry."""

    index: int
    proc: subprocess.Popen[bytes]
    tag: str
    _tagged: Tagged = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._tagged = Tagged(self.tag, NODE_TAG_VAR)

    def pids(self) -> list[int]:
        return self._tagged.live()


@dataclass
class _NodeKill:
    """A node kill in progress: escalated to SIGKILL at ``deadline``, replaced once gone."""

    node: _Node
    deadline: float
    replace: bool = True
    replaced: bool = False  # or, for a node not replaced, gone


@dataclass
class _Nodes:
    """The agents of a leg launched node by node, and its rendezvous store."""

    store: subprocess.Popen[bytes]
    cmd: list[str]
    env: dict[str, str]
    current: list[_Node] = field(default_factory=list)
    killed: list[_NodeKill] = field(default_factory=list)
    grown: bool = False


class LocalBackend:
    """Runs legs as torchrun process trees under ``run_dir``."""

    def __init__(
        self,
        spec: QualificationSpec,
        run_dir: Path,
        *,
        location: RunLocation | None = None,
        judge_legs: Sequence[str] = (),
        verdicts: dict[str, Verdict] | None = None,
        python: str = sys.executable,
    ) -> None:
        os.environ.setdefault(KEY_ENV, new_key())
        os.environ.setdefault(RUN_ID_ENV, new_run_id())
        # What the legs read back (their spec, kill orders) and what they write (beacons,
        # markers) is sealed with the run's key and id, which the legs inherit.
        self.location = location or RunLocation.open(str(run_dir), seal=RunSeal.from_env())
        self.spec = self.location.leg_spec(spec)
        self.run_dir = run_dir
        # What the comparison judges: the qualification, or each of these legs against the
        # control leg (a seed matrix's scenarios), their verdicts kept in ``verdicts``.
        self.judge_legs = tuple(judge_legs)
        self.verdicts = verdicts if verdicts is not None else {}
        self._comparison: Comparison | None = None
        self.python = python
        self.tree = ProcessTree()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.nodes: dict[str, _Nodes] = {}
        self.stores: dict[str, subprocess.Popen[bytes]] = {}  # each leg's rendezvous store
        self.plans: dict[str, LegPlan] = {}
        self._escalate: tuple[int, float] | None = None
        run_dir.mkdir(parents=True, exist_ok=True)
        # The workers' local files (inductor's caches, torchrun's error files, an object
        # store's staging) go to a folder only this user can enter, never the run folder:
        # that may be the store, and inductor runs what it finds in its cache.
        self.scratch = default_scratch(self.location.uri)
        self.scratch.mkdir(mode=0o700, exist_ok=True)
        self.location.write_spec(self.spec)

    # -- Backend ------------------------------------------------------------------------

    def launch_legs(self, plans: Sequence[LegPlan]) -> None:
        for plan in plans:
            self._launch(plan)

    def _launch(self, plan: LegPlan) -> None:
        if plan.name in self.procs or plan.name in self.nodes:
            return
        w = plan.spec.world
        self.plans[plan.name] = plan
        self.location.write_leg_spec(plan.name, plan.spec, plan.omit)
        env = dict(self._run_env(), OMP_NUM_THREADS=str(w.threads_per_rank))
        leg_args = leg_module_args(plan.name, self.location.uri, scratch=str(self.scratch))
        if w.nnodes == 1 and plan.spec.preemption.target == "process":
            port = self._rendezvous_store(plan.name)
            cmd = [
                self.python, *command(w.launcher),
                *local_torchrun_args(endpoint=f"{LOOPBACK}:{port}",
                                     nproc=w.nproc_per_node, max_restarts=w.max_restarts,
                                     rdzv={**rdzv_conf(plan.spec), "is_host": "false"},
                                     log_dir=self._torchelastic_logs(plan.name),
                                     local_addr=LOOPBACK),
                *leg_args,
            ]
            self.procs[plan.name] = self.tree.spawn(cmd, self.run_dir / f"{plan.name}.log",
                                                    dict(env, **_OWN_WORKER_STORE))
        else:
            self._launch_nodes(plan, env, leg_args)
        log.info("launched the %s leg (%d node(s) x %d rank(s))", plan.name, w.nnodes,
                 w.nproc_per_node)

    def _run_env(self) -> dict[str, str]:
        """The environment of the processes that read and write the location: the run's
        key and id, and the store's endpoint."""
        env = dict(os.environ)
        if self.location.seal is not None:
            # A sub-run's (a seed of a seed matrix) legs bind what they write to it, with
            # the key the location seals with.
            env[RUN_ID_ENV] = self.location.seal.run
            env[KEY_ENV] = self.location.seal.key.decode()
        # Workers find their leg spec with the store's own environment, as on a cluster.
        settings = self.spec.checkpoint.store_settings
        if settings is not None:
            env.update(settings.environment())
        return env

    def _rendezvous_store(self, leg: str) -> int:
        """Start ``leg``'s rendezvous store on loopback (:mod:`resumequal.local.rdzv_store`);
        its port. Every agent of the leg is told it is not the host."""
        port = free_port()
        self.stores[leg] = self.tree.spawn(
            [self.python, "-m", "resumequal.local.rdzv_store", f"--port={port}"],
            self.run_dir / f"{leg}.rdzv-store.log", dict(os.environ))
        return port

    def _stop_store(self, leg: str) -> None:
        store = self.stores.get(leg)
        if store is not None and store.poll() is None:
            send_signal(store.pid, signal.SIGTERM)

    def _launch_nodes(self, plan: LegPlan, env: dict[str, str], leg_args: list[str]) -> None:
        w = plan.spec.world
        port = self._rendezvous_store(plan.name)
        store = self.stores[plan.name]
        rdzv = {**rdzv_conf(plan.spec), "is_host": "false", **NODE_KEEP_ALIVE}
        resize = plan.spec.preemption.resize
        nnodes = str(w.nnodes)
        if resize is not None:
            nnodes = f"{resize.to_nodes}:{w.nnodes}"
            rdzv.update(RESIZE_LAST_CALL)
        cmd = [
            self.python, *command(w.launcher), f"--nnodes={nnodes}",
            *local_torchrun_args(endpoint=f"{LOOPBACK}:{port}", nproc=w.nproc_per_node,
                                 max_restarts=w.max_restarts, rdzv=rdzv,
                                 log_dir=self._torchelastic_logs(plan.name),
                                 local_addr=LOOPBACK),
            *leg_args,
        ]
        nodes = self.nodes[plan.name] = _Nodes(store, cmd, dict(env, **_OWN_WORKER_STORE))
        for index in range(w.nnodes):
            nodes.current.append(self._start_node(plan.name, nodes, index))

    def _start_node(self, leg: str, nodes: _Nodes, index: int) -> _Node:
        tag = uuid.uuid4().hex
        log_path = self.run_dir / f"{leg}.node-{index}.log"
        proc = self.tree.spawn(nodes.cmd, log_path, dict(nodes.env, **{NODE_TAG_VAR: tag}))
        return _Node(index, proc, tag)

    def observe_leg(self, leg: str) -> LegObservation:
        self._maybe_escalate()
        nodes = self.nodes.get(leg)
        if nodes is not None:
            self._settle_node_kills(leg, nodes)
            self._maybe_grow(leg, nodes)
            code, log_path = self._nodes_exit(nodes), self.run_dir / f"{leg}.node-*.log"
        else:
            proc = self.procs.get(leg)
            if proc is None:
                return LegObservation(state=LegState.NOT_STARTED)
            code, log_path = proc.poll(), self.run_dir / f"{leg}.log"
            if code is not None:
                self._stop_store(leg)
        plan = self.plans.get(leg)
        world_size = self.spec.world.world_size if plan is None else plan.final_world_size
        progress = self.location.leg_progress(
            leg, world_size if plan is None else plan.resumed_world_size)
        message = None
        if code is None:
            state = LegState.RUNNING
        elif code != 0:
            state, message = LegState.FAILED, self._failure(leg, code, log_path)
        else:
            # One listing, once torchrun has exited: its exit 0 alone does not say that
            # every rank committed its final checkpoint and closed its trace.
            missing = sorted(set(range(world_size)) - self.location.ranks_done(leg))
            state = LegState.SUCCEEDED if not missing else LegState.FAILED
            if missing:
                message = (f"torchrun exited 0 but rank(s) {', '.join(map(str, missing))} "
                           f"never marked the leg done ({log_path})")
        return LegObservation(state=state, steps_done=progress.steps_done,
                              attempts=progress.attempts, resumed_at=progress.resumed_at,
                              message=message)

    def read_beacon(self, leg: str, rank: int) -> Beacon | None:
        return self.location.read_beacon(leg, rank)

    def deliver_kill(self, leg: str, beacon: Beacon, preemption: PreemptionSpec) -> None:
        if beacon.pid not in self.tree.pids():
            raise ResumequalError(
                f"the beacon names pid {beacon.pid}, which is not a process of this run"
            )
        mode = preemption.mode
        nodes = self.nodes.get(leg)
        if preemption.target == "pod" and nodes is not None:
            self._kill_node(leg, nodes, beacon, preemption)
        elif mode == "hard":
            os.kill(beacon.pid, signal.SIGKILL)
        else:
            os.kill(beacon.pid, signal.SIGTERM)
            self._escalate = (beacon.pid, time.monotonic() + preemption.grace_seconds)
        # The order dates the kill in the store, as a cluster's does, for the comparator's
        # report; written after the signal, it changes nothing of the kill itself.
        self.location.write_kill_order(leg, kill_order(beacon, preemption))
        log.info("delivered %s %s kill to rank %d (pid %d)", mode, preemption.target,
                 beacon.rank, beacon.pid)

    def compare(self) -> Verdict | None:
        """The verdict once the comparison process has concluded; None while it runs (the
        state machine bounds it by ``timeouts.legSeconds``, as a cluster's comparator
        Job). ComparisonFailed when it ended without one."""
        if self._comparison is None:
            self._comparison = Comparison.start(
                self.tree, self.python, self.location.uri, self.scratch,
                self.run_dir / "comparison.log", self._run_env(), legs=self.judge_legs)
        verdicts = self._comparison.verdicts()
        if verdicts is None:
            return None
        self.verdicts.update(verdicts)
        return verdicts.get(QUALIFICATION) or first_failing(verdicts)

    def cleanup(self) -> None:
        stopped = self.tree.stop_all()
        if stopped:
            log.info("stopped %d process(es)", len(stopped))
        # Nothing there outlives the run: caches and error files are the legs' alone.
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _torchelastic_logs(self, leg: str) -> str:
        """torchrun's ``--log-dir`` for ``leg``: in the scratch folder, which goes with the
        run, rather than a ``torchelastic_*`` folder of its own left in the temporary one."""
        return str(self.scratch / "torchelastic" / leg)

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

    def _maybe_grow(self, leg: str, nodes: _Nodes) -> None:
        """Start a node for a shrunk world once its rank 0 waits for one (its grow beacon)."""
        plan = self.plans.get(leg)
        resize = None if plan is None else plan.resize
        if (resize is None or resize.grow_after_step is None or nodes.grown
                or not nodes.killed or not all(k.replaced for k in nodes.killed)):
            return
        attempt = self.location.attempts_started(leg) - 1
        if attempt < 1:
            return
        beacon = self.location.read_beacon(leg, 0, attempt)
        if beacon is None or beacon.at != GROW:
            return
        index = nodes.killed[-1].node.index
        nodes.current.append(self._start_node(leg, nodes, index))
        nodes.grown = True
        log.info("the %s leg waits at step %d for the world to grow: started node %d", leg,
                 beacon.step, index)

    def _kill_node(self, leg: str, nodes: _Nodes, beacon: Beacon,
                   preemption: PreemptionSpec) -> None:
        node = next((n for n in nodes.current if beacon.pid in n.pids()), None)
        if node is None:
            raise ResumequalError(f"the beacon names pid {beacon.pid}, which runs on no node "
                                  f"of the {leg} leg")
        if preemption.mode == "hard":
            for pid in node.pids():
                send_signal(pid, signal.SIGKILL)
            deadline = time.monotonic()
        else:
            # A pod deletion signals the pod's main process; torchrun passes it on.
            send_signal(node.proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + preemption.grace_seconds
        nodes.killed.append(_NodeKill(node, deadline, replace=preemption.resize is None))

    def _settle_node_kills(self, leg: str, nodes: _Nodes) -> None:
        """SIGKILL what outlived its grace; replace each killed node once all of it is gone."""
        for kill in nodes.killed:
            if kill.replaced:
                continue
            left = kill.node.pids()
            if left and time.monotonic() >= kill.deadline:
                log.warning("node %d of the %s leg outlived its grace period; sending SIGKILL",
                            kill.node.index, leg)
                for pid in left:
                    send_signal(pid, signal.SIGKILL)
            if left:
                continue
            kill.node.proc.poll()
            index = nodes.current.index(kill.node)
            kill.replaced = True
            if not kill.replace:
                # A resize: the survivors continue without it.
                del nodes.current[index]
                log.info("node %d of the %s leg is gone and not replaced", kill.node.index, leg)
                continue
            nodes.current[index] = self._start_node(leg, nodes, kill.node.index)
            log.info("started a new node %d for the %s leg", kill.node.index, leg)

    def _nodes_exit(self, nodes: _Nodes) -> int | None:
        """The leg's exit: None while an agent runs or a killed node awaits its replacement,
        the first non-zero exit of a current agent, else 0 (and the store is stopped)."""
        if any(not k.replaced for k in nodes.killed):
            return None
        codes = [n.proc.poll() for n in nodes.current]
        failed = next((c for c in codes if c not in (None, 0)), None)
        if failed is not None:
            return failed
        if any(c is None for c in codes):
            return None
        if nodes.store.poll() is None:
            send_signal(nodes.store.pid, signal.SIGTERM)
        return 0

    def _failure(self, leg: str, code: int | None, log_path: Path) -> str:
        reason = self.location.leg_failure(leg)
        if reason is not None and reason != "unreadable failure marker":
            return reason
        paths = sorted(log_path.parent.glob(log_path.name))
        errors = [
            line for path in paths for line in _tail(path, 200)
            if line.startswith("error: ") or "Error:" in line
        ]
        detail = errors[-1].strip() if errors else "see the leg's log"
        return f"torchrun exited {code}: {detail} ({log_path})"


# What is read of a log's end for its last lines: the run folder may be a store others
# write, and a planted log may be any size.
_TAIL_BYTES = 1 << 20


def _tail(path: Path, n: int) -> list[str]:
    """The last ``n`` lines of the log at ``path``: a regular file, not a link (a planted
    FIFO or link is no log of ours: nothing)."""
    try:
        fd = regular.open_path(path, follow=False)
    except OSError:
        return []
    with open(fd, "rb") as f:
        f.seek(max(0, os.fstat(fd).st_size - _TAIL_BYTES))
        return f.read(_TAIL_BYTES).decode(errors="replace").splitlines()[-n:]
